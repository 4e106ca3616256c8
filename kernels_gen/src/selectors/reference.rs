//! Plain host versions of the selectors, the oracles of the tests and the GPU check: Quest's
//! state and scores and Double Sparsity's labels and scores in f64 from their definitions
//! (no folding of the group, no fused arithmetic), and a sort-based top-k with the
//! kernel's rules.

use super::ds::DsCalibration;
use super::topk::{Keep, SelectionShape};
use crate::paged::{KvShape, PageTable, TokenLists};
use half::f16;
use std::cmp::Ordering;

/// Recomputes Quest's state of entries `(pages[i], lens[i])` from `k` (the cache, `kv`'s
/// shape), in place: per KV head, the min and max of each dimension over the page's first
/// `lens[i]` tokens (NaN values ignored, as the kernel's `minnum`/`maxnum` do).
pub fn quest_update(
    k: &[f16],
    kv: &KvShape,
    pages: &[i32],
    lens: &[i32],
    page_min: &mut [f16],
    page_max: &mut [f16],
) {
    let d = kv.head_dim;
    for (&p, &len) in pages.iter().zip(lens) {
        let p = p as usize;
        for h in 0..kv.num_kv_heads {
            let mut lo = vec![f64::INFINITY; d];
            let mut hi = vec![f64::NEG_INFINITY; d];
            for slot in 0..len as usize {
                let row = kv.k_row(p, slot, h) * d;
                for c in 0..d {
                    let x = k[row + c].to_f64();
                    lo[c] = lo[c].min(x);
                    hi[c] = hi[c].max(x);
                }
            }
            let out = (p * kv.num_kv_heads + h) * d;
            for c in 0..d {
                page_min[out + c] = f16::from_f64(lo[c]);
                page_max[out + c] = f16::from_f64(hi[c]);
            }
        }
    }
}

/// Quest's page scores, `sum_g sum_d max(q_gd * min_d, q_gd * max_d)` over the group's
/// query heads, in f64, laid out as the plan's: row `(b, h)` at `kv_indptr[b] *
/// num_kv_heads + h * pages_b`.
pub fn quest_scores(
    q: &[f16],
    page_min: &[f16],
    page_max: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
) -> Vec<f64> {
    let hk = kv.num_kv_heads;
    let nnz = table.kv_page_indices.len();
    let mut out = vec![0.0; nnz * hk];
    for b in 0..table.batch() {
        let first = table.kv_indptr[b] as usize;
        let n = table.kv_indptr[b + 1] as usize - first;
        for h in 0..hk {
            let row = quest_row_scores(q, page_min, page_max, kv, table, num_q_heads, b, h);
            out[first * hk + h * n..first * hk + (h + 1) * n].copy_from_slice(&row);
        }
    }
    out
}

/// [`quest_scores`] of one row: sequence `b`'s pages for KV head `h`.
#[allow(clippy::too_many_arguments)]
pub fn quest_row_scores(
    q: &[f16],
    page_min: &[f16],
    page_max: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
    b: usize,
    h: usize,
) -> Vec<f64> {
    let (d, hk) = (kv.head_dim, kv.num_kv_heads);
    let group = num_q_heads / hk;
    let (lo, hi) = (table.kv_indptr[b] as usize, table.kv_indptr[b + 1] as usize);
    table.kv_page_indices[lo..hi]
        .iter()
        .map(|&page| {
            let st = (page as usize * hk + h) * d;
            let mut s = 0.0f64;
            for g in 0..group {
                let qr = ((b * hk + h) * group + g) * d;
                for c in 0..d {
                    let qv = q[qr + c].to_f64();
                    let a = qv * page_min[st + c].to_f64();
                    let z = qv * page_max[st + c].to_f64();
                    s += if a.is_nan() || z.is_nan() {
                        f64::NAN
                    } else {
                        a.max(z)
                    };
                }
            }
            s
        })
        .collect()
}

/// Writes Double Sparsity's labels of entries `(pages[i], lens[i])` from `k` (the cache,
/// `kv`'s shape) into `labels` (`[num_pages, num_kv_heads, page_size, r]`), in place: label
/// `j` of slot `s` for KV head `h` is channel `calibration.head(h)[j]` of that token's key.
pub fn ds_labels(
    k: &[f16],
    kv: &KvShape,
    calibration: &DsCalibration,
    pages: &[i32],
    lens: &[i32],
    labels: &mut [f16],
) {
    let (d, r) = (kv.head_dim, calibration.r());
    for (&p, &len) in pages.iter().zip(lens) {
        for h in 0..kv.num_kv_heads {
            for slot in 0..len as usize {
                let key = kv.k_row(p as usize, slot, h) * d;
                let at = kv.quantized_row(p as usize, slot, h) * r;
                for (j, &c) in calibration.head(h).iter().enumerate() {
                    labels[at + j] = k[key + c];
                }
            }
        }
    }
}

/// Double Sparsity's token scores in f64, `sum_g sum_j q_{g, c_j} * label_j` over the
/// group's query heads and KV head `h`'s channels `c_j`, laid out as the plan's: row `(b,
/// h)` at `tokens before b * num_kv_heads + h * len_b`.
pub fn ds_scores(
    q: &[f16],
    labels: &[f16],
    calibration: &DsCalibration,
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
) -> Vec<f64> {
    let hk = kv.num_kv_heads;
    let mut out = vec![];
    for b in 0..table.batch() {
        for h in 0..hk {
            out.extend(ds_row_scores(
                q,
                labels,
                calibration,
                kv,
                table,
                num_q_heads,
                b,
                h,
            ));
        }
    }
    out
}

/// [`ds_scores`] of one row: sequence `b`'s tokens for KV head `h`.
#[allow(clippy::too_many_arguments)]
pub fn ds_row_scores(
    q: &[f16],
    labels: &[f16],
    calibration: &DsCalibration,
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
    b: usize,
    h: usize,
) -> Vec<f64> {
    let (d, hk, r, ps) = (kv.head_dim, kv.num_kv_heads, calibration.r(), kv.page_size);
    let group = num_q_heads / hk;
    let first = table.kv_indptr[b] as usize;
    (0..table.seq_len(b, ps))
        .map(|t| {
            let page = table.kv_page_indices[first + t / ps] as usize;
            let at = kv.quantized_row(page, t % ps, h) * r;
            let mut s = 0.0f64;
            for g in 0..group {
                let qr = ((b * hk + h) * group + g) * d;
                for (j, &c) in calibration.head(h).iter().enumerate() {
                    s += q[qr + c].to_f64() * labels[at + j].to_f64();
                }
            }
            s
        })
        .collect()
}

/// The order the top-k keeps items in: always-kept items first, then by score descending
/// (`total_cmp`: +inf first, -0 after +0), NaN last, ties by index ascending.
fn rank_order(scores: &[f64], forced: &dyn Fn(usize) -> bool, a: usize, b: usize) -> Ordering {
    let class = |i: usize| {
        if forced(i) {
            0
        } else if scores[i].is_nan() {
            2
        } else {
            1
        }
    };
    class(a)
        .cmp(&class(b))
        .then_with(|| {
            if class(a) == 1 {
                scores[b].total_cmp(&scores[a])
            } else {
                Ordering::Equal
            }
        })
        .then(a.cmp(&b))
}

/// The sort-based top-k of one row: the `k` first items in [`rank_order`] (the first
/// `keep.sink` and last `keep.recent` always among them), returned ascending.
pub fn top_k_row(scores: &[f64], k: usize, keep: Keep) -> Vec<usize> {
    let n = scores.len();
    let forced = |i: usize| i < keep.sink || i + keep.recent >= n;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| rank_order(scores, &forced, a, b));
    let mut kept = order[..k.min(n)].to_vec();
    kept.sort();
    kept
}

/// Whether a row is flagged: a NaN or an infinite score.
pub fn row_flagged(scores: &[f64]) -> bool {
    scores.iter().any(|s| !s.is_finite())
}

/// Every row's kept items (`shape`'s budgets, `keep`'s always kept) from scores laid out as
/// a plan's (row `(b, h)` at `item_indptr[b] * num_kv_heads + h * n_b`).
pub fn select_items(scores: &[f64], shape: &SelectionShape, keep: Keep) -> Vec<Vec<usize>> {
    let heads = shape.rows() / shape.batch();
    let mut out = vec![];
    for b in 0..shape.batch() {
        let first = shape.item_indptr[b] as usize;
        let n = shape.item_indptr[b + 1] as usize - first;
        for h in 0..heads {
            let base = first * heads + h * n;
            out.push(top_k_row(
                &scores[base..base + n],
                shape.k_items[b] as usize,
                keep,
            ));
        }
    }
    out
}

/// The token lists of kept pages (`pages[row]`, within the sequence, ascending): each
/// page's tokens, the last page's only up to the sequence's length.
pub fn page_token_lists(pages: &[Vec<usize>], table: &PageTable, kv: &KvShape) -> TokenLists {
    TokenLists::from_pages(table, kv.page_size, kv.num_kv_heads, pages)
}
