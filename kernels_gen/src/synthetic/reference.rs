//! The generator on the host: every value as a function of the seed and its coordinates
//! (the formulas of [`super::kernels`]), and whole caches made of them, the oracle the
//! kernels are checked against (equal bit for bit).

use super::hash::{hash2, hash3, signed_byte, stream_key, Stream};
use super::planted::{PlantIndex, Planted};
use super::spec::SyntheticSpec;
use crate::paged::{KvShape, PageTable};
use half::f16;

/// Element `ch` of K for token `pos` of sequence `seq`, KV head `head`; `planted` is
/// `(q_head, strength_steps)` when the token is planted for a query head.
pub fn key(
    spec: &SyntheticSpec,
    seq: usize,
    head: usize,
    pos: usize,
    ch: usize,
    planted: Option<(usize, i32)>,
) -> f16 {
    let id = (seq * spec.num_kv_heads + head) as u32;
    let n = signed_byte(hash3(
        stream_key(spec.seed, Stream::KeyNoise),
        id,
        pos as u32,
        ch as u32,
    ));
    let aligned = planted.map_or(0, |(qh, m)| m * direction(spec, seq, qh, ch));
    f16::from_f32((16 * n + aligned) as f32 / 4096.0)
}

/// Element `ch` of V for token `pos` of sequence `seq`, KV head `head`.
pub fn value(spec: &SyntheticSpec, seq: usize, head: usize, pos: usize, ch: usize) -> f16 {
    let id = (seq * spec.num_kv_heads + head) as u32;
    let mean = signed_byte(hash2(
        stream_key(spec.seed, Stream::ValueMean),
        id,
        ch as u32,
    ));
    let n = signed_byte(hash3(
        stream_key(spec.seed, Stream::ValueNoise),
        id,
        pos as u32,
        ch as u32,
    ));
    f16::from_f32((mean + n) as f32 / 256.0)
}

/// Element `ch` of query head `q_head`'s direction in sequence `seq`, a signed byte (the
/// direction is this over 256).
pub fn direction(spec: &SyntheticSpec, seq: usize, q_head: usize, ch: usize) -> i32 {
    let id = (seq * spec.num_q_heads + q_head) as u32;
    signed_byte(hash2(
        stream_key(spec.seed, Stream::QueryDirection),
        id,
        ch as u32,
    ))
}

/// Element `ch` of query head `q_head`'s query in sequence `seq` at decode step `step`.
pub fn query(spec: &SyntheticSpec, step: u32, seq: usize, q_head: usize, ch: usize) -> f16 {
    let id = (seq * spec.num_q_heads + q_head) as u32;
    let e = signed_byte(hash3(
        stream_key(spec.seed, Stream::QueryJitter),
        step,
        id,
        ch as u32,
    ));
    let j = 2 * step.min(1) as i32;
    let c = spec.heads[q_head].scale_steps();
    let x = (8 * direction(spec, seq, q_head, ch) + j * e) * c;
    f16::from_f32(x as f32 / 32768.0)
}

/// K and V of page `j` of sequence `seq` as the kernels write them: `[page_size,
/// num_kv_heads, head_dim]` each (every slot, also those past the sequence's end).
/// `plants` is [`Planted::by_token`] of the batch's planted tokens.
pub fn page(
    spec: &SyntheticSpec,
    plants: &PlantIndex,
    seq: usize,
    j: usize,
) -> (Vec<f16>, Vec<f16>) {
    let (d, hk) = (spec.head_dim, spec.num_kv_heads);
    let mut k = Vec::with_capacity(spec.page_size * hk * d);
    let mut v = Vec::with_capacity(spec.page_size * hk * d);
    for slot in 0..spec.page_size {
        let pos = j * spec.page_size + slot;
        for h in 0..hk {
            let plant = plants.get(&(seq, h, pos)).copied();
            k.extend((0..d).map(|ch| key(spec, seq, h, pos, ch, plant)));
            v.extend((0..d).map(|ch| value(spec, seq, h, pos, ch)));
        }
    }
    (k, v)
}

/// The whole K and V caches of `num_pages` pages as the kernels write them over `table`:
/// pages the table does not name are zero (a fresh allocation). `spec` and `table` are
/// assumed valid ([`super::write_cache`] checks them).
pub fn cache(spec: &SyntheticSpec, table: &PageTable, num_pages: usize) -> (Vec<f16>, Vec<f16>) {
    let kv = KvShape {
        num_pages,
        ..spec.kv_shape()
    };
    let per_page = kv.page_size * kv.num_kv_heads * kv.head_dim;
    let (mut k, mut v) = (
        vec![f16::ZERO; kv.elements()],
        vec![f16::ZERO; kv.elements()],
    );
    let plants = Planted::draw(spec).by_token(spec.group());
    for b in 0..spec.batch() {
        let first = table.kv_indptr[b] as usize;
        for j in 0..table.kv_indptr[b + 1] as usize - first {
            let at = table.kv_page_indices[first + j] as usize * per_page;
            let (pk, pv) = page(spec, &plants, b, j);
            k[at..at + per_page].copy_from_slice(&pk);
            v[at..at + per_page].copy_from_slice(&pv);
        }
    }
    (k, v)
}

/// Every query of decode step `step`, `[batch, num_q_heads, head_dim]`.
pub fn queries(spec: &SyntheticSpec, step: u32) -> Vec<f16> {
    let d = spec.head_dim;
    (0..spec.batch() * spec.num_q_heads * d)
        .map(|i| {
            let r = i / d;
            query(
                spec,
                step,
                r / spec.num_q_heads,
                r % spec.num_q_heads,
                i % d,
            )
        })
        .collect()
}
