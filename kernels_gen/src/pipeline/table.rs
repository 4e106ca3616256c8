//! A step on a page table the device writes (DESIGN.md sections 7 and 10: "lists have a
//! fixed capacity and a device-side length"). A plan made by
//! [`super::Pipeline::plan_device`] is sized for maxima (batch, tokens a sequence, the
//! budget at that length); each step's first launch, [`step_table`], reads the caller's
//! table (an engine converter's output, [`crate::engines::CsrPages`]), clamps it into the
//! plan's capacities and writes it, with the sizes that follow from it (each sequence's
//! budget in pages and tokens, each row's offsets, which rows are dense), into the buffers
//! the sub-plans read. Every later launch of the step then reads a table the plan could
//! have checked on the host: the sub-plans are the host-table ones, unchanged.

use crate::engines::CsrPages;
use crate::error::{ensure, Result};
use crate::ops::Dusk;
use crate::paged::KvShape;
use crate::selectors::topk::items_to_keep;
use crate::selectors::{Budget, Items, Keep};
use dusk_macros::kernel;
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use std::sync::Arc;

/// Sequences (and pages) a program handles at once, on one warp: the launch is a chain of
/// dependent loads (the table, then the budget's tables), so small programs do it soonest.
const BLOCK: usize = 256;

/// The page count of sequences `b` in the caller's table, its offsets clamped into
/// `0..=cap` (the page list's length) and non-decreasing.
#[kernel(crate = "crate::dusk_paths")]
fn clamped_span(kv_indptr: Ptr<i32>, b: Block<i32>, m: Block<bool>, cap: i32) -> Block<i32> {
    let lo = minimum(maximum(load(kv_indptr + b, m, 0), 0), cap);
    let hi = minimum(maximum(load(kv_indptr + (b + 1), m, 0), lo), cap);
    hi - lo
}

/// The tokens of sequences `b` of `span` pages, cut to `max_pages`: the last page's length
/// clamped into `1..=page_size` (a full page when the sequence was cut), 0 without pages.
#[kernel(crate = "crate::dusk_paths")]
fn clamped_len(
    kv_last_page_len: Ptr<i32>,
    b: Block<i32>,
    m: Block<bool>,
    span: Block<i32>,
    max_pages: i32,
    page_size: i32,
) -> Block<i32> {
    let n = minimum(span, max_pages);
    let given = minimum(maximum(load(kv_last_page_len + b, m, 0), 1), page_size);
    let last = where_(span > max_pages, page_size, given);
    where_(n > 0, (n - 1) * page_size + last, 0)
}

/// Program `r` (row `r = b * num_kv_heads + h` of the lists) writes, from the caller's
/// table (`kv_indptr`, `kv_page_indices` of `page_cap` entries, `kv_last_page_len`):
/// - its row's offsets: the selection's kept pages (`sel_item_indptr`) and tokens (`sel_*`,
///   the top-k's and the candidates' copies), each sequence keeping `keep_items[len]` pages
///   and `keep_tokens[len]` tokens (tables the host fills for every length up to the
///   plan's most, `max_pages * page_size`); `dense_len[r]`, the length of a row of at most
///   `dense_below` tokens, else -1;
/// - for `h == 0`, its sequence's clamped table (`t_indptr_*`, `t_last`), the tokens before
///   it (`t_tokens_*`: a token selector's offsets) and `k_items[b]`; its share of the
///   sequence's page ids (`t_pages_*`, clamped into `0..num_pages`);
/// - with `write_all` (a pipeline without a selector, whose candidates are every token),
///   its row's token positions `0..len` at its offset in `all_tokens`.
///
/// Offsets are sums over the sequences before `b` (each program sums them itself: no
/// second launch), so every entry written lies inside the plan's buffers, whatever the
/// caller's table holds.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn step_table<const BLOCK: usize>(
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    keep_items: Ptr<i32>,
    keep_tokens: Ptr<i32>,
    t_indptr_a: Ptr<i32>,
    t_indptr_b: Ptr<i32>,
    t_indptr_c: Ptr<i32>,
    t_indptr_d: Ptr<i32>,
    t_tokens_a: Ptr<i32>,
    t_tokens_b: Ptr<i32>,
    t_pages_a: Ptr<i32>,
    t_pages_b: Ptr<i32>,
    t_pages_c: Ptr<i32>,
    t_last: Ptr<i32>,
    k_items: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    sel_a: Ptr<i32>,
    sel_b: Ptr<i32>,
    sel_c: Ptr<i32>,
    sel_d: Ptr<i32>,
    dense_len: Ptr<i32>,
    all_tokens: Ptr<i32>,
    write_all: i32,
    page_cap: i32,
    num_kv_heads: i32,
    page_size: i32,
    max_pages: i32,
    num_pages: i32,
    dense_below: i32,
) {
    let r = program_id(0);
    let b = r / num_kv_heads;
    let h = r % num_kv_heads;
    // The sequences before this one: their pages, kept pages and kept tokens.
    let mut pages = 0;
    let mut lens = 0;
    let mut items = 0;
    let mut tokens = 0;
    for i0 in (0..b).step_by(BLOCK) {
        let i = i0 + arange(0, BLOCK);
        let m = i < b;
        let span = clamped_span(kv_indptr, i, m, page_cap);
        let n = minimum(span, max_pages);
        let len = clamped_len(kv_last_page_len, i, m, span, max_pages, page_size);
        let k = load(keep_items + len, m, 0);
        let t = load(keep_tokens + len, m, 0);
        pages += sum(where_(m, n, 0), 0);
        lens += sum(where_(m, len, 0), 0);
        items += sum(where_(m, k, 0), 0);
        tokens += sum(where_(m, t, 0), 0);
    }
    // This sequence.
    let lo = minimum(maximum(load(kv_indptr + b), 0), page_cap);
    let hi = minimum(maximum(load(kv_indptr + (b + 1)), lo), page_cap);
    let n = minimum(hi - lo, max_pages);
    let given = minimum(maximum(load(kv_last_page_len + b), 1), page_size);
    let last = where_(hi - lo > max_pages, page_size, given);
    let len = where_(n > 0, (n - 1) * page_size + last, 0);
    let k = load(keep_items + len);
    let t = load(keep_tokens + len);
    if r == 0 {
        store(sel_item_indptr, 0);
        store(sel_a, 0);
        store(sel_b, 0);
        store(sel_c, 0);
        store(sel_d, 0);
        store(t_indptr_a, 0);
        store(t_indptr_b, 0);
        store(t_indptr_c, 0);
        store(t_indptr_d, 0);
        store(t_tokens_a, 0);
        store(t_tokens_b, 0);
    }
    store(
        sel_item_indptr + (r + 1),
        items * num_kv_heads + (h + 1) * k,
    );
    let end = tokens * num_kv_heads + (h + 1) * t;
    store(sel_a + (r + 1), end);
    store(sel_b + (r + 1), end);
    store(sel_c + (r + 1), end);
    store(sel_d + (r + 1), end);
    store(dense_len + r, where_(len <= dense_below, len, -1));
    if write_all != 0 {
        let start = tokens * num_kv_heads + h * t;
        for c in (0..t).step_by(BLOCK) {
            let j = c + arange(0, BLOCK);
            store(all_tokens + (start + j), j, j < t);
        }
    }
    if h == 0 {
        store(t_indptr_a + (b + 1), pages + n);
        store(t_indptr_b + (b + 1), pages + n);
        store(t_indptr_c + (b + 1), pages + n);
        store(t_indptr_d + (b + 1), pages + n);
        store(t_tokens_a + (b + 1), lens + len);
        store(t_tokens_b + (b + 1), lens + len);
        store(t_last + b, where_(n > 0, last, 0));
        store(k_items + b, k);
    }
    // The pages, in blocks dealt out over the sequence's programs (block `c * num_kv_heads
    // + h` to program `h`).
    let blocks = (n + (BLOCK - 1)) / BLOCK;
    let rounds = (blocks + (num_kv_heads - 1)) / num_kv_heads;
    for c in 0..rounds {
        let j = (c * num_kv_heads + h) * BLOCK + arange(0, BLOCK);
        let m = j < n;
        let p = load(kv_page_indices + (lo + j), m, 0);
        let p = minimum(maximum(p, 0), num_pages - 1);
        store(t_pages_a + (pages + j), p, m);
        store(t_pages_b + (pages + j), p, m);
        store(t_pages_c + (pages + j), p, m);
    }
}

/// Where a step's sizes go: the buffers of the sub-plans that read a table or a selection's
/// offsets. Absent readers get stand-ins of the same size (the kernel takes every pointer).
pub(crate) struct TableTargets<'a> {
    /// `batch + 1` page offsets (up to four readers).
    pub indptr: [&'a Buffer<i32>; 4],
    /// `batch + 1` token offsets (a token selector's top-k and score kernel).
    pub token_indptr: [&'a Buffer<i32>; 2],
    /// The page ids (up to three readers), at least `batch * max_pages` each.
    pub pages: [&'a Buffer<i32>; 3],
    /// `batch` last-page lengths.
    pub last: &'a Buffer<i32>,
    /// `batch` kept pages.
    pub k_items: &'a Buffer<i32>,
    /// `rows + 1` offsets of the kept pages.
    pub sel_item_indptr: &'a Buffer<i32>,
    /// `rows + 1` offsets of the kept tokens (up to four readers).
    pub sel: [&'a Buffer<i32>; 4],
    /// `rows` dense lengths (-1: pruned).
    pub dense_len: &'a Buffer<i32>,
    /// Every row's token positions, for a pipeline whose candidates are every token (at
    /// least `batch * num_kv_heads * max_pages * page_size` entries); `None` writes none.
    pub all_tokens: Option<&'a Buffer<i32>>,
}

/// The sizing launch of a device-table step: its kernel, the budget's tables and the
/// plan's capacities.
pub(crate) struct StepTable {
    kernel: Arc<LoadedKernel>,
    keep_items: Buffer<i32>,
    keep_tokens: Buffer<i32>,
    kv: KvShape,
    batch: usize,
    max_pages: usize,
    dense_below: usize,
}

impl StepTable {
    /// For `batch` sequences of at most `max_pages` pages of `kv`, each keeping what
    /// `budget` and `keep` give for its length, in `items` (pages, or tokens).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dusk: &Dusk,
        kv: KvShape,
        items: Items,
        batch: usize,
        max_pages: usize,
        budget: Budget,
        keep: Keep,
        dense_below: usize,
    ) -> Result<StepTable> {
        let ps = kv.page_size;
        let most = max_pages * ps;
        ensure!(
            batch * kv.num_kv_heads * most < i32::MAX as usize,
            "max_tokens",
            "fewer than 2^31 tokens over every (sequence, KV head) row",
            most,
        );
        let (mut kept, mut tokens) = (vec![0i32], vec![0i32]);
        for len in 1..=most {
            let (k, t) = match items {
                Items::Pages => {
                    let n = len.div_ceil(ps);
                    let k = items_to_keep(budget, keep, n, len, ps);
                    (k, (k - 1) * ps + (len - (n - 1) * ps))
                }
                Items::Tokens => {
                    let k = items_to_keep(budget, keep, len, len, 1);
                    (k, k)
                }
            };
            kept.push(k as i32);
            tokens.push(t as i32);
        }
        let dev = dusk.device();
        Ok(StepTable {
            kernel: dusk.kernel(format!("step_table {BLOCK}"), || {
                step_table::build::<BLOCK>()
            })?,
            keep_items: dev.upload(&kept)?,
            keep_tokens: dev.upload(&tokens)?,
            kv,
            batch,
            max_pages,
            dense_below: dense_below.min(i32::MAX as usize),
        })
    }

    /// Checks `table`'s buffer lengths against the plan's batch (its contents are read on
    /// the device only).
    pub(crate) fn check(&self, table: &CsrPages) -> Result<()> {
        let b = self.batch;
        ensure!(
            table.kv_indptr.len() == b + 1,
            "kv_indptr",
            format!("{} entries (the plan's batch + 1)", b + 1),
            table.kv_indptr.len(),
        );
        ensure!(
            table.kv_last_page_len.len() >= b,
            "kv_last_page_len",
            format!("at least {b} entries (the plan's batch)"),
            table.kv_last_page_len.len(),
        );
        ensure!(
            !table.kv_page_indices.is_empty(),
            "kv_page_indices",
            "at least 1 entry",
            0,
        );
        Ok(())
    }

    /// Writes the clamped `table` and its sizes into `to`: one launch.
    pub(crate) fn run(&self, dusk: &Dusk, table: &CsrPages, to: TableTargets<'_>) -> Result<()> {
        self.check(table)?;
        let cap = table.kv_page_indices.len().min(i32::MAX as usize) as i32;
        let mut args = vec![
            Arg::from(&table.kv_indptr),
            Arg::from(&table.kv_page_indices),
            Arg::from(&table.kv_last_page_len),
            Arg::from(&self.keep_items),
            Arg::from(&self.keep_tokens),
        ];
        args.extend(to.indptr.iter().map(|b| Arg::from(*b)));
        args.extend(to.token_indptr.iter().map(|b| Arg::from(*b)));
        args.extend(to.pages.iter().map(|b| Arg::from(*b)));
        args.extend([
            Arg::from(to.last),
            Arg::from(to.k_items),
            Arg::from(to.sel_item_indptr),
        ]);
        args.extend(to.sel.iter().map(|b| Arg::from(*b)));
        args.extend([
            Arg::from(to.dense_len),
            Arg::from(to.all_tokens.unwrap_or(to.dense_len)),
            Arg::I32(to.all_tokens.is_some() as i32),
            Arg::I32(cap),
            Arg::I32(self.kv.num_kv_heads as i32),
            Arg::I32(self.kv.page_size as i32),
            Arg::I32(self.max_pages as i32),
            Arg::I32(self.kv.num_pages as i32),
            Arg::I32(self.dense_below as i32),
        ]);
        let rows = self.batch * self.kv.num_kv_heads;
        dusk.device()
            .launch(&self.kernel, [rows as u32, 1, 1], &args)?;
        Ok(())
    }
}
