//! Addressing helpers for page-level selectors, written in the kernel language: what a
//! selector's update and score kernels share, so that one of a user's own (a per-page
//! centroid, say) holds only its own arithmetic. Call them from a `#[kernel]` by path
//! (`dusk::kernels::selectors::page::group_query::<D, G>(q, row)`).
//!
//! The conventions ([`crate::selectors::Selector`] has the parameter lists):
//! - A score program is `(row, tile)`: `row = batch * num_kv_heads + kv_head` (one
//!   selection row), `tile` a run of `TILE` pages of that sequence.
//! - An update program is `(i, kv_head)`: entry `i` of the page list being updated.
//! - State per page and KV head is `[num_pages, num_kv_heads, width]`: the state row of
//!   physical page `p` for head `h` is `p * num_kv_heads + h`.
//! - Scores of row `(b, h)` are contiguous: page `j` of sequence `b` (of `n` pages) at
//!   `kv_indptr[b] * num_kv_heads + h * n + j`.

use dusk_macros::kernel;

/// Pages in the sequence of this program's row (`program_id(0)`).
#[kernel(crate = "crate::dusk_paths")]
pub fn seq_pages(kv_indptr: Ptr<i32>, num_kv_heads: i32) -> i32 {
    let b = program_id(0) / num_kv_heads;
    load(kv_indptr + (b + 1)) - load(kv_indptr + b)
}

/// The page numbers (within the sequence) of this program's tile: `program_id(1) * TILE`
/// on.
#[kernel(crate = "crate::dusk_paths")]
pub fn tile_pages<const TILE: usize>() -> Block<i32> {
    program_id(1) * TILE + arange(0, TILE)
}

/// The state rows (`page * num_kv_heads + head`, i64) of pages `j` of this program's row,
/// through the page table; masked-off pages get row 0 and read nothing.
#[kernel(crate = "crate::dusk_paths")]
pub fn page_state_rows(
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    num_kv_heads: i32,
    j: Block<i32>,
    valid: Block<bool>,
) -> Block<i64> {
    let row = program_id(0);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(kv_indptr + b);
    let zero = 0i32;
    let page = load(kv_page_indices + (first + j), valid, zero);
    let heads = num_kv_heads as i64;
    (page as i64) * heads + (h as i64)
}

/// The `[TILE, W]` element offsets of `W` values a state row: row `rows[t]`, column `c`
/// at `rows[t] * W + c`.
#[kernel(crate = "crate::dusk_paths")]
pub fn state_offsets<const TILE: usize, const W: usize>(rows: Block<i64>) -> Block<i64> {
    let cols = arange(0, W) as i64;
    expand(rows * W, 1, W) + expand(cols, 0, TILE)
}

/// The query rows of this program's GQA group, f32 `[G, D]`: query heads `h * G ..
/// h * G + G` of sequence `b` (row `row = b * num_kv_heads + h`), from q
/// `[batch, num_kv_heads * G, D]`.
#[kernel(crate = "crate::dusk_paths")]
pub fn group_query<const D: usize, const G: usize>(q: Ptr<f16>) -> Block<f32> {
    group_query_of::<D, G>(q, program_id(0))
}

/// [`group_query`] for row `row` (a program whose row is not `program_id(0)`).
#[kernel(crate = "crate::dusk_paths")]
pub fn group_query_of<const D: usize, const G: usize>(q: Ptr<f16>, row: i32) -> Block<f32> {
    let rows = (row * G + arange(0, G)) as i64;
    let dims = arange(0, D) as i64;
    let offs = expand(rows * D, 1, D) + expand(dims, 0, G);
    load(q + offs) as f32
}

/// Stores the scores `s` of pages `j` of this program's row (where `valid`).
#[kernel(crate = "crate::dusk_paths")]
pub fn store_page_scores(
    scores: Ptr<f32>,
    kv_indptr: Ptr<i32>,
    num_kv_heads: i32,
    j: Block<i32>,
    valid: Block<bool>,
    s: Block<f32>,
) {
    let row = program_id(0);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(kv_indptr + b);
    let n = load(kv_indptr + (b + 1)) - first;
    let at = (first * num_kv_heads + h * n + j) as i64;
    store(scores + at, s, valid);
}

/// The physical page an update program (`program_id(0)` = entry `i`) recomputes, or -1
/// when the entry is not one to act on: a page id outside `0..num_pages` or a length
/// outside `1..=page_size` (device-written lists are not checked on the host; such
/// entries are skipped, so nothing is read or written out of bounds).
#[kernel(crate = "crate::dusk_paths")]
pub fn update_page(pages: Ptr<i32>, lens: Ptr<i32>, num_pages: i32, page_size: i32) -> i32 {
    let i = program_id(0);
    let page = load(pages + i);
    let len = load(lens + i);
    let ok = (page >= 0) & (page < num_pages) & (len >= 1) & (len <= page_size);
    where_(ok, page, -1)
}

/// The valid token count of an update program's page (`lens[program_id(0)]`).
#[kernel(crate = "crate::dusk_paths")]
pub fn update_len(lens: Ptr<i32>) -> i32 {
    load(lens + program_id(0))
}

/// The `[SLOTS, D]` element offsets in the K cache (`[num_pages, page_size,
/// num_kv_heads, D]`) of token slots `slot` of physical page `page` for KV head
/// `program_id(1)`.
#[kernel(crate = "crate::dusk_paths")]
pub fn key_offsets<const SLOTS: usize, const D: usize>(
    page: i32,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_size: i32,
) -> Block<i64> {
    let head = program_id(1);
    let heads = num_kv_heads as i64;
    let rows = ((page * page_size + slot) as i64) * heads + (head as i64);
    let dims = arange(0, D) as i64;
    expand(rows * D, 1, D) + expand(dims, 0, SLOTS)
}

/// The `D` element offsets of the state row of physical page `page` for KV head
/// `program_id(1)` (an update program's output).
#[kernel(crate = "crate::dusk_paths")]
pub fn update_state_offsets<const D: usize>(page: i32, num_kv_heads: i32) -> Block<i64> {
    let row = (page as i64) * (num_kv_heads as i64) + (program_id(1) as i64);
    row * D + (arange(0, D) as i64)
}
