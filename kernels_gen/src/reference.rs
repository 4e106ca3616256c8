//! Plain host implementations of the stock kernels: the oracles of the tests and the GPU
//! checks. Quantization repeats the kernel's f32 steps so codes match exactly; scores are
//! computed in f64.

use crate::attention_ops::AttentionMode;
use crate::paged::{KvShape, PageTable, TokenLists};
use half::f16;

/// Quantized K: packed codes, and f16 scale and zero per row, in the layout `quantize_k`
/// writes (head-major: row `KvShape::quantized_row(page, slot, head)`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    pub packed: Vec<u8>,
    pub scale: Vec<f16>,
    pub zero: Vec<f16>,
}

/// What `quantize_k` writes for the K cache `k` (f16, `kv`'s engine layout): each row of
/// `head_dim` values quantized, stored at its row of the head-major copy
/// ([`KvShape::quantized_row`]).
pub fn quantize(k: &[f16], kv: &KvShape, bits: u32) -> QuantizedRows {
    let (rows, head_dim) = (kv.rows(), kv.head_dim);
    let levels = ((1u32 << bits) - 1) as f32;
    let row_bytes = head_dim * bits as usize / 8;
    let mut out = QuantizedRows {
        packed: vec![0; rows * row_bytes],
        scale: vec![f16::ZERO; rows],
        zero: vec![f16::ZERO; rows],
    };
    // A page's rows are contiguous in the head-major copy: one item a page.
    let page_rows = kv.num_kv_heads * kv.page_size;
    let pages: Vec<_> = (out.packed.chunks_mut(page_rows * row_bytes))
        .zip(out.scale.chunks_mut(page_rows))
        .zip(out.zero.chunks_mut(page_rows))
        .collect();
    par_map(pages, |page, ((packed, scale), zero)| {
        for slot in 0..kv.page_size {
            for head in 0..kv.num_kv_heads {
                let src = kv.k_row(page, slot, head);
                let dst = kv.quantized_row(page, slot, head) - page * page_rows;
                let x: Vec<f32> = k[src * head_dim..(src + 1) * head_dim]
                    .iter()
                    .map(|v| v.to_f32())
                    .collect();
                let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
                let scale16 = f16::from_f32((hi - lo) / levels);
                let zero16 = f16::from_f32(lo);
                let (s, z) = (scale16.to_f32(), zero16.to_f32());
                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                let codes: Vec<u8> = x
                    .iter()
                    .map(|v| ((v - z) * inv + 0.5).clamp(0.0, levels) as u8)
                    .collect();
                let bytes = &mut packed[dst * row_bytes..(dst + 1) * row_bytes];
                if bits == 4 {
                    for (j, byte) in bytes.iter_mut().enumerate() {
                        *byte = codes[2 * j] | (codes[2 * j + 1] << 4);
                    }
                } else {
                    bytes.copy_from_slice(&codes);
                }
                scale[dst] = scale16;
                zero[dst] = zero16;
            }
        }
    });
    out
}

/// `f(i, item)` for every item, the results in order, on the machine's cores (a
/// contiguous block of items a thread): the references' rows are independent, and at the
/// checks' sizes (sequences of 32k tokens) one core makes them the slowest part of a check.
/// A panic in `f` is the caller's.
///
/// ```
/// use dusk_kernels::reference::par_map;
/// let mut out = vec![0u32; 12];
/// let sums = par_map(out.chunks_mut(3).collect(), |i, row| {
///     row.fill(i as u32);
///     3 * i
/// });
/// assert_eq!(sums, [0, 3, 6, 9]);
/// assert_eq!(out, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
/// ```
pub fn par_map<I: Send, R: Send>(items: Vec<I>, f: impl Fn(usize, I) -> R + Sync) -> Vec<R> {
    let n = items.len();
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get());
    if threads < 2 || n < 2 {
        return items
            .into_iter()
            .enumerate()
            .map(|(i, x)| f(i, x))
            .collect();
    }
    let per = n.div_ceil(threads.min(n));
    let mut items = items.into_iter().enumerate();
    std::thread::scope(|s| {
        let f = &f;
        let blocks: Vec<_> = (0..n.div_ceil(per))
            .map(|_| {
                let block: Vec<(usize, I)> = items.by_ref().take(per).collect();
                s.spawn(move || block.into_iter().map(|(i, x)| f(i, x)).collect::<Vec<R>>())
            })
            .collect();
        blocks
            .into_iter()
            .flat_map(|b| b.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// `out` cut into consecutive slices of the given lengths (the rest dropped).
fn split_rows<T>(mut out: &mut [T], lens: impl Iterator<Item = usize>) -> Vec<&mut [T]> {
    lens.map(|n| {
        let (row, rest) = std::mem::take(&mut out).split_at_mut(n);
        out = rest;
        row
    })
    .collect()
}

/// Code `i` of a packed row.
pub fn code(row: &[u8], i: usize, bits: u32) -> u8 {
    if bits == 4 {
        (row[i / 2] >> (4 * (i % 2))) & 15
    } else {
        row[i]
    }
}

/// The dequantized value of element `d` of row `row` of the quantized copy (a
/// [`KvShape::quantized_row`]).
pub fn dequant(qk: &QuantizedRows, head_dim: usize, bits: u32, row: usize, d: usize) -> f64 {
    let row_bytes = head_dim * bits as usize / 8;
    let c = code(&qk.packed[row * row_bytes..(row + 1) * row_bytes], d, bits) as f64;
    c * qk.scale[row].to_f64() + qk.zero[row].to_f64()
}

/// Scores in `spgemv_quant`'s output layout (see `spgemv`), in f64.
pub fn spgemv(
    q: &[f16],
    num_q_heads: usize,
    qk: &QuantizedRows,
    bits: u32,
    kv: &KvShape,
    table: &PageTable,
    cand: &TokenLists,
) -> Vec<f64> {
    let group = num_q_heads / kv.num_kv_heads;
    let d = kv.head_dim;
    let mut out = vec![0.0; cand.indices.len() * group];
    let first = cand.indptr.first().map_or(0, |i| *i as usize) * group;
    let lens = (0..cand.rows()).map(|r| cand.row(r).len() * group);
    let rows = split_rows(&mut out[first..], lens);
    par_map(rows, |r, out| {
        let (b, h) = (r / kv.num_kv_heads, r % kv.num_kv_heads);
        let toks = cand.row(r);
        let qrows: Vec<Vec<f64>> = (0..group)
            .map(|g| {
                let qrow = &q[(b * num_q_heads + h * group + g) * d..][..d];
                qrow.iter().map(|x| x.to_f64()).collect()
            })
            .collect();
        let mut krow = vec![0.0; d];
        for (j, &pos) in toks.iter().enumerate() {
            let pos = pos as usize;
            let page =
                table.kv_page_indices[table.kv_indptr[b] as usize + pos / kv.page_size] as usize;
            let row = kv.quantized_row(page, pos % kv.page_size, h);
            for (i, x) in krow.iter_mut().enumerate() {
                *x = dequant(qk, d, bits, row, i);
            }
            for (g, qrow) in qrows.iter().enumerate() {
                out[g * toks.len() + j] = (0..d).map(|i| qrow[i] * krow[i]).sum();
            }
        }
    });
    out
}

/// The positions each query row (batch x query heads) attends to in `mode`, for
/// [`attention`]: every token of its sequence (dense), its own list (head varlen), or its
/// KV head's list, shared by the group (group varlen and padded).
///
/// # Panics
/// If `mode` is a list mode and `lists` is `None` (a bug in the calling check).
pub fn per_query_rows(
    mode: AttentionMode,
    table: &PageTable,
    lists: Option<&TokenLists>,
    kv: &KvShape,
    num_q_heads: usize,
) -> Vec<Vec<i32>> {
    let group = num_q_heads / kv.num_kv_heads;
    (0..table.batch() * num_q_heads)
        .map(|r| {
            let (b, h) = (r / num_q_heads, r % num_q_heads);
            match (mode, lists) {
                (AttentionMode::Dense, _) => (0..table.seq_len(b, kv.page_size) as i32).collect(),
                (AttentionMode::HeadVarlen, Some(l)) => l.row(r).to_vec(),
                (_, Some(l)) => l.row(b * kv.num_kv_heads + h / group).to_vec(),
                _ => panic!("{mode:?} attends to token lists, and none were given"),
            }
        })
        .collect()
}

/// `‖a - b‖ / ‖b‖`, the error measure of the checks (infinite if `a` has a NaN).
pub fn rel_error(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if a.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// The 16-bit float element types, converted to and from f32 (what the checks of f16 and
/// bf16 kernels generate inputs and read outputs with).
pub trait HalfFloat: dusk_runtime::Element {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}
impl HalfFloat for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}
impl HalfFloat for half::bf16 {
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// `softmax(scores * scale)` in f64.
pub fn softmax(scores: &[f32], scale: f64) -> Vec<f64> {
    let m = scores
        .iter()
        .map(|s| *s as f64 * scale)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores
        .iter()
        .map(|s| (*s as f64 * scale - m).exp())
        .collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// The sort-based oracle of a threshold policy: weights sorted descending and grouped into
/// levels of equal weight; the first level at which `holds(mass, count)` of everything up
/// to it is true is the cut, and every weight at or above it is kept (ties together).
/// Everything is kept when no level satisfies it.
pub fn threshold_oracle(w: &[f64], holds: impl Fn(f64, usize) -> bool) -> Vec<bool> {
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|a, b| w[*b].total_cmp(&w[*a]));
    let mut kept = vec![true; w.len()];
    let (mut mass, mut i) = (0.0, 0);
    while i < order.len() {
        let level = w[order[i]];
        let mut j = i;
        while j < order.len() && w[order[j]] == level {
            mass += w[order[j]];
            j += 1;
        }
        if holds(mass, j) {
            for &o in &order[j..] {
                kept[o] = false;
            }
            break;
        }
        i = j;
    }
    kept
}

/// Top-p's oracle: the fewest heaviest weights whose sum reaches `p`; at `p = 1`, every
/// weight that is positive in f32 relative to the largest (an f64 sum reaches 1 before the
/// tiniest weights are added, and none may be dropped for that).
pub fn top_p_oracle(w: &[f64], p: f64) -> Vec<bool> {
    if p >= 1.0 {
        let top = w.iter().cloned().fold(0.0, f64::max);
        return w.iter().map(|x| (*x / top) as f32 > 0.0).collect();
    }
    threshold_oracle(w, |m, _| m >= p)
}

/// The candidates whose membership in top-p's set may differ from [`top_p_oracle`] by
/// float rounding (the rule of [`check_kept`]): weights within relative 4e-6 of the cut,
/// and, when the mass just before or with the cut level is within 1e-5 of `p`, the cut
/// level and the level just below it.
pub fn top_p_ambiguous(w: &[f64], p: f64) -> Vec<bool> {
    let oracle = top_p_oracle(w, p);
    let cut = (0..w.len())
        .filter(|i| oracle[*i])
        .map(|i| w[i])
        .fold(f64::INFINITY, f64::min);
    let with: f64 = (0..w.len()).filter(|i| oracle[*i]).map(|i| w[i]).sum();
    let before: f64 = (0..w.len())
        .filter(|i| oracle[*i] && w[*i] > cut)
        .map(|i| w[i])
        .sum();
    let below = (0..w.len())
        .filter(|i| !oracle[*i])
        .map(|i| w[i])
        .fold(f64::NEG_INFINITY, f64::max);
    let near = (before - p).abs() < 1e-5 || (with - p).abs() < 1e-5;
    w.iter()
        .map(|x| (x - cut).abs() <= 4e-6 * cut || (near && (*x == cut || *x == below)))
        .collect()
}

/// Checks a kept set against the oracle's. They may differ only by elements whose weight
/// is within float rounding (relative 4e-6) of the oracle's cut (f32 weights tie where f64
/// ones do not), or, where `near_cut(mass before the cut level, mass with it)` says the cut
/// lies within rounding of the target, by the one weight level next to the cut.
pub fn check_kept(
    w: &[f64],
    kept: &[bool],
    oracle: &[bool],
    near_cut: impl Fn(f64, f64) -> bool,
) -> Result<(), String> {
    if kept == oracle {
        return Ok(());
    }
    let cut = (0..w.len())
        .filter(|i| oracle[*i])
        .map(|i| w[i])
        .fold(f64::INFINITY, f64::min);
    let diff: Vec<usize> = (0..w.len()).filter(|i| kept[*i] != oracle[*i]).collect();
    if diff.iter().all(|i| (w[*i] - cut).abs() <= 4e-6 * cut) {
        return Ok(());
    }
    let mass_with: f64 = (0..w.len()).filter(|i| oracle[*i]).map(|i| w[i]).sum();
    let mass_before: f64 = (0..w.len())
        .filter(|i| oracle[*i] && w[*i] > cut)
        .map(|i| w[i])
        .sum();
    let one_level = diff.iter().all(|i| w[*i] == w[diff[0]]);
    let adjacent = diff.iter().all(|i| kept[*i] != oracle[*i] && !kept[*i]) && w[diff[0]] == cut
        || diff.iter().all(|i| kept[*i])
            && (0..w.len())
                .filter(|i| !oracle[*i] && w[*i] > w[diff[0]])
                .count()
                == 0;
    if one_level && adjacent && near_cut(mass_before, mass_with) {
        return Ok(());
    }
    Err(format!(
        "kept {} of {}, oracle {}; {} differ (first: weight {:e}, kept {}); oracle cut {:e}, mass before/with the cut {:.9}/{:.9}",
        kept.iter().filter(|k| **k).count(),
        w.len(),
        oracle.iter().filter(|k| **k).count(),
        diff.len(),
        w[diff[0]],
        kept[diff[0]],
        cut,
        mass_before,
        mass_with
    ))
}

/// Decode attention in f64: for each query row `(b, h)` (`q` is `[batch, num_q_heads, D]`)
/// over the positions `tokens[b * num_q_heads + h]` of sequence `b`, softmax scaled by
/// `scale`. Returns the outputs (`[batch * num_q_heads, D]`) and the natural-log LSE per
/// row; an empty row gives zeros and `-inf`. With `sparq = Some((alpha, v_mean))` the
/// output is `alpha * y + (1 - alpha) * v_mean[b, kv head]`. The inputs in any type that
/// converts to f64 exactly (f32, f16: a cache need not be copied to f32 first).
#[allow(clippy::too_many_arguments)]
pub fn attention<Q: Copy + Into<f64> + Sync, T: Copy + Into<f64> + Sync>(
    q: &[Q],
    k: &[T],
    v: &[T],
    num_q_heads: usize,
    kv: &KvShape,
    table: &PageTable,
    tokens: &[Vec<i32>],
    scale: f64,
    sparq: Option<(&[f32], &[f32])>,
) -> (Vec<f64>, Vec<f64>) {
    let d = kv.head_dim;
    let group = num_q_heads / kv.num_kv_heads;
    let mut out = vec![0.0; tokens.len() * d];
    let lse = par_map(out.chunks_mut(d.max(1)).collect(), |r, y| {
        let toks = &tokens[r];
        let (b, h) = (r / num_q_heads, r % num_q_heads);
        let kvh = h / group;
        let qrow: Vec<f64> = q[r * d..(r + 1) * d].iter().map(|x| (*x).into()).collect();
        let rows: Vec<usize> = toks
            .iter()
            .map(|&pos| {
                let pos = pos as usize;
                let page = table.kv_page_indices[table.kv_indptr[b] as usize + pos / kv.page_size]
                    as usize;
                ((page * kv.page_size + pos % kv.page_size) * kv.num_kv_heads + kvh) * d
            })
            .collect();
        let s: Vec<f64> = rows
            .iter()
            .map(|&o| (0..d).map(|i| qrow[i] * k[o + i].into()).sum::<f64>() * scale)
            .collect();
        let mut lse = f64::NEG_INFINITY;
        if !s.is_empty() {
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for (wi, &o) in w.iter().zip(&rows) {
                for i in 0..d {
                    y[i] += wi / sum * v[o + i].into();
                }
            }
            lse = m + sum.ln();
        }
        if let Some((alpha, v_mean)) = sparq {
            let a = alpha[r] as f64;
            let vm = &v_mean[(b * kv.num_kv_heads + kvh) * d..][..d];
            for i in 0..d {
                y[i] = a * y[i] + (1.0 - a) * vm[i] as f64;
            }
        }
        lse
    });
    (out, lse)
}
