//! The kept positions written as one CSR list by the search itself: each row finds where
//! its positions start (the budgets of the rows before it) by a decoupled look-back, as
//! single-pass scans do, so no second kernel packs them.
//!
//! Row `r` publishes its budget in its word of `prefix` (an atomic add to a zeroed word)
//! as soon as it knows it, then reads the words of the rows before it, nearest first, a
//! window at a time, summing budgets until it meets a row that has published its inclusive
//! prefix (the sum up to and including it); it then publishes its own inclusive prefix. A
//! row whose word is still empty is waited for (the window is read again): rows are
//! programs launched in order, so the rows a row waits for have started. The last program
//! to finish (counted by an arrival at `prefix[rows]`) sets every word back to zero, so
//! the next launch (or a CUDA graph's replay) starts from zeroes without a memset.

use super::search::Kernel as SearchKernel;
use dusk_compiler::{KernelBuilder, Value};

/// A published word: its budget or prefix in the low bits, and one of these two flags.
const AGGREGATE: i32 = 1 << 29;
const INCLUSIVE: i32 = 1 << 30;

/// The largest budget or prefix a word holds: the plans refuse lists with more candidates.
pub const MAX_TOTAL: usize = (1 << 29) - 1;

/// Rows a look-back step reads at once.
const WINDOW: usize = 128;

/// Look-back steps before a row gives up waiting (its budget is then -1 and it writes
/// nothing): `SPIN^SPIN_LEVELS` reads of a window (160000, a tenth of a second at least),
/// far beyond any wait for rows that run (a row of 32768 candidates searches in well under
/// a millisecond). A row that finds its place at once skips `SPIN - 1` iterations a level
/// (deeper nests make ptxas spill in the kernels holding rows in registers).
const SPIN: i32 = 20;
const SPIN_LEVELS: u32 = 4;

/// Publishes row `row`'s budget `total` in its word (row 0's as its inclusive prefix):
/// as early as the budget is known, since every row after it waits for it.
pub(super) fn publish(b: &mut KernelBuilder, k: &SearchKernel, row: Value, total: Value) {
    let zero = b.i32(0);
    let first = b.eq(row, zero);
    let word = b.add_ptr(k.prefix, row);
    let (agg, inc) = (b.i32(AGGREGATE), b.i32(INCLUSIVE));
    let flag = b.select(first, inc, agg);
    let published = b.or(total, flag);
    b.atomic_add(word, published, None);
}

/// The offset in `sel_indices` of row `row`'s kept positions, once [`publish`] has put out
/// its budget (see the module docs); publishes the row's inclusive prefix. Returns the
/// offset and whether it was found (false only if the wait gave up).
pub(super) fn look_back(b: &mut KernelBuilder, k: &SearchKernel, row: Value) -> (Value, Value) {
    let zero = b.i32(0);
    let first = b.eq(row, zero);
    let word = b.add_ptr(k.prefix, row);
    let (agg, inc) = (b.i32(AGGREGATE), b.i32(INCLUSIVE));
    let init = [row, zero, first];
    let found = spin(b, k, &init, SPIN_LEVELS);
    let (offset, done) = (found[1], found[2]);
    // The inclusive prefix: the budget's word already holds AGGREGATE | total.
    let rest = b.sub(inc, agg);
    let add = b.add(rest, offset);
    let not_first = b.not(first);
    let upgrade = b.and(not_first, done);
    let zero_i = b.i32(0);
    let add = b.select(upgrade, add, zero_i);
    b.atomic_add(word, add, None);
    (offset, done)
}

/// Look-back steps until done, at most `SPIN^levels`: loops nested `levels` deep, each
/// level skipping its body once done, so a row that finds its place at once pays a few
/// skipped iterations, not the bound.
fn spin(b: &mut KernelBuilder, k: &SearchKernel, init: &[Value], levels: u32) -> Vec<Value> {
    let (lo, hi, one) = (b.i32(0), b.i32(SPIN), b.i32(1));
    b.for_range(lo, hi, one, init, |b, _, c| {
        let waiting = b.not(c[2]);
        b.if_else(
            waiting,
            |b| {
                if levels > 1 {
                    spin(b, k, c, levels - 1)
                } else {
                    look_back_step(b, k, c)
                }
            },
            |_| c.to_vec(),
        )
    })
}

/// One read of the window of rows below `c[0]` (carried: window end, offset so far, done).
fn look_back_step(b: &mut KernelBuilder, k: &SearchKernel, c: &[Value]) -> Vec<Value> {
    let (end, offset) = (c[0], c[1]);
    let i = b.arange(0, WINDOW as i64);
    let one = b.i32(1);
    let last = b.sub(end, one);
    let rows = b.sub(last, i);
    let zero = b.i32(0);
    let inside = b.ge(rows, zero);
    let ptrs = b.add_ptr(k.prefix, rows);
    let words = b.load_fresh(ptrs, Some(inside));
    // Rows before the first read as an inclusive prefix of 0.
    let inc = b.i32(INCLUSIVE);
    let words = b.select(inside, words, inc);
    let any = b.i32(AGGREGATE | INCLUSIVE);
    let flags = b.and(words, any);
    let value_mask = b.i32(MAX_TOTAL as i32);
    let values = b.and(words, value_mask);
    let inc_flag = b.and(words, inc);
    let is_inc = b.ne(inc_flag, zero);
    let empty = b.eq(flags, zero);
    let w = b.i32(WINDOW as i32);
    let at_inc = b.select(is_inc, i, w);
    let first_inc = b.min(at_inc, 0);
    let at_empty = b.select(empty, i, w);
    let first_empty = b.min(at_empty, 0);
    // Sum up to the nearest inclusive word, if every word before it is published; the
    // whole window if none is inclusive and none empty; else wait.
    let reach = b.minimum(first_inc, w);
    let counted = b.le(i, reach);
    let upto = b.select(counted, values, zero);
    let sum = b.sum(upto, 0);
    let found = b.lt(first_inc, first_empty);
    let full = b.eq(first_empty, w);
    let no_inc = b.eq(first_inc, w);
    let pass = b.and(full, no_inc);
    let moved = b.or(found, pass);
    let new_offset = b.add(offset, sum);
    let offset = b.select(moved, new_offset, offset);
    let back = b.sub(end, w);
    let end = b.select(pass, back, end);
    if k.backoff_ns > 0 {
        // A word still empty: sleep before reading the window again.
        let wait = b.not(moved);
        b.if_then(wait, |b| b.sleep(k.backoff_ns));
    }
    vec![end, offset, found]
}

/// Writes row `row`'s CSR end and budget (row 0 also the start; -1 for a row whose
/// offset was not found), counts the program's arrival, and the last program to arrive
/// sets every `prefix` word back to zero.
pub(super) fn finish_row(
    b: &mut KernelBuilder,
    k: &SearchKernel,
    row: Value,
    (offset, found): (Value, Value),
    total: Value,
) {
    let one = b.i32(1);
    let next = b.add(row, one);
    let end = b.add(offset, total);
    let p = b.add_ptr(k.sel_indptr, next);
    b.store(p, end);
    let zero = b.i32(0);
    let first = b.eq(row, zero);
    b.if_then(first, |b| {
        let zero = b.i32(0);
        b.store(k.sel_indptr, zero);
    });
    let minus_one = b.i32(-1);
    let budget = b.select(found, total, minus_one);
    let pb = b.add_ptr(k.budget, row);
    b.store(pb, budget);
    let rows = super::search::rows(b, k);
    let counter = b.add_ptr(k.prefix, rows);
    let before = b.arrive(counter);
    let one = b.i32(1);
    let last_one = b.sub(rows, one);
    let last = b.eq(before, last_one);
    b.if_then(last, |b| {
        let zero = b.i32(0);
        let (lo, step) = (b.i32(0), b.i32(WINDOW as i32));
        let rows = super::search::rows(b, k);
        let one = b.i32(1);
        let words = b.add(rows, one);
        b.for_range(lo, words, step, &[], |b, at, _| {
            let i = b.arange(0, WINDOW as i64);
            let idx = b.add(i, at);
            let inside = b.lt(idx, words);
            let p = b.add_ptr(k.prefix, idx);
            let zeros = b.splat(zero, &[WINDOW]);
            b.store_masked(p, zeros, Some(inside));
            vec![]
        });
    });
}

/// [`publish`] then [`look_back`]: the offset of a row whose budget is known at its end.
pub(super) fn row_offset(
    b: &mut KernelBuilder,
    k: &SearchKernel,
    row: Value,
    total: Value,
) -> (Value, Value) {
    publish(b, k, row, total);
    look_back(b, k, row)
}
