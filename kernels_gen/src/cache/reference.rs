//! The append on the host: the oracle of the tests and the GPU check. The quantized copy and
//! Quest's state of the result are what `quantize_k` and `quest_update` make of the cache
//! this writes (their own references: [`crate::reference::quantize`],
//! [`crate::selectors::reference::quest_update`]).

use crate::paged::{KvShape, PageTable};
use half::f16;

/// Writes each sequence's new token (`k_new`, `v_new`: `[batch, num_kv_heads, head_dim]`)
/// into host copies of the cache (`kv`'s engine layout) where `table`, the page table after
/// the append, puts it: the last slot in use of the sequence's last page.
pub fn append_tokens(
    k_cache: &mut [f16],
    v_cache: &mut [f16],
    kv: &KvShape,
    table: &PageTable,
    k_new: &[f16],
    v_new: &[f16],
) {
    let d = kv.head_dim;
    for b in 0..table.batch() {
        let page = table.kv_page_indices[table.kv_indptr[b + 1] as usize - 1] as usize;
        let slot = table.kv_last_page_len[b] as usize - 1;
        for h in 0..kv.num_kv_heads {
            let (src, dst) = ((b * kv.num_kv_heads + h) * d, kv.k_row(page, slot, h) * d);
            k_cache[dst..dst + d].copy_from_slice(&k_new[src..src + d]);
            v_cache[dst..dst + d].copy_from_slice(&v_new[src..src + d]);
        }
    }
}
