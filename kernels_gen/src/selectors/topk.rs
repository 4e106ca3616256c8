//! The host side of the shared top-k ([`super::topk_kernel`]): budgets, the rows' sizes
//! (known from the page table alone, so every offset is computed once, here), the kernel
//! configurations, and [`TopKPlan`], validated and uploaded once, whose `run` launches one
//! kernel with no allocation and no host sync.

use super::topk_kernel::{select_top_k, select_top_k_radix};
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_compiler::{CompileError, Kernel};
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use std::sync::Arc;

/// How much each sequence keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// At least this many tokens (rounded up to whole items): `Tokens(4096)` keeps 256
    /// pages of 16. A sequence no longer than the budget keeps everything.
    Tokens(usize),
    /// This fraction of each sequence's tokens, rounded up (in `(0, 1]`).
    Fraction(f64),
}

impl Budget {
    pub(crate) fn validate(&self) -> Result<()> {
        match *self {
            Budget::Tokens(t) => ensure!(t >= 1, "budget", "at least 1 token", t),
            Budget::Fraction(f) => ensure!(
                f.is_finite() && f > 0.0 && f <= 1.0,
                "budget",
                "a fraction in (0, 1]",
                f,
            ),
        }
        Ok(())
    }

    /// Tokens a sequence of `seq_len` tokens may keep.
    pub fn tokens(&self, seq_len: usize) -> usize {
        match *self {
            Budget::Tokens(t) => t,
            Budget::Fraction(f) => (f * seq_len as f64).ceil() as usize,
        }
    }
}

/// Items every row keeps whatever their scores: the first `sink` (attention sinks) and the
/// last `recent` (the local window; Quest keeps the last page). They count toward the
/// budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub sink: usize,
    pub recent: usize,
}

/// What a row's scores are over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Items {
    /// One score per page of the sequence (Quest, a centroid): `page_size` tokens an item,
    /// the last page partial. The last page is always kept (`Keep::recent >= 1`).
    Pages,
    /// One score per token (Double Sparsity, SparQ).
    Tokens,
}

/// Items a row of `n` items (`seq_len` tokens, `unit` tokens an item) keeps: the budget in
/// whole items, at least the kept ones, at most all.
pub fn items_to_keep(budget: Budget, keep: Keep, n: usize, seq_len: usize, unit: usize) -> usize {
    let forced = (keep.sink + keep.recent).min(n);
    budget.tokens(seq_len).div_ceil(unit).max(forced).min(n)
}

/// Compile-time choices of the top-k kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopKConfig {
    /// Items a program holds at once (a power of two, 256 to 8192).
    pub tile: usize,
    pub num_warps: u32,
    /// Every row fits one tile and stays in registers; else each pass streams the row.
    pub resident: bool,
    /// Streamed rows: the cut found eight bits a pass in a shared-memory histogram
    /// ([`select_top_k_radix`]) rather than two bits a pass by counting.
    pub radix: bool,
}

/// The longest rows held in registers.
pub const MAX_RESIDENT: usize = 8192;

impl TopKConfig {
    /// The default for rows of up to `max_items`: one resident tile (the next power of two,
    /// at least 256) on 1 warp up to 512 items, 4 warps up to 2048 and 8 beyond (few warps:
    /// each search step's exchange between warps is paid per warp; 1024 or 2048 on 2 warps
    /// spill, as 8192 on 16 does on sm_80); longer rows stream in tiles of 4096 on 8 warps
    /// with the radix select (SparQ's rows of 32k tokens on an H200: 130 us against 205 by
    /// counting at GQA batch 32, 481 against 731 at MHA).
    pub fn for_rows(max_items: usize) -> TopKConfig {
        if max_items <= MAX_RESIDENT {
            let tile = max_items.next_power_of_two().max(256);
            let num_warps = match tile {
                ..=512 => 1,
                1024 | 2048 => 4,
                _ => 8,
            };
            TopKConfig {
                tile,
                num_warps,
                resident: true,
                radix: false,
            }
        } else {
            TopKConfig {
                tile: 4096,
                num_warps: 8,
                resident: false,
                radix: true,
            }
        }
    }
}

type Build = fn() -> std::result::Result<Kernel, CompileError>;

macro_rules! topk_table {
    ($(($t:literal, $w:literal, $r:literal, $x:literal)),* $(,)?) => {
        fn specialisation(cfg: &TopKConfig) -> Option<Build> {
            Some(match (cfg.tile, cfg.num_warps, cfg.resident, cfg.radix) {
                $(($t, $w, $r, false) if !$x => select_top_k::build::<$t, $w, $r> as Build,)*
                $(($t, $w, false, true) if $x => select_top_k_radix::build::<$t, $w> as Build,)*
                _ => return None,
            })
        }

        /// Every configuration this crate holds a top-k kernel for.
        pub fn specialised_configs() -> Vec<TopKConfig> {
            vec![$(TopKConfig { tile: $t, num_warps: $w, resident: $r, radix: $x },)*]
        }
    };
}

topk_table! {
    // The defaults.
    (256, 1, true, false),
    (512, 1, true, false),
    (1024, 4, true, false),
    (2048, 4, true, false),
    (4096, 8, true, false),
    (8192, 8, true, false),
    (4096, 8, false, true),
    // Alternatives for the benchmark: other warps on the common rows, streamed tiles by
    // counting (the default for streamed rows before the radix select; the interpreter's
    // tests stream small ones), the radix select on one warp. (1024 and 2048 on 2 warps
    // spill, and 2048 streamed on 4 on sm_80.)
    (512, 2, true, false),
    (2048, 8, true, false),
    (4096, 16, true, false),
    (256, 1, false, false),
    (1024, 4, false, false),
    (4096, 8, false, false),
    (256, 1, false, true),
}

/// The kernel for `cfg`; an error when the crate holds none ([`specialised_configs`]).
pub fn build(cfg: &TopKConfig) -> std::result::Result<Kernel, CompileError> {
    match specialisation(cfg) {
        Some(b) => b(),
        None => Err(CompileError::Build {
            kernel: "select_top_k".into(),
            op: "build".into(),
            loc: String::new(),
            msg: format!("no specialisation for {cfg:?} (see `specialised_configs`)"),
        }),
    }
}

/// The sizes of a selection, all known from the page table and the budget: items kept per
/// sequence, and the CSR offsets of the kept items and of their tokens per row
/// (`batch * num_kv_heads` rows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectionShape {
    /// Items kept by each sequence.
    pub k_items: Vec<i32>,
    /// Items before each sequence (`kv_indptr` for pages).
    pub item_indptr: Vec<i32>,
    /// Where each row's kept items start (`rows + 1` entries).
    pub sel_item_indptr: Vec<i32>,
    /// Where each row's token positions start (`rows + 1` entries): the `sel_indptr` of
    /// the output token lists.
    pub sel_indptr: Vec<i32>,
}

impl SelectionShape {
    /// Validates `table` against `kv`, `budget` and `keep`, and sizes the selection.
    pub fn new(
        table: &PageTable,
        kv: &KvShape,
        items: Items,
        budget: Budget,
        keep: Keep,
    ) -> Result<SelectionShape> {
        kv.validate()?;
        table.validate(kv)?;
        budget.validate()?;
        let batch = table.batch();
        let ps = kv.page_size;
        if let Some(b) = (0..batch).find(|&b| table.seq_len(b, ps) == 0) {
            return Err(invalid(
                "kv_indptr",
                "sequences of at least one token (an empty one has nothing to select)",
                format!("sequence {b} empty"),
            ));
        }
        if items == Items::Pages {
            ensure!(
                keep.recent >= 1,
                "keep.recent",
                "at least 1 over pages (the last, partial page is always kept)",
                keep.recent,
            );
        }
        let unit = match items {
            Items::Pages => ps,
            Items::Tokens => 1,
        };
        let h = kv.num_kv_heads;
        let (mut item_indptr, mut k_items) = (vec![0i64], vec![]);
        let (mut sel_item_indptr, mut sel_indptr) = (vec![0i64], vec![0i64]);
        for b in 0..batch {
            let len = table.seq_len(b, ps);
            let n = len.div_ceil(unit);
            let k = items_to_keep(budget, keep, n, len, unit);
            // The last item is kept: every kept item is whole but it.
            let tokens = (k - 1) * unit + (len - (n - 1) * unit);
            item_indptr.push(item_indptr[b] + n as i64);
            k_items.push(k as i32);
            for _ in 0..h {
                sel_item_indptr.push(sel_item_indptr.last().unwrap() + k as i64);
                sel_indptr.push(sel_indptr.last().unwrap() + tokens as i64);
            }
        }
        let total_scores = item_indptr[batch] * h as i64;
        ensure!(
            total_scores < i32::MAX as i64 && *sel_indptr.last().unwrap() < i32::MAX as i64,
            "kv_indptr",
            "fewer than 2^31 scores and selected tokens (items x num_kv_heads)",
            total_scores,
        );
        let narrow = |v: Vec<i64>| v.into_iter().map(|x| x as i32).collect();
        Ok(SelectionShape {
            k_items,
            item_indptr: narrow(item_indptr),
            sel_item_indptr: narrow(sel_item_indptr),
            sel_indptr: narrow(sel_indptr),
        })
    }

    pub fn batch(&self) -> usize {
        self.k_items.len()
    }
    /// Rows: `batch * num_kv_heads`.
    pub fn rows(&self) -> usize {
        self.sel_indptr.len() - 1
    }
    /// The most items any row has.
    pub fn max_items(&self) -> usize {
        self.item_indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }
    /// Scores a run reads: items times KV heads.
    pub fn num_scores(&self) -> usize {
        let heads = self.rows() / self.batch().max(1);
        *self.item_indptr.last().unwrap() as usize * heads
    }
}

/// A validated top-k over rows of scores, one row per (sequence, KV head), each keeping
/// its sequence's budget of items and writing ascending CSR token lists.
pub struct TopKPlan {
    kernel: Arc<LoadedKernel>,
    cfg: TopKConfig,
    shape: SelectionShape,
    num_kv_heads: usize,
    unit_shift: u32,
    budget: Budget,
    keep: Keep,
    item_indptr: Buffer<i32>,
    k_items: Buffer<i32>,
    sel_item_indptr: Buffer<i32>,
    sel_indptr: Buffer<i32>,
    sel_items: Buffer<i32>,
    sel_indices: Buffer<i32>,
    flags: Buffer<i32>,
}

impl TopKPlan {
    /// Plans the top-k of `items` of every sequence of `table` (a row per KV head of `kv`),
    /// each keeping `budget` with `keep`'s items always kept, ties toward lower indices.
    pub fn new(
        dusk: &Dusk,
        table: &PageTable,
        kv: KvShape,
        items: Items,
        budget: Budget,
        keep: Keep,
    ) -> Result<TopKPlan> {
        Self::with_config(dusk, table, kv, items, budget, keep, |_| {})
    }

    /// As [`TopKPlan::new`], with `tune` changing the default [`TopKConfig`] (for rows of
    /// the longest sequence) before it is checked and compiled.
    pub fn with_config(
        dusk: &Dusk,
        table: &PageTable,
        kv: KvShape,
        items: Items,
        budget: Budget,
        keep: Keep,
        tune: impl FnOnce(&mut TopKConfig),
    ) -> Result<TopKPlan> {
        let shape = SelectionShape::new(table, &kv, items, budget, keep)?;
        let mut cfg = TopKConfig::for_rows(shape.max_items());
        tune(&mut cfg);
        ensure!(
            specialisation(&cfg).is_some(),
            "config",
            "a top-k configuration compiled into dusk-kernels (see `specialised_configs`)",
            format!("{cfg:?}"),
        );
        ensure!(
            !cfg.resident || shape.max_items() <= cfg.tile,
            "config",
            format!(
                "a streamed configuration or a tile of at least the longest row ({} items)",
                shape.max_items()
            ),
            format!("{cfg:?}"),
        );
        let big = i32::MAX as usize;
        ensure!(
            keep.sink < big && keep.recent < big,
            "keep",
            "counts below 2^31",
            format!("{keep:?}"),
        );
        let unit = match items {
            Items::Pages => kv.page_size,
            Items::Tokens => 1,
        };
        let kernel = dusk.kernel(format!("{cfg:?}"), || build(&cfg))?;
        let dev = dusk.device();
        let total_items = *shape.sel_item_indptr.last().unwrap() as usize;
        let total_tokens = *shape.sel_indptr.last().unwrap() as usize;
        Ok(TopKPlan {
            kernel,
            cfg,
            num_kv_heads: kv.num_kv_heads,
            unit_shift: unit.trailing_zeros(),
            budget,
            keep,
            item_indptr: dev.upload(&shape.item_indptr)?,
            k_items: dev.upload(&shape.k_items)?,
            sel_item_indptr: dev.upload(&shape.sel_item_indptr)?,
            sel_indptr: dev.upload(&shape.sel_indptr)?,
            sel_items: dev.alloc(total_items.max(1))?,
            sel_indices: dev.alloc(total_tokens.max(1))?,
            flags: dev.alloc(shape.rows().max(1))?,
            shape,
        })
    }

    /// Selects from `scores` (f32, row `(b, h)` at `item_indptr[b] * num_kv_heads + h *
    /// n_b`: what a selector's score kernel writes): one launch.
    pub fn run(&mut self, dusk: &Dusk, scores: &Buffer<f32>) -> Result<()> {
        let need = self.shape.num_scores();
        ensure!(
            scores.len() >= need,
            "scores",
            format!("at least {need} f32 scores (items x num_kv_heads)"),
            scores.len(),
        );
        let mut args = vec![Arg::from(scores)];
        args.extend(self.selection_args());
        args.push(Arg::I32(self.num_kv_heads as i32));
        args.extend(self.keep_args());
        dusk.device()
            .launch(&self.kernel, [self.shape.rows() as u32, 1, 1], &args)?;
        Ok(())
    }

    /// The kernel's arguments from `item_indptr` to `flags`: the selection's sizes and
    /// outputs (a fused selector kernel takes them too).
    pub(crate) fn selection_args(&self) -> [Arg<'_>; 7] {
        [
            Arg::from(&self.item_indptr),
            Arg::from(&self.k_items),
            Arg::from(&self.sel_item_indptr),
            Arg::from(&self.sel_indptr),
            Arg::from(&self.sel_items),
            Arg::from(&self.sel_indices),
            Arg::from(&self.flags),
        ]
    }

    /// The kernel's last arguments: `unit_shift`, `sink`, `recent`.
    pub(crate) fn keep_args(&self) -> [Arg<'_>; 3] {
        [
            Arg::I32(self.unit_shift as i32),
            Arg::I32(self.keep.sink as i32),
            Arg::I32(self.keep.recent as i32),
        ]
    }

    /// Fills every output with `byte` (checks poison them first).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let d = dusk.device();
        d.fill_bytes(&mut self.sel_items, byte)?;
        d.fill_bytes(&mut self.sel_indices, byte)?;
        d.fill_bytes(&mut self.flags, byte)?;
        Ok(())
    }

    pub fn config(&self) -> TopKConfig {
        self.cfg
    }
    /// The budget and always-kept items the plan was made with.
    pub fn budget(&self) -> (Budget, Keep) {
        (self.budget, self.keep)
    }
    /// The buffers holding the selection's sizes (`item_indptr`, `k_items`,
    /// `sel_item_indptr`, `sel_indptr`), for a pipeline step that writes them on the device
    /// from a page table there (`pipeline::table`).
    pub(crate) fn size_buffers(&self) -> [&Buffer<i32>; 4] {
        [
            &self.item_indptr,
            &self.k_items,
            &self.sel_item_indptr,
            &self.sel_indptr,
        ]
    }
    /// The selection's sizes (host copies of the offsets on the device).
    pub fn shape(&self) -> &SelectionShape {
        &self.shape
    }
    /// The token lists' row offsets (`rows + 1`; fixed by the plan).
    pub fn sel_indptr(&self) -> &Buffer<i32> {
        &self.sel_indptr
    }
    /// The kept token positions, ascending within each row.
    pub fn sel_indices(&self) -> &Buffer<i32> {
        &self.sel_indices
    }
    /// The kept items' offsets per row (`rows + 1`; fixed by the plan).
    pub fn sel_item_indptr(&self) -> &Buffer<i32> {
        &self.sel_item_indptr
    }
    /// The kept items (pages or tokens, numbered within the sequence), ascending.
    pub fn sel_items(&self) -> &Buffer<i32> {
        &self.sel_items
    }
    /// 1 for a row whose scores held a NaN or an infinity (NaN ranks lowest), else 0.
    pub fn flags(&self) -> &Buffer<i32> {
        &self.flags
    }
}
