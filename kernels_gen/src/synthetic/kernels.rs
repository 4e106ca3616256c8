//! The generator's kernels, in the kernel language: the host functions of [`super::hash`]
//! and [`super::reference`] on the device, so that the GPU and the interpreter write the
//! values the host computes, bit for bit.
//!
//! Exactness. Every value is formed in i32 from signed bytes (odd, in [-255, 255]) and
//! integer steps of 1/16, converted to f32 (exact: every magnitude is under 2^24), scaled by
//! a power of two (exact) and rounded once, to f16 (round to nearest even on the CPU and on
//! the GPU). Nothing depends on how the device orders or fuses float operations.
//!
//! - K: `(16 n + m u) / 2^12`, `n` the key's noise, `u` the query direction of the head the
//!   token is planted for and `m` its strength in steps (0 for a token planted for none):
//!   `n / 256 + (m / 16) (u / 256)`.
//! - V: `(mean + n) / 2^8`, a mean per (sequence, KV head, channel) and the value's noise.
//! - q: `c (8 u + j e) / 2^15`, `c` the head's scale in steps, `e` a decode step's jitter,
//!   `j` 0 at step 0 and 2 after: `(c / 16) (u + e / 4) / 256`.
//!
//! Bounds: every index comes from the host's validated metadata (page table, planted
//! tokens), and offsets are i64.

use dusk_macros::kernel;

/// `lowbias32` on i32 words: multiplies wrap as u32 ones do, and the logical shifts are
/// arithmetic ones masked. The second multiplier is `0x846c_a68b` as an i32
/// ([`super::hash::MUL2_I32`]). On blocks only (helpers take blocks or scalars, not
/// both): a scalar's mix is taken over a block of copies, `mix(splat(x, [n]))`.
#[kernel(crate = "crate::dusk_paths")]
pub fn mix(x: Block<i32>) -> Block<i32> {
    let a = (x ^ ((x >> 16) & 0xFFFF)) * 0x7feb_352d;
    let b = (a ^ ((a >> 15) & 0x1_FFFF)) * -2_073_254_261;
    b ^ ((b >> 16) & 0xFFFF)
}

/// The low byte of `h` as an odd integer in [-255, 255] ([`super::hash::signed_byte`]).
#[kernel(crate = "crate::dusk_paths")]
pub fn signed_byte(h: Block<i32>) -> Block<i32> {
    (h & 0xFF) * 2 - 255
}

/// Signed bytes of `hash3(key, id, pos, channel)` for a block of positions: `[SLOTS, D]`.
#[kernel(crate = "crate::dusk_paths")]
pub fn noise<const SLOTS: usize, const D: usize>(key: i32, id: i32, pos: Block<i32>) -> Block<i32> {
    let row = mix(mix(splat(key ^ id, [SLOTS])) ^ pos);
    signed_byte(mix(expand(row, 1, D) ^ expand(arange(0, D), 0, SLOTS)))
}

/// Writes every token slot of one page of the batch for KV head `program_id(1)`: K's and
/// V's background (noise, and V's mean). `program_id(0)` is the page's entry in the page
/// table, `page_seq` its sequence. `k`, `v`: f16 `[num_pages, page_size, num_kv_heads, D]`.
/// Grid: `(kv_indptr[batch], num_kv_heads)`.
#[kernel(crate = "crate::dusk_paths", num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn synth_kv<const D: usize, const SLOTS: usize>(
    k: Ptr<f16>,
    v: Ptr<f16>,
    page_seq: Ptr<i32>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    num_kv_heads: i32,
    page_size: i32,
    key_k: i32,
    key_v: i32,
    key_mean: i32,
) {
    let entry = program_id(0);
    let h = program_id(1);
    let b = load(page_seq + entry);
    let first = (entry - load(kv_indptr + b)) * page_size;
    let page = load(kv_page_indices + entry) as i64;
    let id = b * num_kv_heads + h;
    let ch = arange(0, D);
    let mean = signed_byte(mix(mix(splat(key_mean ^ id, [D])) ^ ch));
    for s0 in (0..page_size).step_by(SLOTS) {
        let slot = s0 + arange(0, SLOTS);
        let pos = first + slot;
        let kx = noise::<SLOTS, D>(key_k, id, pos) * 16;
        let vx = noise::<SLOTS, D>(key_v, id, pos) + expand(mean, 0, SLOTS);
        let rows = (page * page_size as i64 + slot as i64) * num_kv_heads as i64 + h as i64;
        let offs = expand(rows * D, 1, D) + expand(ch as i64, 0, SLOTS);
        let mask = expand(slot < page_size, 1, D);
        store(k + offs, ((kx as f32) * 0.000244140625) as f16, mask);
        store(v + offs, ((vx as f32) * 0.00390625) as f16, mask);
    }
}

/// Rewrites the K row of each planted token: `plants` holds `[seq, pos, q_head,
/// strength_steps]` per token (i32), one program each. Grid: `(tokens, 1)`.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn synth_plant<const D: usize>(
    k: Ptr<f16>,
    plants: Ptr<i32>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    num_kv_heads: i32,
    num_q_heads: i32,
    page_size: i32,
    key_k: i32,
    key_q: i32,
) {
    let at = program_id(0) * 4;
    let b = load(plants + at);
    let pos = load(plants + (at + 1));
    let qh = load(plants + (at + 2));
    let m = load(plants + (at + 3));
    let h = qh / (num_q_heads / num_kv_heads);
    let page = load(kv_page_indices + (load(kv_indptr + b) + pos / page_size)) as i64;
    let ch = arange(0, D);
    let n = signed_byte(mix(mix(
        mix(splat(key_k ^ (b * num_kv_heads + h), [D])) ^ pos
    ) ^ ch));
    let u = signed_byte(mix(mix(splat(key_q ^ (b * num_q_heads + qh), [D])) ^ ch));
    let row = (page * page_size as i64 + (pos % page_size) as i64) * num_kv_heads as i64 + h as i64;
    store(
        k + (row * D + ch as i64),
        (((n * 16 + u * m) as f32) * 0.000244140625) as f16,
    );
}

/// The queries of decode step `step`, one program per (sequence, query head) row `r`:
/// `scales[r % num_q_heads]` is the head's scale in steps. `q`: f16 `[batch, num_q_heads,
/// D]`. Grid: `(batch * num_q_heads, 1)`.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
pub fn synth_query<const D: usize>(
    q: Ptr<f16>,
    scales: Ptr<i32>,
    num_q_heads: i32,
    key_q: i32,
    key_jitter: i32,
    step: i32,
) {
    let r = program_id(0);
    let c = load(scales + r % num_q_heads);
    let ch = arange(0, D);
    let u = signed_byte(mix(mix(splat(key_q ^ r, [D])) ^ ch));
    let e = signed_byte(mix(mix(mix(splat(key_jitter ^ step, [D])) ^ r) ^ ch));
    let j = minimum(step, 1) * 2;
    let x = (u * 8 + e * j) * c;
    store(
        q + (r as i64 * D + ch as i64),
        ((x as f32) * 0.000030517578125) as f16,
    );
}
