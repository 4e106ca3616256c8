//! `append_tokens`: one decode step's cache maintenance in one launch, written in the
//! kernel language. Each program takes `ROWS` (sequence, KV head) rows of the new tokens,
//! finds where each goes ([`super::token`]) and runs the parts ([`super::parts`]) the
//! compile-time flags select, in sequence:
//!
//! 1. `SPARQ`: SparQ's transposed copy of K (a token staged, and a slice of the run
//!    before its own moved into the copy) and running sum of V, first: its reads (the
//!    copy's block table, the slice's staged rows) then wait on no other part's writes;
//! 2. always: K and V into the paged cache, and the touched-page list (sequence `b`'s
//!    page and its valid tokens, or `-1, 0` for a row skipped);
//! 3. `BITS` 4 or 8 (0: none): K quantized into the head-major copy, as `quantize_k`;
//! 4. `QUEST`: Quest's page minimum and maximum;
//! 5. `DS` a label width (0: none): Double Sparsity's labels of the token.
//!
//! Every part's pointers are parameters whatever the flags (the kernel language has a
//! fixed parameter list); a part left out reads and writes none of its own.
//!
//! Parameters: `k_new`, `v_new` (f16 `[batch, num_kv_heads, D]`), the page table after the
//! append (`kv_indptr`, `kv_page_indices`, `kv_last_page_len`), `k_cache`, `v_cache` (f16
//! `[num_pages, page_size, num_kv_heads, D]`), `touched_pages`, `touched_lens` (i32
//! `[batch]`), `batch`, `num_kv_heads`, `page_size`, `num_pages`, `num_indices` (entries of
//! `kv_page_indices`), then the parts' state: `packed`, `scale`, `zero` (the quantized
//! copy), `page_min`, `page_max` (Quest), `channels` (i32 `[num_kv_heads, DS]`), `labels`
//! (Double Sparsity), `blk_indptr`, `blk_indices` (the transposed copy's block table after
//! the append), `num_blk_indices`, `num_blocks`, `block_size`, `k_t`, `k_open`, `v_sum` (SparQ). Grid: `ceil(batch * num_kv_heads / ROWS)`.

use super::parts::{ds_token, quantize_token, quest_token, write_kv};
use super::token::{token_page, token_slot};
use crate::selectors::sparq_kernels::sparq_token;
use dusk_macros::kernel;

#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn append_tokens<
    const D: usize,
    const HALF: usize,
    const ROWS: usize,
    const WARPS: usize,
    const BITS: usize,
    const QUEST: bool,
    const DS: usize,
    const SPARQ: bool,
>(
    k_new: Ptr<f16>,
    v_new: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    k_cache: Ptr<f16>,
    v_cache: Ptr<f16>,
    touched_pages: Ptr<i32>,
    touched_lens: Ptr<i32>,
    batch: i32,
    num_kv_heads: i32,
    page_size: i32,
    num_pages: i32,
    num_indices: i32,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
    page_min: Ptr<f16>,
    page_max: Ptr<f16>,
    channels: Ptr<i32>,
    labels: Ptr<f16>,
    blk_indptr: Ptr<i32>,
    blk_indices: Ptr<i32>,
    num_blk_indices: i32,
    num_blocks: i32,
    block_size: i32,
    k_t: Ptr<f16>,
    k_open: Ptr<f16>,
    v_sum: Ptr<f32>,
) {
    let rows = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = rows < batch * num_kv_heads;
    let b = rows / num_kv_heads;
    let h = rows % num_kv_heads;
    let page = token_page(
        kv_indptr,
        kv_page_indices,
        kv_last_page_len,
        b,
        row_ok,
        page_size,
        num_pages,
        num_indices,
    );
    let slot = token_slot(kv_last_page_len, b, page);
    // SparQ's part first (see above).
    if SPARQ {
        sparq_token::<D, ROWS>(
            k_new,
            v_new,
            rows,
            h,
            page,
            slot,
            num_kv_heads,
            page_size,
            kv_indptr,
            blk_indptr,
            blk_indices,
            num_blk_indices,
            num_blocks,
            block_size,
            k_t,
            k_open,
            v_sum,
        );
    }
    let first_head = row_ok & (h == 0);
    store(touched_pages + b, page, first_head);
    store(touched_lens + b, slot + 1, first_head);
    write_kv::<D, ROWS>(
        k_new,
        v_new,
        rows,
        h,
        page,
        slot,
        num_kv_heads,
        page_size,
        k_cache,
        v_cache,
    );
    if BITS > 0 {
        quantize_token::<D, HALF, ROWS, BITS>(
            k_new,
            rows,
            h,
            page,
            slot,
            num_kv_heads,
            page_size,
            packed,
            scale,
            zero,
        );
    }
    if QUEST {
        quest_token::<D, ROWS>(k_new, rows, h, page, slot, num_kv_heads, page_min, page_max);
    }
    if DS > 0 {
        ds_token::<D, ROWS, DS>(
            k_new,
            rows,
            h,
            page,
            slot,
            num_kv_heads,
            page_size,
            channels,
            labels,
        );
    }
}
