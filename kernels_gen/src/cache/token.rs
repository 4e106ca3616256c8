//! Where each sequence's new token goes, written in the kernel language: what every part
//! of the append ([`super::parts`]) is given.
//!
//! The page table is the one after the append (the caller allocated any new page), so the
//! new token of sequence `b` is the last token of its last page: physical page
//! `kv_page_indices[kv_indptr[b + 1] - 1]`, slot `kv_last_page_len[b] - 1`. The table is
//! read on the device and trusted no further than that: an entry that would send a read or
//! a write out of bounds makes the row invalid (page -1), and every part skips it.

use dusk_macros::kernel;

/// The physical page that sequence `b`'s new token goes to, or -1 where `row_ok` is false
/// or the table's entry is unusable: `kv_indptr[b] < 0`, an empty sequence
/// (`kv_indptr[b + 1] <= kv_indptr[b]`), `kv_indptr[b + 1]` past the `num_indices` entries
/// of `kv_page_indices`, a last-page length outside `1..=page_size`, or a page id outside
/// `0..num_pages`. Only `kv_indptr[b]`, `kv_indptr[b + 1]` and `kv_last_page_len[b]` of
/// the rows with `row_ok` are read before these checks (the plan sizes the grid to the
/// batch), and `kv_page_indices` after them.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn token_page(
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    b: Block<i32>,
    row_ok: Block<bool>,
    page_size: i32,
    num_pages: i32,
    num_indices: i32,
) -> Block<i32> {
    let first = load(kv_indptr + b, row_ok, 0);
    let end = load(kv_indptr + (b + 1), row_ok, 0);
    let len = load(kv_last_page_len + b, row_ok, 0);
    let in_table = row_ok & (first >= 0) & (first < end) & (end <= num_indices);
    let ok = in_table & (len >= 1) & (len <= page_size);
    let page = load(kv_page_indices + (end - 1), ok, -1);
    where_(ok & (page >= 0) & (page < num_pages), page, -1)
}

/// The slot of sequence `b`'s new token in its page: `kv_last_page_len[b] - 1` (meaningful
/// where [`token_page`] gave a page; -1 elsewhere).
#[kernel(crate = "crate::dusk_paths")]
pub fn token_slot(kv_last_page_len: Ptr<i32>, b: Block<i32>, page: Block<i32>) -> Block<i32> {
    let valid = page >= 0;
    load(kv_last_page_len + b, valid, 0) - 1
}
