//! Dense fallback inside a batch: sequences no longer than the pipeline's `dense_below`
//! skip the pruners and attend to every token. The pruners run over the whole batch (their
//! rows are fixed by the plan); this kernel then writes attention's lists, each row either
//! the last pruner's kept tokens or, for a short sequence, all of its positions. Planned
//! only when a batch mixes both kinds: otherwise the last pruner writes attention's lists
//! itself, or the whole step is dense attention.

use crate::error::Result;
use crate::ops::Dusk;
use dusk_macros::kernel;
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use std::sync::Arc;

/// Rows (and positions) a program handles at once.
const BLOCK: usize = 1024;

/// The clamped start and length of row(s) `i` of the pruner's lists: offsets outside
/// `0..=cap` are clamped into it, so a bad offset reads and writes inside the buffers.
#[kernel(crate = "crate::dusk_paths")]
fn pruned_len(indptr: Ptr<i32>, i: Block<i32>, m: Block<bool>, cap: i32) -> Block<i32> {
    let lo = minimum(maximum(load(indptr + i, m, 0), 0), cap);
    let hi = minimum(maximum(load(indptr + (i + 1), m, 0), lo), cap);
    hi - lo
}

/// Program `r` writes row `r` of attention's lists: its offset is the sum of the lengths
/// of the rows before it (each `dense_len[i]` when that is at least 0, else the pruned
/// row's), its entries `0..dense_len[r]` or the pruned row's positions. `pruned_cap` and
/// `sel_cap` are the two index buffers' lengths; nothing is read or written past them.
#[kernel(crate = "crate::dusk_paths", num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn dense_fallback_lists<const BLOCK: usize>(
    pruned_indptr: Ptr<i32>,
    pruned_indices: Ptr<i32>,
    dense_len: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_indices: Ptr<i32>,
    pruned_cap: i32,
    sel_cap: i32,
) {
    let r = program_id(0);
    let mut offset = 0;
    for i0 in (0..r).step_by(BLOCK) {
        let i = i0 + arange(0, BLOCK);
        let m = i < r;
        let d = load(dense_len + i, m, 0);
        let p = pruned_len(pruned_indptr, i, m, pruned_cap);
        offset = offset + sum(where_(m, where_(d >= 0, d, p), 0), 0);
    }
    let d = load(dense_len + r);
    let lo = minimum(maximum(load(pruned_indptr + r), 0), pruned_cap);
    let hi = minimum(maximum(load(pruned_indptr + (r + 1)), lo), pruned_cap);
    let mut len = hi - lo;
    if d >= 0 {
        len = d;
    }
    if r == 0 {
        store(sel_indptr, 0);
    }
    store(sel_indptr + (r + 1), offset + len);
    for j0 in (0..len).step_by(BLOCK) {
        let j = j0 + arange(0, BLOCK);
        let at = offset + j;
        let m = (j < len) & (at < sel_cap);
        let kept = load(pruned_indices + (lo + j), m & (d < 0), 0);
        store(sel_indices + at, where_(d >= 0, j, kept), m);
    }
}

/// The fallback's kernel and the host-known lengths of the dense rows.
pub(crate) struct Fallback {
    kernel: Arc<LoadedKernel>,
    /// Per list row: the sequence's length if it is attended densely, else -1.
    dense_len: Buffer<i32>,
    rows: usize,
}

impl Fallback {
    pub(crate) fn new(dusk: &Dusk, dense_len: &[i32]) -> Result<Fallback> {
        Ok(Fallback {
            kernel: dusk.kernel(format!("dense_fallback_lists {BLOCK}"), || {
                dense_fallback_lists::build::<BLOCK>()
            })?,
            dense_len: dusk.device().upload(dense_len)?,
            rows: dense_len.len(),
        })
    }

    /// The rows' dense lengths, for a step that writes them on the device from a page
    /// table there (`super::table`).
    pub(crate) fn dense_len(&self) -> &Buffer<i32> {
        &self.dense_len
    }

    /// Writes attention's lists (`sel_indptr`, `sel_indices`) from the pruner's.
    pub(crate) fn run(
        &self,
        dusk: &Dusk,
        pruned_indptr: &Buffer<i32>,
        pruned_indices: &Buffer<i32>,
        sel_indptr: &Buffer<i32>,
        sel_indices: &Buffer<i32>,
    ) -> Result<()> {
        let cap = |b: &Buffer<i32>| b.len().min(i32::MAX as usize) as i32;
        let args = [
            Arg::from(pruned_indptr),
            Arg::from(pruned_indices),
            Arg::from(&self.dense_len),
            Arg::from(sel_indptr),
            Arg::from(sel_indices),
            Arg::I32(cap(pruned_indices)),
            Arg::I32(cap(sel_indices)),
        ];
        dusk.device()
            .launch(&self.kernel, [self.rows as u32, 1, 1], &args)?;
        Ok(())
    }
}
