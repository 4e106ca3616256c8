//! Quest's two kernels (Tang et al. 2024; Twilight Section 4.1's stock selector), in the
//! kernel language, on the page conventions of [`super::page`].
//!
//! State: per (physical page, KV head), the elementwise min and max of K over the page's
//! valid tokens, f16 `[num_pages, num_kv_heads, head_dim]` each. f16 loses nothing: a
//! min or max of f16 values is one of them, so f32 state would only double the bytes the
//! (memory-bound) scoring reads.
//!
//! Score of page `p` for KV head `h`: `sum_g sum_d max(q_gd * min_d, q_gd * max_d)` over
//! the group's query heads `g`. Since `min_d <= max_d`, the term is `q_gd * max_d` for
//! `q_gd >= 0` and `q_gd * min_d` otherwise, and the sum over the group folds into two
//! vectors made once per program: `qpos = sum_g max(q_g, 0)`, `qneg = sum_g min(q_g, 0)`,
//! score `= qpos . max + qneg . min`: two multiply-adds per state value, whatever the
//! group. A NaN in q stays in `qpos` (and so in every score of its row, which the top-k
//! flags).

use super::page::{
    group_query_of, key_offsets, state_offsets, update_len, update_page, update_state_offsets,
};
use super::topk_kernel::{row_extent, top_k_of_row};
use dusk_macros::kernel;

/// Recomputes the min and max of K over the first `lens[i]` token slots of physical page
/// `pages[i]`, for KV head `program_id(1)`. Parameters (the update convention): `k` (f16
/// `[num_pages, page_size, num_kv_heads, D]`), `pages`, `lens` (i32 per entry),
/// `num_pages`, `num_kv_heads`, `page_size`, then the state: `page_min`, `page_max` (f16
/// `[num_pages, num_kv_heads, D]`). Grid: `(entries, num_kv_heads)`. Entries with a page
/// id out of range or a length outside `1..=page_size` are skipped.
#[kernel(crate = "crate::dusk_paths", num_warps = 2)]
#[allow(clippy::too_many_arguments)]
pub fn quest_update<const D: usize, const SLOTS: usize>(
    k: Ptr<f16>,
    pages: Ptr<i32>,
    lens: Ptr<i32>,
    num_pages: i32,
    num_kv_heads: i32,
    page_size: i32,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
) {
    let page = update_page(pages, lens, num_pages, page_size);
    if page >= 0 {
        let len = update_len(lens);
        let mut lo = splat(f32::INFINITY, [D]);
        let mut hi = splat(f32::NEG_INFINITY, [D]);
        for s0 in (0..len).step_by(SLOTS) {
            let slot = s0 + arange(0, SLOTS);
            let ok = expand(slot < len, 1, D);
            let offs = key_offsets::<SLOTS, D>(page, slot, num_kv_heads, page_size);
            let x = load(k + offs, ok) as f32;
            lo = minimum(lo, min(where_(ok, x, f32::INFINITY), 0));
            hi = maximum(hi, max(where_(ok, x, f32::NEG_INFINITY), 0));
        }
        let out = update_state_offsets::<D>(page, num_kv_heads);
        store(page_min + out, lo as f16);
        store(page_max + out, hi as f16);
    }
}

/// Scores `TILES` tiles of `TILE` pages of one row (sequence `b`, KV head `h`,
/// `program_id(0) = b * num_kv_heads + h`), pages `program_id(1) * TILE * TILES ..`, from
/// their min and max. A tile at a time, the next tile's page ids loaded while a tile's state
/// is in flight, so each tile's state loads issue at once instead of behind the chain page
/// id -> state, and the group's query is reduced once for eight tiles. (One tile a program
/// scored at 66% of the copy rate on an H200, 120 registers; this at 88-100%, 96 registers.
/// Bringing the next tile's state into L2 as well lost 5-7 points: NOTES.) Parameters (the
/// score convention): `q` (f16 `[batch, num_kv_heads * G, D]`), `kv_indptr`,
/// `kv_page_indices` (the page table), `scores` (f32, row `(b, h)` at `kv_indptr[b] *
/// num_kv_heads + h * pages_b`), `num_kv_heads`, then the state: `page_min`, `page_max`.
/// Grid: `(batch * num_kv_heads, ceil(longest sequence's pages / (TILE * TILES)))`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn quest_score<
    const D: usize,
    const G: usize,
    const TILE: usize,
    const WARPS: usize,
    const TILES: usize,
>(
    q: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
) {
    score_pages::<D, G, TILE, TILES, 0>(
        q,
        kv_indptr,
        kv_page_indices,
        scores,
        num_kv_heads,
        page_min,
        page_max,
    );
}

/// [`quest_score`]'s work, the row `program_id(ROW_AXIS)` and its pages from `program_id(1
/// - ROW_AXIS) * TILE * TILES`: grid axis 0 the rows in `quest_score`, the tiles in
/// [`quest_select`] (so that a row's programs run together and its last one arrives early).
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
fn score_pages<
    const D: usize,
    const G: usize,
    const TILE: usize,
    const TILES: usize,
    const ROW_AXIS: usize,
>(
    q: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
) {
    let row = program_id(ROW_AXIS);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(kv_indptr + b);
    let n = load(kv_indptr + (b + 1)) - first;
    let p0 = program_id(1 - ROW_AXIS) * (TILE * TILES);
    if p0 < n {
        let end = minimum(n, p0 + TILE * TILES);
        let steps = (end - p0 + (TILE - 1)) / TILE;
        let heads = num_kv_heads as i64;
        let j = p0 + arange(0, TILE);
        let mut page = load(kv_page_indices + (first + j), j < end, 0);
        let qg = group_query_of::<D, G>(q, program_id(ROW_AXIS));
        // `where_` rather than `maximum`: maxnum would drop a NaN of q.
        let neg = qg < 0.0;
        let qpos = expand(sum(where_(neg, 0.0, qg), 0), 0, TILE);
        let qneg = expand(sum(where_(neg, qg, 0.0), 0), 0, TILE);
        let at = (first * num_kv_heads + h * n) as i64;
        for t in 0..steps {
            let j = p0 + t * TILE + arange(0, TILE);
            let valid = j < end;
            let offs = state_offsets::<TILE, D>((page as i64) * heads + (h as i64));
            let mask = expand(valid, 1, D);
            let mx = load(page_max + offs, mask) as f32;
            let mn = load(page_min + offs, mask) as f32;
            // The next tile's page ids, in flight while this tile is scored.
            let jn = j + TILE;
            let valid_n = jn < end;
            let page_n = load(kv_page_indices + (first + jn), valid_n, 0);
            let s = sum(mx * qpos + mn * qneg, 1);
            store(scores + (at + (j as i64)), s, valid);
            page = page_n;
        }
    }
}

/// Quest's whole selection in one launch: [`quest_score`]'s scores on a grid with its axes
/// swapped, `(tiles, batch * num_kv_heads)`, so that a row's programs run together; then the
/// last of a row's programs to arrive runs the shared top-k on the row ([`top_k_of_row`],
/// resident in a tile of `KTILE` on the program's warps) while later rows are still being
/// scored: no second launch, and the top-k overlaps the scoring. Parameters:
/// [`quest_score`]'s, then `arrivals` (i32 `[rows]`, zero before the first launch: each
/// row's last program sets its word back), then
/// [`select_top_k`](super::topk_kernel::select_top_k)'s from `item_indptr` to
/// `flags`, `unit_shift`, `sink` and `recent`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn quest_select<
    const D: usize,
    const G: usize,
    const TILE: usize,
    const WARPS: usize,
    const TILES: usize,
    const KTILE: usize,
>(
    q: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
    arrivals: Ptr<i32>,
    item_indptr: Ptr<i32>,
    k_items: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    sel_indices: Ptr<i32>,
    flags: Ptr<i32>,
    unit_shift: i32,
    sink: i32,
    recent: i32,
) {
    score_pages::<D, G, TILE, TILES, 1>(
        q,
        kv_indptr,
        kv_page_indices,
        scores,
        num_kv_heads,
        page_min,
        page_max,
    );
    let row = program_id(1);
    if arrive(arrivals + row) == num_programs(0) - 1 {
        store(arrivals + row, 0);
        let (n, k, base) = row_extent(row, item_indptr, k_items, num_kv_heads);
        top_k_of_row::<KTILE, true>(
            scores,
            row,
            n,
            k,
            base,
            sel_item_indptr,
            sel_indptr,
            sel_items,
            sel_indices,
            flags,
            unit_shift,
            sink,
            recent,
        );
    }
}
