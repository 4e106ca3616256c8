//! The parts of an append, one kernel-language helper per piece of state a new token
//! updates. Each takes the same description of the program's tokens, then the pointers of
//! its own state:
//!
//! - `k_new` (and `v_new`): the new tokens, f16 `[batch, num_kv_heads, D]`; row `rows[i]`
//!   (`= b * num_kv_heads + h`) is sequence `b`'s token for KV head `h`;
//! - `rows`, `h`: the program's `ROWS` (sequence, KV head) rows and their KV heads;
//! - `page`, `slot`: where the token goes ([`super::token`]); page -1 marks a row to skip,
//!   which a part neither reads for nor writes;
//! - `num_kv_heads`, `page_size`: the cache's shape.
//!
//! A new part (a selector's per-token state) is one more helper of this form, called by
//! [`super::append_kernel::append_tokens`] under a compile-time flag of its own; README.md
//! in this folder says how. SparQ's part is `crate::selectors::sparq_kernels::sparq_token`,
//! beside the rest of SparQ's kernels.

use crate::quantize::{store_codes4, store_codes8};
use dusk_macros::kernel;

/// The `[ROWS, D]` element offsets of the `D` values of rows `rows` of a row-major array.
#[kernel(crate = "crate::dusk_paths")]
pub fn row_offsets<const ROWS: usize, const D: usize>(rows: Block<i64>) -> Block<i64> {
    expand(rows * D, 1, D) + expand(arange(0, D) as i64, 0, ROWS)
}

/// Writes the new tokens' K and V rows into the paged cache (f16 `[num_pages, page_size,
/// num_kv_heads, D]` each, the engine's layout): row `(page * page_size + slot) *
/// num_kv_heads + h`.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn write_kv<const D: usize, const ROWS: usize>(
    k_new: Ptr<f16>,
    v_new: Ptr<f16>,
    rows: Block<i32>,
    h: Block<i32>,
    page: Block<i32>,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_size: i32,
    k_cache: Ptr<f16>,
    v_cache: Ptr<f16>,
) {
    let ok = expand(page >= 0, 1, D);
    let src = row_offsets::<ROWS, D>(rows as i64);
    let at = (page as i64) * (page_size as i64) + (slot as i64);
    let dst = row_offsets::<ROWS, D>(at * (num_kv_heads as i64) + (h as i64));
    store(k_cache + dst, load(k_new + src, ok), ok);
    store(v_cache + dst, load(v_new + src, ok), ok);
}

/// Quantizes the new tokens' K to `BITS` (4 or 8) bits into dusk's head-major copy (codes
/// `[num_pages, num_kv_heads, page_size, D * BITS / 8]`, f16 scale and zero `[num_pages,
/// num_kv_heads, page_size]`; row `(page * num_kv_heads + h) * page_size + slot`) with
/// `quantize_k`'s own arithmetic ([`store_codes4`], [`store_codes8`]), so the bits equal
/// what quantizing the whole cache writes.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn quantize_token<const D: usize, const HALF: usize, const ROWS: usize, const BITS: usize>(
    k_new: Ptr<f16>,
    rows: Block<i32>,
    h: Block<i32>,
    page: Block<i32>,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_size: i32,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
) {
    let valid = page >= 0;
    let head_row = (page as i64) * (num_kv_heads as i64) + (h as i64);
    let qrow = head_row * (page_size as i64) + (slot as i64);
    if BITS == 4 {
        let pairs = (arange(0, HALF) * 2) as i64;
        let src = expand((rows as i64) * D, 1, HALF) + expand(pairs, 0, ROWS);
        let mask = expand(valid, 1, HALF);
        let even = load(k_new + src, mask) as f32;
        let odd = load(k_new + (src + 1), mask) as f32;
        store_codes4::<HALF, ROWS>(even, odd, qrow, valid, mask, packed, scale, zero);
    } else {
        let mask = expand(valid, 1, D);
        let x = load(k_new + row_offsets::<ROWS, D>(rows as i64), mask) as f32;
        store_codes8::<D, ROWS>(x, qrow, valid, mask, packed, scale, zero);
    }
}

/// Folds the new tokens' K into Quest's page minimum and maximum (f16 `[num_pages,
/// num_kv_heads, D]`, row `page * num_kv_heads + h`): the page's first token (slot 0)
/// starts them afresh, any other is combined with what the page holds. Over a page's
/// tokens this is `quest_update`'s result: the min and max of the page's valid tokens,
/// NaN ignored (`minnum`, `maxnum`), exact in f16.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn quest_token<const D: usize, const ROWS: usize>(
    k_new: Ptr<f16>,
    rows: Block<i32>,
    h: Block<i32>,
    page: Block<i32>,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
) {
    let valid = page >= 0;
    let ok = expand(valid, 1, D);
    let x = load(k_new + row_offsets::<ROWS, D>(rows as i64), ok) as f32;
    let st = row_offsets::<ROWS, D>((page as i64) * (num_kv_heads as i64) + (h as i64));
    // Min and max over no tokens are +inf and -inf: a page's first token replaces them.
    let more = expand(valid & (slot > 0), 1, D);
    let old_lo = where_(more, load(page_min + st, more) as f32, f32::INFINITY);
    let old_hi = where_(more, load(page_max + st, more) as f32, f32::NEG_INFINITY);
    store(page_min + st, minimum(old_lo, x) as f16, ok);
    store(page_max + st, maximum(old_hi, x) as f16, ok);
}

/// Writes the new tokens' Double Sparsity labels (f16 `[num_pages, num_kv_heads,
/// page_size, R]`, row `(page * num_kv_heads + h) * page_size + slot`): the `R` channels of
/// KV head `h` (`channels`, i32 `[num_kv_heads, R]`) of K's row, what `ds_update` writes for
/// that slot. The rows' form of `write_token_labels`; a channel outside `0..D` reads as 0.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn ds_token<const D: usize, const ROWS: usize, const R: usize>(
    k_new: Ptr<f16>,
    rows: Block<i32>,
    h: Block<i32>,
    page: Block<i32>,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_size: i32,
    channels: Ptr<i32>,
    labels: Ptr<f16>,
) {
    let valid = page >= 0;
    let ok = expand(valid, 1, R);
    let c = load(channels + row_offsets::<ROWS, R>(h as i64), ok, -1);
    let read = ok & (c >= 0) & (c < D);
    let x = load(k_new + (expand((rows as i64) * D, 1, R) + (c as i64)), read);
    let head_row = (page as i64) * (num_kv_heads as i64) + (h as i64);
    let at = row_offsets::<ROWS, R>(head_row * (page_size as i64) + (slot as i64));
    store(labels + at, x, ok);
}
