//! What a generated batch's attention looks like, in f64 on the host: each query head's
//! softmax weights over its sequence and the budget top-p needs, the measures the tests and
//! the example report.

use super::spec::SyntheticSpec;
use crate::paged::PageTable;
use half::f16;

/// The softmax weights (scale `1 / sqrt(head_dim)`) of query head `q_head` of sequence
/// `seq` over the sequence's tokens, by position, in f64 from the f16 cache `k` (the engines'
/// layout, pages named by `table`) and queries `q` (`[batch, num_q_heads, head_dim]`).
pub fn attention_weights(
    spec: &SyntheticSpec,
    table: &PageTable,
    k: &[f16],
    q: &[f16],
    seq: usize,
    q_head: usize,
) -> Vec<f64> {
    let (d, ps, hk) = (spec.head_dim, spec.page_size, spec.num_kv_heads);
    let head = q_head / spec.group();
    let qrow = &q[(seq * spec.num_q_heads + q_head) * d..][..d];
    let qf: Vec<f64> = qrow.iter().map(|x| x.to_f64()).collect();
    let scale = 1.0 / (d as f64).sqrt();
    let first = table.kv_indptr[seq] as usize;
    let logits: Vec<f64> = (0..spec.seq_lens[seq])
        .map(|pos| {
            let page = table.kv_page_indices[first + pos / ps] as usize;
            let row = (page * ps + pos % ps) * hk + head;
            let krow = &k[row * d..][..d];
            scale
                * krow
                    .iter()
                    .zip(&qf)
                    .map(|(a, b)| a.to_f64() * b)
                    .sum::<f64>()
        })
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|x| x / total).collect()
}

/// The fewest tokens whose weights sum to at least `p` (the sort-based oracle's budget).
pub fn top_p_budget(weights: &[f64], p: f64) -> usize {
    top_positions(weights, weights.len())
        .iter()
        .scan(0.0, |mass, i| {
            let before = *mass;
            *mass += weights[*i];
            (before < p).then_some(())
        })
        .count()
}

/// The positions of the `n` largest weights, heaviest first (ties toward the lower position).
pub fn top_positions(weights: &[f64], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]).then(a.cmp(b)));
    order.truncate(n);
    order
}
