//! The selector API (DESIGN.md section 10): a [`Selector`] declares its state per (page, KV
//! head) and names two kernels, an update run at append for the pages a step wrote and a
//! score run every step (one score per page and KV head, GQA folded in); the shared top-k
//! then keeps each sequence's budget of pages as CSR token lists. Quest
//! ([`super::quest::QUEST`]) is written with it, and so can a user's selector, with no edit
//! to dusk.
//!
//! - [`SelectorState`]: the state's buffers (one per declared [`StateArray`]) and the
//!   compiled update kernel; independent of any page table (it is per physical page), so
//!   it outlives the plans of successive steps.
//! - [`PageUpdates`]: which pages to recompute, and how many valid tokens each holds.
//! - [`SelectorPlan`]: a page table, a budget and a query shape, validated and uploaded
//!   once; `select` (score, then top-k) allocates nothing and never syncs.

use super::topk::{Budget, Items, Keep, SelectionShape, TopKConfig, TopKPlan};
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_compiler::{CompileError, DType, Elem, Kernel};
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use half::f16;
use std::sync::Arc;

/// Builds one kernel (a `#[kernel]`'s `build::<..>` with its constants chosen).
pub type Build = fn() -> std::result::Result<Kernel, CompileError>;

/// The element type of a state array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateType {
    F16,
    F32,
}

/// Values a state array holds per (page, KV head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// `head_dim` values (a vector in K's space: Quest's min and max, a centroid).
    HeadDim,
    /// A fixed number of values.
    Values(usize),
}

/// One array of a selector's state: `[num_pages, num_kv_heads, width]` of `dtype`, passed
/// to both kernels, in the order declared, after their fixed parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateArray {
    pub name: &'static str,
    pub dtype: StateType,
    pub width: Width,
}

impl StateArray {
    /// `head_dim` f16 values per (page, KV head).
    pub const fn f16_per_page(name: &'static str) -> StateArray {
        StateArray {
            name,
            dtype: StateType::F16,
            width: Width::HeadDim,
        }
    }

    fn width(&self, kv: &KvShape) -> usize {
        match self.width {
            Width::HeadDim => kv.head_dim,
            Width::Values(n) => n,
        }
    }
}

/// A page-level token selector: its state and its two kernels.
///
/// The update kernel's parameters: `k: Ptr<f16>` (the cache, `[num_pages, page_size,
/// num_kv_heads, head_dim]`), `pages: Ptr<i32>`, `lens: Ptr<i32>` (the entries of a
/// [`PageUpdates`]), `num_pages: i32`, `num_kv_heads: i32`, `page_size: i32`, then one
/// pointer per state array. Grid: `(entries, num_kv_heads)`: program `(i, h)` recomputes
/// the state of page `pages[i]` for KV head `h` from its first `lens[i]` tokens
/// ([`super::page::update_page`] gives the page, or -1 for an entry to skip).
///
/// The score kernel's parameters: `q: Ptr<f16>` (`[batch, num_q_heads, head_dim]`),
/// `kv_indptr: Ptr<i32>`, `kv_page_indices: Ptr<i32>`, `scores: Ptr<f32>`,
/// `num_kv_heads: i32`, then one pointer per state array. Grid: `(batch * num_kv_heads,
/// ceil(longest sequence's pages / pages_per_program))`: program `(row, t)` scores pages
/// `t * pages_per_program ..` of its row ([`super::page`] has the addressing helpers).
#[derive(Clone, Copy)]
pub struct Selector {
    pub name: &'static str,
    pub state: &'static [StateArray],
    /// The update kernel for a cache of this shape (`None`: not built for it).
    pub update: fn(&KvShape) -> Option<Build>,
    /// The score kernel for a cache of this shape and a GQA group of this many query heads
    /// per KV head (`None`: not built for them).
    pub score: fn(&KvShape, usize) -> Option<ScoreKernel>,
    /// Optionally, the score kernel with the shared top-k fused in, for the top-k's
    /// configuration (`None`: not built for them; the plan then launches the two). Its
    /// parameters: the score kernel's, then `arrivals: Ptr<i32>` (a word a row, zero
    /// between launches), then the top-k's from `item_indptr` to `flags`, `unit_shift`,
    /// `sink`, `recent`; grid `(tiles, rows)`, the score's axes swapped; the last of a row's
    /// programs to arrive runs the row's top-k (Quest's `quest_select`). A plan uses it where
    /// it is built (checked when the plan is made), unless [`SelectorPlan::fuse`] turns it
    /// off.
    pub fused: Option<FusedBuild>,
}

/// A selector's fused score and top-k for a cache shape, a group and a top-k
/// configuration ([`Selector::fused`]).
pub type FusedBuild = fn(&KvShape, usize, &TopKConfig) -> Option<ScoreKernel>;

/// A score kernel and the pages each of its programs covers (its `TILE`).
#[derive(Clone, Copy)]
pub struct ScoreKernel {
    pub build: Build,
    pub pages_per_program: usize,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("name", &self.name)
            .field("state", &self.state)
            .finish()
    }
}

/// The key a selector's kernel is loaded under: its build function, which alone makes it
/// (so two selectors of one name, or one selector's walks, never share a kernel).
fn build_key(build: Build) -> String {
    format!("selector kernel {:p}", build as *const ())
}

/// The fixed leading parameters of an update and a score kernel.
const UPDATE_PARAMS: &[(&str, Elem)] = &[
    ("k", Elem::Ptr(DType::F16)),
    ("pages", Elem::Ptr(DType::I32)),
    ("lens", Elem::Ptr(DType::I32)),
    ("num_pages", Elem::Num(DType::I32)),
    ("num_kv_heads", Elem::Num(DType::I32)),
    ("page_size", Elem::Num(DType::I32)),
];
const SCORE_PARAMS: &[(&str, Elem)] = &[
    ("q", Elem::Ptr(DType::F16)),
    ("kv_indptr", Elem::Ptr(DType::I32)),
    ("kv_page_indices", Elem::Ptr(DType::I32)),
    ("scores", Elem::Ptr(DType::F32)),
    ("num_kv_heads", Elem::Num(DType::I32)),
];

/// The parameters a fused score and top-k takes after the score kernel's
/// ([`Selector::fused`]).
const FUSED_PARAMS: &[(&str, Elem)] = &[
    ("arrivals", Elem::Ptr(DType::I32)),
    ("item_indptr", Elem::Ptr(DType::I32)),
    ("k_items", Elem::Ptr(DType::I32)),
    ("sel_item_indptr", Elem::Ptr(DType::I32)),
    ("sel_indptr", Elem::Ptr(DType::I32)),
    ("sel_items", Elem::Ptr(DType::I32)),
    ("sel_indices", Elem::Ptr(DType::I32)),
    ("flags", Elem::Ptr(DType::I32)),
    ("unit_shift", Elem::Num(DType::I32)),
    ("sink", Elem::Num(DType::I32)),
    ("recent", Elem::Num(DType::I32)),
];

/// Checks that `kernel` takes `fixed`, one pointer per state array, then `tail`, typed as
/// declared.
fn check_params(
    selector: &Selector,
    which: &str,
    kernel: &Kernel,
    fixed: &[(&str, Elem)],
    tail: &[(&str, Elem)],
) -> Result<()> {
    let mut want: Vec<(String, Elem)> = fixed.iter().map(|(n, e)| (n.to_string(), *e)).collect();
    for a in selector.state {
        let d = match a.dtype {
            StateType::F16 => DType::F16,
            StateType::F32 => DType::F32,
        };
        want.push((a.name.to_string(), Elem::Ptr(d)));
    }
    want.extend(tail.iter().map(|(n, e)| (n.to_string(), *e)));
    let show = |e: &Elem| match e {
        Elem::Ptr(d) | Elem::SharedPtr(d) => format!("Ptr<{}>", d.lang_name()),
        Elem::Num(d) => d.lang_name().to_string(),
    };
    let got: Vec<Elem> = kernel.params.iter().map(|p| p.ty.elem).collect();
    let ok = got.len() == want.len()
        && kernel.params.iter().all(|p| p.ty.is_scalar())
        && got.iter().zip(&want).all(|(g, (_, w))| g == w);
    ensure!(
        ok,
        "selector",
        format!(
            "a {which} kernel of selector `{}` taking ({})",
            selector.name,
            want.iter()
                .map(|(n, e)| format!("{n}: {}", show(e)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!(
            "`{}` taking ({})",
            kernel.name,
            kernel
                .params
                .iter()
                .map(|p| format!("{}: {}", p.name, show(&p.ty.elem)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    Ok(())
}

/// A state array on the device.
pub enum StateBuffer {
    F16(Buffer<f16>),
    F32(Buffer<f32>),
}

impl StateBuffer {
    fn arg(&self) -> Arg<'_> {
        match self {
            StateBuffer::F16(b) => Arg::from(b),
            StateBuffer::F32(b) => Arg::from(b),
        }
    }
}

/// A selector's state for a cache of one shape, and its compiled update kernel.
pub struct SelectorState {
    selector: Selector,
    kv: KvShape,
    arrays: Vec<StateBuffer>,
    update: Arc<LoadedKernel>,
}

impl SelectorState {
    /// Allocates `selector`'s state for a cache of shape `kv` (zeroed: pages are scored
    /// from it only once updated) and compiles its update kernel.
    pub fn new(dusk: &Dusk, selector: &Selector, kv: KvShape) -> Result<SelectorState> {
        kv.validate()?;
        let build = (selector.update)(&kv).ok_or_else(|| {
            invalid(
                "head_dim",
                format!(
                    "a head_dim and page_size (here {}) that selector `{}` has an update \
                     kernel for",
                    kv.page_size, selector.name
                ),
                kv.head_dim,
            )
        })?;
        let update = dusk.kernel(build_key(build), build)?;
        check_params(selector, "update", update.ir(), UPDATE_PARAMS, &[])?;
        let dev = dusk.device();
        let mut arrays = vec![];
        for a in selector.state {
            let len = kv.num_pages * kv.num_kv_heads * a.width(&kv);
            ensure!(
                len > 0 && len < (1usize << 40),
                "selector",
                format!("state array `{}` of 1 to 2^40 values", a.name),
                len,
            );
            arrays.push(match a.dtype {
                StateType::F16 => {
                    let mut b = dev.alloc::<f16>(len)?;
                    dev.fill_bytes(&mut b, 0)?;
                    StateBuffer::F16(b)
                }
                StateType::F32 => {
                    let mut b = dev.alloc::<f32>(len)?;
                    dev.fill_bytes(&mut b, 0)?;
                    StateBuffer::F32(b)
                }
            });
        }
        Ok(SelectorState {
            selector: *selector,
            kv,
            arrays,
            update,
        })
    }

    /// Recomputes the state of `updates`' pages from `k` (f16, the cache of this state's
    /// shape): one launch, no allocation, no sync.
    pub fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()> {
        let kv = self.kv;
        ensure!(
            k.len() == kv.elements(),
            "k",
            format!("{} f16 values ({kv:?})", kv.elements()),
            k.len(),
        );
        let mut args = vec![
            Arg::from(k),
            Arg::from(&updates.pages),
            Arg::from(&updates.lens),
            Arg::I32(kv.num_pages as i32),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.page_size as i32),
        ];
        args.extend(self.arrays.iter().map(StateBuffer::arg));
        let grid = [updates.count as u32, kv.num_kv_heads as u32, 1];
        dusk.device().launch(&self.update, grid, &args)?;
        Ok(())
    }

    pub fn selector(&self) -> &Selector {
        &self.selector
    }
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    /// The state arrays, in the order the selector declares them.
    pub fn arrays(&self) -> &[StateBuffer] {
        &self.arrays
    }
    /// The f16 state array named `name`.
    pub fn f16(&self, name: &str) -> Option<&Buffer<f16>> {
        let i = self.selector.state.iter().position(|a| a.name == name)?;
        match &self.arrays[i] {
            StateBuffer::F16(b) => Some(b),
            StateBuffer::F32(_) => None,
        }
    }
    /// The f16 state array named `name`, to write (e.g. state computed elsewhere).
    pub fn f16_mut(&mut self, name: &str) -> Option<&mut Buffer<f16>> {
        let i = self.selector.state.iter().position(|a| a.name == name)?;
        match &mut self.arrays[i] {
            StateBuffer::F16(b) => Some(b),
            StateBuffer::F32(_) => None,
        }
    }
    /// The f32 state array named `name`.
    pub fn f32(&self, name: &str) -> Option<&Buffer<f32>> {
        let i = self.selector.state.iter().position(|a| a.name == name)?;
        match &self.arrays[i] {
            StateBuffer::F32(b) => Some(b),
            StateBuffer::F16(_) => None,
        }
    }
}

/// Pages whose state to recompute, each with its valid tokens (`page_size` for a full page,
/// fewer for a sequence's last), on the device.
pub struct PageUpdates {
    pages: Buffer<i32>,
    lens: Buffer<i32>,
    count: usize,
}

impl PageUpdates {
    /// The entries `(pages[i], lens[i])`, checked: page ids in range, distinct, lengths in
    /// `1..=page_size`.
    pub fn new(dusk: &Dusk, kv: &KvShape, pages: &[i32], lens: &[i32]) -> Result<PageUpdates> {
        kv.validate()?;
        ensure!(
            pages.len() == lens.len(),
            "lens",
            format!("{} lengths, one per page", pages.len()),
            lens.len(),
        );
        if let Some(p) = pages
            .iter()
            .find(|p| **p < 0 || **p as usize >= kv.num_pages)
        {
            return Err(invalid(
                "pages",
                format!("page ids in 0..{}", kv.num_pages),
                p,
            ));
        }
        let mut seen = vec![false; kv.num_pages];
        for p in pages {
            ensure!(!seen[*p as usize], "pages", "distinct page ids", p);
            seen[*p as usize] = true;
        }
        if let Some(l) = lens.iter().find(|l| **l < 1 || **l as usize > kv.page_size) {
            return Err(invalid(
                "lens",
                format!("valid token counts in 1..={}", kv.page_size),
                l,
            ));
        }
        ensure!(
            pages.len() < i32::MAX as usize,
            "pages",
            "fewer than 2^31 entries",
            pages.len(),
        );
        let dev = dusk.device();
        Ok(PageUpdates {
            pages: dev.upload(&nonempty(pages))?,
            lens: dev.upload(&nonempty(lens))?,
            count: pages.len(),
        })
    }

    /// Every page of `table` (a prefill, or state built from scratch).
    pub fn all(dusk: &Dusk, kv: &KvShape, table: &PageTable) -> Result<PageUpdates> {
        table.validate(kv)?;
        let (pages, lens) = table_pages(table, kv.page_size, false);
        Self::new(dusk, kv, &pages, &lens)
    }

    /// The last page of each sequence of `table`: what a decode step appending one token
    /// per sequence wrote.
    pub fn last_pages(dusk: &Dusk, kv: &KvShape, table: &PageTable) -> Result<PageUpdates> {
        table.validate(kv)?;
        let (pages, lens) = table_pages(table, kv.page_size, true);
        Self::new(dusk, kv, &pages, &lens)
    }

    /// Entries written on the device (by an append kernel): `pages` and `lens` of equal
    /// length. Their contents are not read on the host; the update skips an entry whose
    /// page id is out of range or whose length is outside `1..=page_size`, so bad entries
    /// give stale state, never a bad memory access. Two entries of one page race.
    pub fn from_device(pages: Buffer<i32>, lens: Buffer<i32>) -> Result<PageUpdates> {
        ensure!(
            pages.len() == lens.len(),
            "lens",
            format!("{} lengths, one per page", pages.len()),
            lens.len(),
        );
        ensure!(
            pages.len() < i32::MAX as usize,
            "pages",
            "fewer than 2^31 entries",
            pages.len(),
        );
        let count = pages.len();
        Ok(PageUpdates { pages, lens, count })
    }

    /// The entries' page ids, on the device.
    pub fn pages(&self) -> &Buffer<i32> {
        &self.pages
    }
    /// The entries' valid token counts, on the device.
    pub fn lens(&self) -> &Buffer<i32> {
        &self.lens
    }
    /// Entries.
    pub fn len(&self) -> usize {
        self.count
    }
    /// Both, to write (by the kernel that makes the list, e.g. the cache append).
    pub(crate) fn buffers_mut(&mut self) -> (&mut Buffer<i32>, &mut Buffer<i32>) {
        (&mut self.pages, &mut self.lens)
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The pages of `table` with their valid tokens (a page shared by several sequences once,
/// with its longest use), or only each sequence's last page.
pub fn table_pages(table: &PageTable, page_size: usize, last_only: bool) -> (Vec<i32>, Vec<i32>) {
    let mut lens: std::collections::BTreeMap<i32, i32> = Default::default();
    for b in 0..table.batch() {
        let (lo, hi) = (table.kv_indptr[b] as usize, table.kv_indptr[b + 1] as usize);
        for i in lo..hi {
            if last_only && i + 1 < hi {
                continue;
            }
            let len = if i + 1 == hi {
                table.kv_last_page_len[b]
            } else {
                page_size as i32
            };
            let e = lens.entry(table.kv_page_indices[i]).or_insert(0);
            *e = (*e).max(len);
        }
    }
    lens.into_iter().unzip()
}

/// A selection planned over one page table: the selector's score kernel and the shared
/// top-k, sized and uploaded once.
pub struct SelectorPlan {
    state: SelectorState,
    score: Arc<LoadedKernel>,
    pages_per_program: usize,
    topk: TopKPlan,
    batch: usize,
    num_q_heads: usize,
    kv_indptr: Buffer<i32>,
    kv_page_indices: Buffer<i32>,
    scores: Buffer<f32>,
    score_grid: [u32; 3],
    fused: Option<FusedSelect>,
}

/// The selector's fused score and top-k, in use ([`SelectorPlan::fuse`]).
struct FusedSelect {
    kernel: Arc<LoadedKernel>,
    /// A word a row: the programs of the row that have scored their pages.
    arrivals: Buffer<i32>,
}

impl SelectorPlan {
    /// Plans selecting, for every sequence of `table` and each KV head, `budget` of its
    /// pages by the scores of `state`'s selector for `num_q_heads` query heads (the top
    /// pages; `keep`'s always kept, `keep.recent >= 1`).
    pub fn new(
        dusk: &Dusk,
        state: SelectorState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        keep: Keep,
    ) -> Result<SelectorPlan> {
        Self::with_config(dusk, state, num_q_heads, table, budget, keep, |_| {})
    }

    /// As [`SelectorPlan::new`], with `tune` changing the top-k's [`TopKConfig`].
    #[allow(clippy::too_many_arguments)]
    pub fn with_config(
        dusk: &Dusk,
        state: SelectorState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        keep: Keep,
        tune: impl FnOnce(&mut TopKConfig),
    ) -> Result<SelectorPlan> {
        let kv = state.kv;
        let selector = state.selector;
        ensure!(
            num_q_heads > 0 && num_q_heads.is_multiple_of(kv.num_kv_heads),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({})", kv.num_kv_heads),
            num_q_heads,
        );
        let group = num_q_heads / kv.num_kv_heads;
        let topk = TopKPlan::with_config(dusk, table, kv, Items::Pages, budget, keep, tune)?;
        let ScoreKernel {
            build,
            pages_per_program,
        } = (selector.score)(&kv, group).ok_or_else(|| {
            invalid(
                "num_q_heads",
                format!(
                    "a GQA group that selector `{}` has a score kernel for (head_dim {}, \
                     page_size {})",
                    selector.name, kv.head_dim, kv.page_size
                ),
                format!("{num_q_heads} query heads: a group of {group}"),
            )
        })?;
        let score = dusk.kernel(build_key(build), build)?;
        check_params(&selector, "score", score.ir(), SCORE_PARAMS, &[])?;
        let ppp = pages_per_program.max(1);
        let tiles = topk.shape().max_items().div_ceil(ppp).max(1);
        ensure!(
            tiles <= 65535,
            "kv_indptr",
            format!("at most {} pages a sequence", 65535 * ppp),
            topk.shape().max_items(),
        );
        let dev = dusk.device();
        let scores = dev.alloc(topk.shape().num_scores().max(1))?;
        let mut plan = SelectorPlan {
            score,
            pages_per_program,
            batch: table.batch(),
            num_q_heads,
            kv_indptr: dev.upload(&table.kv_indptr)?,
            kv_page_indices: dev.upload(&nonempty(&table.kv_page_indices))?,
            scores,
            score_grid: [topk.shape().rows() as u32, tiles as u32, 1],
            topk,
            state,
            fused: None,
        };
        // One launch where the selector has it: on an H100, 2-3.4% faster than the two at
        // three of four shapes and a tie at the fourth (benches/NOTES.md).
        plan.fuse(dusk, true)?;
        Ok(plan)
    }

    /// With `on` (a new plan's default), selects with the selector's fused score and top-k
    /// ([`Selector::fused`]) in one launch, when it has one for this plan (compiled now);
    /// returns whether `select` now runs it. With `on` false, `select` launches the score
    /// and the top-k.
    pub fn fuse(&mut self, dusk: &Dusk, on: bool) -> Result<bool> {
        self.fused = None;
        if !on {
            return Ok(false);
        }
        let kv = self.state.kv;
        let group = self.num_q_heads / kv.num_kv_heads;
        let cfg = self.topk.config();
        let [rows, ..] = self.score_grid;
        let fused = self.state.selector.fused.and_then(|f| f(&kv, group, &cfg));
        // The rows are the fused grid's second axis: at most 65535.
        let Some(f) = fused.filter(|_| rows <= 65535) else {
            return Ok(false);
        };
        ensure!(
            f.pages_per_program == self.pages_per_program,
            "selector",
            format!(
                "a fused kernel of selector `{}` scoring {} pages a program, as its score \
                 kernel does",
                self.state.selector.name, self.pages_per_program
            ),
            f.pages_per_program,
        );
        let kernel = dusk.kernel(build_key(f.build), f.build)?;
        let selector = self.state.selector;
        check_params(&selector, "fused", kernel.ir(), SCORE_PARAMS, FUSED_PARAMS)?;
        let dev = dusk.device();
        let mut arrivals = dev.alloc::<i32>(self.topk.shape().rows().max(1))?;
        dev.fill_bytes(&mut arrivals, 0)?;
        self.fused = Some(FusedSelect { kernel, arrivals });
        Ok(true)
    }

    /// Recomputes the state of `updates`' pages from `k` (see [`SelectorState::update`]).
    pub fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()> {
        self.state.update(dusk, k, updates)
    }

    /// Scores every page of every row for `q` (f16 `[batch, num_q_heads, head_dim]`) into
    /// [`SelectorPlan::scores`]: one launch.
    pub fn score(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        let args = self.score_args(q)?;
        dusk.device().launch(&self.score, self.score_grid, &args)?;
        Ok(())
    }

    /// The score kernel's arguments, `q` checked.
    fn score_args<'a>(&'a self, q: &'a Buffer<f16>) -> Result<Vec<Arg<'a>>> {
        let qlen = self.batch * self.num_q_heads * self.state.kv.head_dim;
        ensure!(
            q.len() == qlen,
            "q",
            format!("{qlen} f16 values (batch x num_q_heads x head_dim)"),
            q.len(),
        );
        let mut args = vec![
            Arg::from(q),
            Arg::from(&self.kv_indptr),
            Arg::from(&self.kv_page_indices),
            Arg::from(&self.scores),
            Arg::I32(self.state.kv.num_kv_heads as i32),
        ];
        args.extend(self.state.arrays.iter().map(StateBuffer::arg));
        Ok(args)
    }

    /// The top-k of the last scores, as token lists: one launch.
    pub fn top_k(&mut self, dusk: &Dusk) -> Result<()> {
        self.topk.run(dusk, &self.scores)
    }

    /// Whether `select` runs the fused score and top-k ([`SelectorPlan::fuse`]).
    pub fn is_fused(&self) -> bool {
        self.fused.is_some()
    }

    /// Scores and selects: one launch when [`SelectorPlan::fuse`]d, else two; no allocation,
    /// no sync.
    pub fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        let Some(f) = &self.fused else {
            self.score(dusk, q)?;
            return self.top_k(dusk);
        };
        let mut args = self.score_args(q)?;
        args.push(Arg::from(&f.arrivals));
        args.extend(self.topk.selection_args());
        args.extend(self.topk.keep_args());
        let [rows, tiles, _] = self.score_grid;
        dusk.device().launch(&f.kernel, [tiles, rows, 1], &args)?;
        Ok(())
    }

    /// Fills the scores and every output with `byte` (checks poison them first).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        dusk.device().fill_bytes(&mut self.scores, byte)?;
        self.topk.poison_outputs(dusk, byte)
    }

    pub fn state(&self) -> &SelectorState {
        &self.state
    }
    pub fn state_mut(&mut self) -> &mut SelectorState {
        &mut self.state
    }
    /// The state, for the plan of the next page table.
    pub fn into_state(self) -> SelectorState {
        self.state
    }
    /// The shared top-k (its configuration, sizes and outputs).
    pub fn top_k_plan(&self) -> &TopKPlan {
        &self.topk
    }
    /// The page table the score kernel reads (`kv_indptr`, `kv_page_indices`), for a
    /// pipeline step that rewrites it on the device (`pipeline::table`).
    pub(crate) fn table_buffers(&self) -> (&Buffer<i32>, &Buffer<i32>) {
        (&self.kv_indptr, &self.kv_page_indices)
    }
    /// The selection's sizes, known at plan time (host copies).
    pub fn shape(&self) -> &SelectionShape {
        self.topk.shape()
    }
    /// Page scores: row `(b, h)` at `kv_indptr[b] * num_kv_heads + h * pages_b`.
    pub fn scores(&self) -> &Buffer<f32> {
        &self.scores
    }
    /// Token lists' row offsets (`batch * num_kv_heads + 1`, fixed by the plan).
    pub fn sel_indptr(&self) -> &Buffer<i32> {
        self.topk.sel_indptr()
    }
    /// Kept token positions, ascending in each row.
    pub fn sel_indices(&self) -> &Buffer<i32> {
        self.topk.sel_indices()
    }
    /// Kept pages' row offsets (fixed by the plan).
    pub fn sel_page_indptr(&self) -> &Buffer<i32> {
        self.topk.sel_item_indptr()
    }
    /// Kept pages (numbered within the sequence), ascending in each row.
    pub fn sel_pages(&self) -> &Buffer<i32> {
        self.topk.sel_items()
    }
    /// 1 for a row whose scores held a NaN or an infinity (a NaN in q), else 0.
    pub fn flags(&self) -> &Buffer<i32> {
        self.topk.flags()
    }
}

/// A device buffer needs at least one element.
fn nonempty(v: &[i32]) -> Vec<i32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}
