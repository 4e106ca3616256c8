//! Double Sparsity's kernels (Yang et al. 2024; one of the selectors Twilight composes with,
//! Section 4.1), in the kernel language.
//!
//! The label cache: per (physical page, KV head, token slot), the `R` calibrated channels of
//! that token's key, f16 `[num_pages, num_kv_heads, page_size, R]`: one KV head's labels of
//! a page are one contiguous run of `page_size * R` values, so the scoring reads them in
//! 16-byte vectors, and the cache (like Quest's state) belongs to the physical page, not
//! to a page table. The channels are a calibration's (`super::ds::DsCalibration`), i32
//! `[num_kv_heads, R]` on the device.
//!
//! Score of token `t` for KV head `h`: `sum_g sum_j q_{g, c_j} * label_{t, j}` over the
//! group's query heads `g` and the head's channels `c_j`: the approximate `q . k` on the
//! labelled channels, with the group folded as Quest folds it (one score per KV head). The
//! group's sum is taken once per program (`R` values), so a token costs `R` multiply-adds
//! whatever the group. A NaN in q reaches every score of its row (the top-k flags it).
//!
//! A channel outside `0..D` (never one of a validated calibration) reads as 0 in every
//! helper here: nothing is read out of bounds whatever the channel buffer holds.

use super::page::{update_len, update_page};
use dusk_macros::kernel;

/// The element offset (i64) of the labels of token slot `slot` of physical page `page` for
/// KV head `head`: `((page * num_kv_heads + head) * page_size + slot) * R`.
#[kernel(crate = "crate::dusk_paths")]
pub fn label_offset<const R: usize>(
    page: i32,
    head: i32,
    slot: i32,
    num_kv_heads: i32,
    page_size: i32,
) -> i64 {
    let row = (page as i64) * (num_kv_heads as i64) + (head as i64);
    (row * (page_size as i64) + (slot as i64)) * R
}

/// The channels of KV head `head`, `[R]` from `channels` (i32 `[num_kv_heads, R]`).
#[kernel(crate = "crate::dusk_paths")]
pub fn head_channels<const R: usize>(channels: Ptr<i32>, head: i32) -> Block<i32> {
    load(channels + (head * R + arange(0, R)))
}

/// Writes one token's labels: the channels of KV head `head` (from `channels`, i32
/// `[num_kv_heads, R]`) of its key, the `D` f16 values at `k + key_at`, to the `R` f16
/// values at `labels + label_at` ([`label_offset`]). What an append kernel calls for each
/// token it writes to the cache (`key_at` may point into the cache, or into the step's new
/// keys: any row of `D` values).
#[kernel(crate = "crate::dusk_paths")]
pub fn write_token_labels<const D: usize, const R: usize>(
    k: Ptr<f16>,
    key_at: i64,
    channels: Ptr<i32>,
    head: i32,
    labels: Ptr<f16>,
    label_at: i64,
) {
    let c = head_channels::<R>(channels, head);
    let ok = (c >= 0) & (c < D);
    let x = load(k + (key_at + (c as i64)), ok);
    store(labels + (label_at + (arange(0, R) as i64)), x);
}

/// Writes the labels of the first `lens[i]` token slots of physical page `pages[i]` for KV
/// head `program_id(1)`, from the cache `k`. Parameters (the update convention of
/// [`super::selector::Selector`], then the calibration and the cache): `k` (f16
/// `[num_pages, page_size, num_kv_heads, D]`), `pages`, `lens` (i32 per entry),
/// `num_pages`, `num_kv_heads`, `page_size`, `channels` (i32 `[num_kv_heads, R]`),
/// `labels` (f16 `[num_pages, num_kv_heads, page_size, R]`). Grid: `(entries,
/// num_kv_heads)`. Entries with a page id out of range or a length outside
/// `1..=page_size` are skipped. `SLOTS` tokens at a time: the gathers of a page's tokens
/// are in flight together.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn ds_update<const D: usize, const R: usize, const SLOTS: usize>(
    k: Ptr<f16>,
    pages: Ptr<i32>,
    lens: Ptr<i32>,
    num_pages: i32,
    num_kv_heads: i32,
    page_size: i32,
    channels: Ptr<i32>,
    labels: Ptr<f16>,
) {
    let page = update_page(pages, lens, num_pages, page_size);
    if page >= 0 {
        let len = update_len(lens);
        let head = program_id(1);
        let c = head_channels::<R>(channels, head);
        let cols = expand(c as i64, 0, SLOTS);
        let c_ok = expand((c >= 0) & (c < D), 0, SLOTS);
        let heads = num_kv_heads as i64;
        for s0 in (0..len).step_by(SLOTS) {
            let slot = s0 + arange(0, SLOTS);
            let ok = expand(slot < len, 1, R) & c_ok;
            let key_rows = ((page * page_size + slot) as i64) * heads + (head as i64);
            let x = load(k + (expand(key_rows * D, 1, R) + cols), ok);
            let at = label_offset::<R>(page, head, s0, num_kv_heads, page_size);
            let offs =
                expand(arange(0, SLOTS) as i64, 1, R) * R + expand(arange(0, R) as i64, 0, SLOTS);
            store(labels + (at + offs), x, expand(slot < len, 1, R));
        }
    }
}

/// Scores `TILE` tokens of one row (sequence `b`, KV head `h`, `program_id(0) = b *
/// num_kv_heads + h`) from their labels. Parameters: `q` (f16 `[batch, num_kv_heads * G,
/// D]`), `kv_indptr`, `kv_page_indices` (the page table), `token_indptr` (i32 `[batch +
/// 1]`: tokens before each sequence), `scores` (f32, row `(b, h)` at `token_indptr[b] *
/// num_kv_heads + h * len_b`: the top-k's layout for per-token rows), `num_kv_heads`,
/// `page_shift` (log2 of the page size), `channels` (i32 `[num_kv_heads, R]`), `labels`
/// (f16 `[num_pages, num_kv_heads, page_size, R]`). Grid: `(batch * num_kv_heads,
/// ceil(longest sequence / TILE))`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn ds_score<
    const D: usize,
    const G: usize,
    const R: usize,
    const TILE: usize,
    const WARPS: usize,
>(
    q: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    token_indptr: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
    page_shift: i32,
    channels: Ptr<i32>,
    labels: Ptr<f16>,
) {
    let row = program_id(0);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(token_indptr + b);
    let n = load(token_indptr + (b + 1)) - first;
    if program_id(1) * TILE < n {
        let t = program_id(1) * TILE + arange(0, TILE);
        let valid = t < n;
        // Each token's label row through the page table.
        let zero = 0i32;
        let page = load(
            kv_page_indices + (load(kv_indptr + b) + (t >> page_shift)),
            valid,
            zero,
        );
        let slot = t & ((1 << page_shift) - 1);
        let heads = num_kv_heads as i64;
        let rows =
            ((page as i64) * heads + (h as i64)) * ((1 << page_shift) as i64) + (slot as i64);
        let offs = expand(rows * R, 1, R) + expand(arange(0, R) as i64, 0, TILE);
        let lab = load(labels + offs, expand(valid, 1, R)) as f32;
        // q's labelled channels, summed over the group: `[R]`.
        let c = head_channels::<R>(channels, h);
        let c_ok = (c >= 0) & (c < D);
        let q_rows = (row * G + arange(0, G)) as i64;
        let q_offs = expand(q_rows * D, 1, R) + expand(c as i64, 0, G);
        let qg = sum(load(q + q_offs, expand(c_ok, 0, G)) as f32, 0);
        let s = sum(lab * expand(qg, 0, TILE), 1);
        store(
            scores + ((first * num_kv_heads + h * n + t) as i64),
            s,
            valid,
        );
    }
}
