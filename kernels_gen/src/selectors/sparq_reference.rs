//! SparQ Attention on the host in f64, from Algorithm 1 and Appendix C as written (no
//! folding, no tiles): the oracle of the tests and the GPU check. The top-k is
//! [`super::reference::top_k_row`] (the sort the device top-k must equal) and the final
//! attention [`crate::reference::attention`] with its SparQ mix.

use super::sparq::{closed_tokens, copied_slices};
use super::sparq_kernels::SPARQ_RUN;
use crate::paged::{KvShape, PageTable};
use half::f16;

/// One row's (sequence `b`, KV head `h`) quantities.
#[derive(Clone, Debug, PartialEq)]
pub struct SparqRow {
    /// The `r` components of q used, ascending.
    pub dims: Vec<usize>,
    /// Per query head of the group: `q_g[dims] / tau_g`.
    pub sparse_query: Vec<Vec<f64>>,
    /// Per query head: the approximate logit of every token of the sequence.
    pub logits: Vec<Vec<f64>>,
    /// Per token: the logits summed over the group (what the top-k ranks).
    pub scores: Vec<f64>,
}

/// The `r` largest of `magnitudes`, ascending: by value descending, a NaN after every
/// number, ties toward the lower index.
pub fn top_components(magnitudes: &[f64], r: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..magnitudes.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (magnitudes[a], magnitudes[b]);
        match (x.is_nan(), y.is_nan()) {
            (false, false) => y.total_cmp(&x),
            (x_nan, y_nan) => x_nan.cmp(&y_nan),
        }
        .then(a.cmp(&b))
    });
    let mut dims = order[..r.min(order.len())].to_vec();
    dims.sort();
    dims
}

/// Algorithm 1's first step for one row: the components (the top `r` of `sum_g |q_g|` over
/// the group's query heads of `q`, f16 `[batch, num_q_heads, head_dim]`), each head's
/// scaled sparse query (`tau_g = sqrt(head_dim * |q_g[dims]|_1 / |q_g|_1)`, the query 0
/// when its chosen components are all 0), and the logits and scores of the `n` tokens
/// whose component `c` of token `t` is `key(t, c)`.
#[allow(clippy::too_many_arguments)]
pub fn sparq_row(
    q: &[f16],
    num_q_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    b: usize,
    h: usize,
    r: usize,
    n: usize,
    key: &dyn Fn(usize, usize) -> f64,
) -> SparqRow {
    let group = num_q_heads / num_kv_heads;
    let head = |g: usize| {
        let at = (b * num_q_heads + h * group + g) * head_dim;
        q[at..at + head_dim]
            .iter()
            .map(|x| x.to_f64())
            .collect::<Vec<f64>>()
    };
    let heads: Vec<Vec<f64>> = (0..group).map(head).collect();
    let magnitudes: Vec<f64> = (0..head_dim)
        .map(|c| heads.iter().map(|qg| qg[c].abs()).sum())
        .collect();
    let dims = top_components(&magnitudes, r);
    let sparse_query: Vec<Vec<f64>> = heads
        .iter()
        .map(|qg| {
            let l1: f64 = qg.iter().map(|x| x.abs()).sum();
            let chosen: f64 = dims.iter().map(|&c| qg[c].abs()).sum();
            let scale = if chosen == 0.0 && !l1.is_nan() {
                0.0
            } else {
                1.0 / (head_dim as f64 * chosen / l1).sqrt()
            };
            dims.iter().map(|&c| qg[c] * scale).collect()
        })
        .collect();
    let logits: Vec<Vec<f64>> = sparse_query
        .iter()
        .map(|sq| {
            (0..n)
                .map(|t| dims.iter().zip(sq).map(|(&c, x)| x * key(t, c)).sum())
                .collect()
        })
        .collect();
    let scores = (0..n).map(|t| logits.iter().map(|l| l[t]).sum()).collect();
    SparqRow {
        dims,
        sparse_query,
        logits,
        scores,
    }
}

/// Algorithm 1's `alpha` for one query head: the mass of `softmax(logits)` on `kept`.
pub fn sparq_alpha(logits: &[f64], kept: &[usize]) -> f64 {
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = logits.iter().map(|l| (l - m).exp()).sum();
    kept.iter().map(|&i| (logits[i] - m).exp()).sum::<f64>() / total
}

/// Component `c` of token `t` of sequence `b` for KV head `h`, read from the cache `k`
/// (f16 `[num_pages, page_size, num_kv_heads, head_dim]`) through `table`.
pub fn paged_key<'a>(
    k: &'a [f16],
    kv: &'a KvShape,
    table: &'a PageTable,
    b: usize,
    h: usize,
) -> impl Fn(usize, usize) -> f64 + 'a {
    move |t, c| {
        let page = table.kv_page_indices[table.kv_indptr[b] as usize + t / kv.page_size];
        k[kv.k_row(page as usize, t % kv.page_size, h) * kv.head_dim + c].to_f64()
    }
}

/// SparQ's copy of K after every token of `table` is added, as a decode loop leaves it:
/// `k_t` (f16 `[num_blocks, num_kv_heads, head_dim, block_size]`) with the components
/// [`copied_slices`] says of each token of the cache `k` (runs of `min(block_size, 16)`
/// tokens) at its slot of the block `blocks` (the copy's block table) gives it, and
/// `k_open` (f16 `[batch, num_kv_heads, ring, head_dim]`, a ring of two runs) with each
/// sequence's tokens past [`closed_tokens`], the token at position `p` in row `p % ring`;
/// the other values left as they are.
pub fn transpose_blocks(
    k: &[f16],
    kv: &KvShape,
    table: &PageTable,
    blocks: &PageTable,
    block_size: usize,
    k_t: &mut [f16],
    k_open: &mut [f16],
) {
    let (d, ps, bs, hk) = (kv.head_dim, kv.page_size, block_size, kv.num_kv_heads);
    let run = bs.min(SPARQ_RUN);
    let ring = 2 * run;
    for b in 0..table.batch() {
        let n = table.seq_len(b, ps);
        let closed = closed_tokens(n, run);
        for t in 0..n {
            let page = table.kv_page_indices[table.kv_indptr[b] as usize + t / ps] as usize;
            let block = blocks.kv_page_indices[blocks.kv_indptr[b] as usize + t / bs] as usize;
            let copied = copied_slices(n, t, run) * d / run;
            for h in 0..hk {
                let key = &k[kv.k_row(page, t % ps, h) * d..][..d];
                for (c, x) in key[..copied].iter().enumerate() {
                    k_t[((block * hk + h) * d + c) * bs + t % bs] = *x;
                }
                if t >= closed {
                    let row = (b * hk + h) * ring + t % ring;
                    k_open[row * d..][..d].copy_from_slice(key);
                }
            }
        }
    }
}

/// The rows of `k_open` (f16 `[_, num_kv_heads, 2 * run, head_dim]`) that hold each
/// sequence's tokens past [`closed_tokens`] (runs of `run`) over `table`, in order: what a
/// state's staged keys are compared by (its other rows hold whatever was staged before).
pub fn staged_rows(k_open: &[f16], kv: &KvShape, table: &PageTable, run: usize) -> Vec<f16> {
    let (d, hk, ring) = (kv.head_dim, kv.num_kv_heads, 2 * run);
    let mut out = vec![];
    for b in 0..table.batch() {
        let n = table.seq_len(b, kv.page_size);
        for h in 0..hk {
            for t in closed_tokens(n, run)..n {
                let row = (b * hk + h) * ring + t % ring;
                out.extend_from_slice(&k_open[row * d..][..d]);
            }
        }
    }
    out
}

/// The sum of V over each sequence's tokens, `[batch, num_kv_heads, head_dim]`.
pub fn value_sums(v: &[f16], kv: &KvShape, table: &PageTable) -> Vec<f64> {
    let d = kv.head_dim;
    let mut out = vec![0.0; table.batch() * kv.num_kv_heads * d];
    for b in 0..table.batch() {
        for t in 0..table.seq_len(b, kv.page_size) {
            let page = table.kv_page_indices[table.kv_indptr[b] as usize + t / kv.page_size];
            for h in 0..kv.num_kv_heads {
                let row = kv.k_row(page as usize, t % kv.page_size, h) * d;
                for c in 0..d {
                    out[(b * kv.num_kv_heads + h) * d + c] += v[row + c].to_f64();
                }
            }
        }
    }
    out
}
