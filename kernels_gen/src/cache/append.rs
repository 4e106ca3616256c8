//! [`AppendPlan`]: one decode step's cache maintenance, validated once, run in one launch
//! ([`super::append_kernel::append_tokens`]) with no allocation and no host sync, so a
//! captured CUDA graph can hold it.
//!
//! ```
//! use dusk_kernels::cache::{AppendParts, AppendPlan, AppendTargets};
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::paged::{KvShape, PageTable};
//! use dusk_kernels::selectors::{PageUpdates, SelectorState, QUEST};
//! use dusk_runtime::Device;
//! use half::f16;
//!
//! # fn main() -> Result<(), dusk_kernels::DuskError> {
//! let dusk = Dusk::new(Device::best())?;
//! let dev = dusk.device();
//! let kv = KvShape { num_pages: 8, page_size: 16, num_kv_heads: 2, head_dim: 64 };
//! let (mut k, mut v) = (dev.alloc::<f16>(kv.elements())?, dev.alloc::<f16>(kv.elements())?);
//! let mut int4 = dusk.quantize_k(&k, kv, 4)?;
//! let mut quest = SelectorState::new(&dusk, &QUEST, kv)?;
//!
//! let parts = AppendParts { quantized: Some(4), quest: true, ..AppendParts::default() };
//! let plan = AppendPlan::new(&dusk, kv, 2, parts)?; // 2 sequences, one new token each
//! // The table after the append: sequence 0 now holds 17 tokens (a new page, 5, for its
//! // 17th), sequence 1 holds 3.
//! let table = plan.upload_table(&dusk, &PageTable::from_lengths(&[17, 3], 16, vec![0, 5, 2])?)?;
//! let k_new = dev.upload(&vec![f16::from_f32(0.5); 2 * 2 * 64])?; // [batch, kv heads, head_dim]
//! let v_new = dev.upload(&vec![f16::from_f32(-1.0); 2 * 2 * 64])?;
//! let targets = AppendTargets {
//!     k_cache: &mut k, v_cache: &mut v, quantized: Some(&mut int4), quest: Some(&mut quest),
//!     ds: None, sparq: None,
//! };
//! plan.run(&dusk, &table, &k_new, &v_new, targets)?;
//! // K of sequence 0's new token: page 5, slot 0, KV head 1.
//! let at = kv.k_row(5, 0, 1) * 64;
//! assert_eq!(k.download()?[at], f16::from_f32(0.5));
//! // Page 5's Quest state now holds that token alone; the touched pages are 5 and 2.
//! assert_eq!(quest.f16("page_max").unwrap().download()?[5 * 2 * 64], f16::from_f32(0.5));
//! assert_eq!(plan.touched().pages().download()?, [5, 2]);
//! # Ok(()) }
//! ```

use super::append_kernel::append_tokens;
use crate::engines::CsrPages;
use crate::error::{ensure, invalid, Result};
use crate::ops::{Dusk, QuantizedK};
use crate::paged::{KvShape, PageTable};
use crate::selectors::ds::LABEL_WIDTHS;
use crate::selectors::{Build, DsState, PageUpdates, SelectorState, SparqState, QUEST};
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use half::f16;
use std::sync::Arc;

/// What an append writes beside the f16 cache (a compile-time choice: one kernel each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AppendParts {
    /// The bits of the quantized copy of K to write the new tokens into (4 or 8, as
    /// [`Dusk::quantize_k`]), or `None` for no quantized copy.
    pub quantized: Option<u32>,
    /// Quest's page minimum and maximum ([`QUEST`]'s state).
    pub quest: bool,
    /// Double Sparsity's labels ([`DsState`]), of this label width `r` (8, 16 or 32).
    pub ds: Option<usize>,
    /// SparQ's transposed copy of K and sum of V ([`SparqState`]).
    pub sparq: bool,
}

impl AppendParts {
    /// The selector whose state the parts keep, if any (one at most: a kernel each).
    fn selector(&self) -> Result<Selector> {
        let chosen = [self.quest, self.ds.is_some(), self.sparq];
        ensure!(
            chosen.iter().filter(|&&c| c).count() <= 1,
            "parts",
            "at most one selector's state (quest, ds or sparq): a serving stack runs one",
            format!("{self:?}"),
        );
        Ok(match (self.quest, self.ds, self.sparq) {
            (true, _, _) => Selector::Quest,
            (_, Some(r), _) => Selector::Ds(r),
            (_, _, true) => Selector::Sparq,
            _ => Selector::None,
        })
    }
}

/// The selector part of a kernel: one compile-time choice.
#[derive(Clone, Copy)]
enum Selector {
    None,
    Quest,
    Ds(usize),
    Sparq,
}

/// How the append kernel tiles its work (compile-time; one kernel each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppendConfig {
    /// (sequence, KV head) rows a program appends.
    pub rows_per_program: usize,
    pub num_warps: usize,
}

impl Default for AppendConfig {
    /// One row on one warp (at head_dim 128, 4 values of each of K and V a thread): the
    /// step is a chain of dependent loads (the table, the page, Quest's state), so many
    /// small programs hide it best. On the H100 at 32k, batch 32 and 64, GQA 32/8 and MHA
    /// 32/32, it was the fastest of `specialised_configs` in three cases of four and within
    /// 2% in the fourth, and 2 to 9% faster than 4 rows a program in all four
    /// (`benches/results/append_run/append.json`, `sweep`).
    fn default() -> Self {
        AppendConfig {
            rows_per_program: 1,
            num_warps: 1,
        }
    }
}

/// The configurations compiled into dusk-kernels: the default for every head_dim, and for
/// head_dim 128 the alternatives `gpu-check selectors` times.
pub fn specialised_configs() -> Vec<AppendConfig> {
    [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 4)]
        .iter()
        .map(|&(rows_per_program, num_warps)| AppendConfig {
            rows_per_program,
            num_warps,
        })
        .collect()
}

/// The kernel of one (head_dim, rows, warps, selector part) for `bits` (0: no quantized
/// copy).
fn with_bits<
    const D: usize,
    const HALF: usize,
    const ROWS: usize,
    const WARPS: usize,
    const QUEST: bool,
    const DS: usize,
    const SPARQ: bool,
>(
    bits: u32,
) -> Option<Build> {
    Some(match bits {
        0 => append_tokens::build::<D, HALF, ROWS, WARPS, 0, QUEST, DS, SPARQ> as Build,
        4 => append_tokens::build::<D, HALF, ROWS, WARPS, 4, QUEST, DS, SPARQ>,
        8 => append_tokens::build::<D, HALF, ROWS, WARPS, 8, QUEST, DS, SPARQ>,
        _ => return None,
    })
}

/// The kernel of one (head_dim, rows, warps) for `bits` and `selector`; with `all_selectors`
/// false, for no selector or Quest only (the configurations only the benchmark sweeps).
fn with_parts<const D: usize, const HALF: usize, const ROWS: usize, const WARPS: usize>(
    bits: u32,
    selector: Selector,
    all_selectors: bool,
) -> Option<Build> {
    match selector {
        Selector::None => with_bits::<D, HALF, ROWS, WARPS, false, 0, false>(bits),
        Selector::Quest => with_bits::<D, HALF, ROWS, WARPS, true, 0, false>(bits),
        _ if !all_selectors => None,
        Selector::Ds(8) => with_bits::<D, HALF, ROWS, WARPS, false, 8, false>(bits),
        Selector::Ds(16) => with_bits::<D, HALF, ROWS, WARPS, false, 16, false>(bits),
        Selector::Ds(32) => with_bits::<D, HALF, ROWS, WARPS, false, 32, false>(bits),
        Selector::Ds(_) => None,
        Selector::Sparq => with_bits::<D, HALF, ROWS, WARPS, false, 0, true>(bits),
    }
}

/// The append kernel for `head_dim`, `parts` and `cfg`, if compiled in: every part
/// combination with at most one selector for the default configuration; Quest's or none
/// for the others.
pub fn kernel_for(head_dim: usize, parts: &AppendParts, cfg: &AppendConfig) -> Option<Build> {
    let bits = parts.quantized.unwrap_or(0);
    let sel = parts.selector().ok()?;
    match (head_dim, cfg.rows_per_program, cfg.num_warps) {
        (64, 1, 1) => with_parts::<64, 32, 1, 1>(bits, sel, true),
        (128, 1, 1) => with_parts::<128, 64, 1, 1>(bits, sel, true),
        (128, 2, 1) => with_parts::<128, 64, 2, 1>(bits, sel, false),
        (128, 4, 1) => with_parts::<128, 64, 4, 1>(bits, sel, false),
        (128, 8, 1) => with_parts::<128, 64, 8, 1>(bits, sel, false),
        (128, 8, 2) => with_parts::<128, 64, 8, 2>(bits, sel, false),
        (128, 16, 4) => with_parts::<128, 64, 16, 4>(bits, sel, false),
        (256, 1, 1) => with_parts::<256, 128, 1, 1>(bits, sel, true),
        _ => None,
    }
}

/// Where one step's append writes: the paged cache and the parts' state. Each part's state
/// is given exactly when the plan's [`AppendParts`] name it.
pub struct AppendTargets<'a> {
    /// f16 `[num_pages, page_size, num_kv_heads, head_dim]`.
    pub k_cache: &'a mut Buffer<f16>,
    pub v_cache: &'a mut Buffer<f16>,
    /// The quantized copy of K ([`Dusk::quantize_k`]), of the plan's shape and bits.
    pub quantized: Option<&'a mut QuantizedK>,
    /// Quest's state ([`SelectorState`] of [`QUEST`]) of the plan's shape.
    pub quest: Option<&'a mut SelectorState>,
    /// Double Sparsity's state of the plan's shape and label width.
    pub ds: Option<&'a mut DsState>,
    /// SparQ's state of the plan's shape, for at least `batch` sequences (row `b` of its
    /// sum of V is sequence `b`'s), and its copy's block table after the append (`batch`
    /// sequences; the cache's own page table where the copy is paged as the cache).
    pub sparq: Option<(&'a mut SparqState, &'a CsrPages)>,
}

/// One decode step's append for a batch of `batch` sequences, one new token each: K and V
/// into the paged cache, and the state [`AppendParts`] names, in one launch.
pub struct AppendPlan {
    kernel: Arc<LoadedKernel>,
    kv: KvShape,
    batch: usize,
    parts: AppendParts,
    config: AppendConfig,
    touched: PageUpdates,
    /// Passed for the state of the parts left out (the kernel takes every part's
    /// pointers, and reads or writes none of a part it was built without).
    unused_u8: Buffer<u8>,
    unused_f16: Buffer<f16>,
    unused_i32: Buffer<i32>,
    unused_f32: Buffer<f32>,
    grid: [u32; 3],
}

impl AppendPlan {
    /// Plans appending one token to each of `batch` sequences of a cache of shape `kv`,
    /// with `parts`.
    pub fn new(dusk: &Dusk, kv: KvShape, batch: usize, parts: AppendParts) -> Result<AppendPlan> {
        Self::with_config(dusk, kv, batch, parts, |_| {})
    }

    /// As [`AppendPlan::new`], with `tune` changing the default [`AppendConfig`].
    pub fn with_config(
        dusk: &Dusk,
        kv: KvShape,
        batch: usize,
        parts: AppendParts,
        tune: impl FnOnce(&mut AppendConfig),
    ) -> Result<AppendPlan> {
        kv.validate()?;
        ensure!(batch > 0, "batch", "at least 1", batch);
        ensure!(
            batch * kv.num_kv_heads < i32::MAX as usize,
            "batch",
            format!(
                "fewer than 2^31 (sequence, KV head) rows with {} KV heads",
                kv.num_kv_heads
            ),
            batch,
        );
        ensure!(
            kv.num_pages <= i32::MAX as usize,
            "num_pages",
            "at most 2^31 - 1 (page ids are i32)",
            kv.num_pages,
        );
        if let Some(bits) = parts.quantized {
            ensure!(matches!(bits, 4 | 8), "quantized", "4 or 8 bits", bits);
        }
        if let Some(r) = parts.ds {
            ensure!(
                LABEL_WIDTHS.contains(&r),
                "ds",
                format!("a label width dusk has kernels for ({LABEL_WIDTHS:?})"),
                r,
            );
        }
        parts.selector()?;
        let mut config = AppendConfig::default();
        tune(&mut config);
        let build = kernel_for(kv.head_dim, &parts, &config).ok_or_else(|| {
            invalid(
                "config",
                format!(
                    "a configuration compiled for head_dim {} (the default, or for head_dim \
                     128 one of `specialised_configs`)",
                    kv.head_dim
                ),
                format!("{config:?}"),
            )
        })?;
        let key = format!("append {} {parts:?} {config:?}", kv.head_dim);
        let kernel = dusk.kernel(key, build)?;
        let dev = dusk.device();
        let touched = PageUpdates::from_device(dev.alloc(batch)?, dev.alloc(batch)?)?;
        let grid = (batch * kv.num_kv_heads).div_ceil(config.rows_per_program);
        Ok(AppendPlan {
            kernel,
            kv,
            batch,
            parts,
            config,
            touched,
            unused_u8: dev.alloc(1)?,
            unused_f16: dev.alloc(1)?,
            unused_i32: dev.alloc(1)?,
            unused_f32: dev.alloc(1)?,
            grid: [grid as u32, 1, 1],
        })
    }

    /// Checks `table`, the page table after the append, and uploads it: `batch`
    /// sequences, each with at least one page (its new token is the last token of its last
    /// page), page ids in range, every last page of a sequence its own (two appends to one
    /// page would race), and room for the new token (`kv_last_page_len` at most
    /// `page_size`: a sequence whose last page was full needs a new page in this table).
    pub fn upload_table(&self, dusk: &Dusk, table: &PageTable) -> Result<CsrPages> {
        let (kv, batch) = (&self.kv, self.batch);
        ensure!(
            table.batch() == batch,
            "kv_indptr",
            format!("{} entries (the plan's batch + 1)", batch + 1),
            table.kv_indptr.len(),
        );
        if let Some(b) = (0..batch.min(table.kv_last_page_len.len()))
            .find(|&b| table.kv_last_page_len[b] as usize > kv.page_size)
        {
            return Err(invalid(
                "kv_last_page_len",
                format!(
                    "at most page_size ({}): the table after the append gives a sequence \
                     whose last page was full a new page for its new token",
                    kv.page_size
                ),
                format!(
                    "{} for sequence {b}, no room in its last page",
                    table.kv_last_page_len[b]
                ),
            ));
        }
        table.validate(kv)?;
        if let Some(b) = (0..batch).find(|&b| table.kv_indptr[b + 1] == table.kv_indptr[b]) {
            return Err(invalid(
                "kv_indptr",
                "at least one page for every sequence (the table after the append holds \
                 each new token)",
                format!("sequence {b} without pages"),
            ));
        }
        let mut owner = std::collections::HashMap::new();
        for b in 0..batch {
            let last = table.kv_page_indices[table.kv_indptr[b + 1] as usize - 1];
            if let Some(other) = owner.insert(last, b) {
                return Err(invalid(
                    "kv_page_indices",
                    "a last page of its own for each sequence (two appends to one page race)",
                    format!("page {last} last in sequences {other} and {b}"),
                ));
            }
        }
        CsrPages::upload(dusk, table)
    }

    /// Appends `k_new` and `v_new` (f16 `[batch, num_kv_heads, head_dim]`: one token per
    /// sequence) where `table` (the page table after the append, on the device: from
    /// [`AppendPlan::upload_table`], or written there, e.g. by the engine converters)
    /// puts them, updates the parts' state in `targets`, and writes [`AppendPlan::touched`].
    /// One launch, no allocation, no sync.
    ///
    /// The table's contents are read on the device only: a sequence whose entry is out of
    /// range (a page id outside the cache, an empty sequence, offsets past
    /// `kv_page_indices`, a last-page length outside `1..=page_size`) is skipped, nothing
    /// written for it, and its touched entry is `-1, 0`.
    pub fn run(
        &self,
        dusk: &Dusk,
        table: &CsrPages,
        k_new: &Buffer<f16>,
        v_new: &Buffer<f16>,
        targets: AppendTargets<'_>,
    ) -> Result<()> {
        let kv = &self.kv;
        let rows = self.batch * kv.num_kv_heads * kv.head_dim;
        for (name, b) in [("k_new", k_new), ("v_new", v_new)] {
            ensure!(
                b.len() == rows,
                name,
                format!("{rows} f16 values (batch x num_kv_heads x head_dim)"),
                b.len(),
            );
        }
        ensure!(
            table.kv_indptr.len() == self.batch + 1,
            "kv_indptr",
            format!("{} entries (batch + 1)", self.batch + 1),
            table.kv_indptr.len(),
        );
        ensure!(
            table.kv_last_page_len.len() >= self.batch,
            "kv_last_page_len",
            format!("at least {} entries (batch)", self.batch),
            table.kv_last_page_len.len(),
        );
        ensure!(
            !table.kv_page_indices.is_empty(),
            "kv_page_indices",
            "at least 1 entry",
            0,
        );
        for (name, b) in [
            ("k_cache", &*targets.k_cache),
            ("v_cache", &*targets.v_cache),
        ] {
            ensure!(
                b.len() == kv.elements(),
                name,
                format!("{} f16 values ({kv:?})", kv.elements()),
                b.len(),
            );
        }
        let (packed, scale, zero) = self.quantized_args(targets.quantized.as_deref())?;
        let (page_min, page_max) = self.quest_args(targets.quest.as_deref())?;
        let (channels, labels) = self.ds_args(targets.ds.as_deref())?;
        let [blk_indptr, blk_indices, num_blk_indices, num_blocks, block_size, k_t, k_open, v_sum] =
            self.sparq_args(targets.sparq.as_ref().map(|(s, t)| (&**s, *t)))?;
        let (touched_pages, touched_lens) = (self.touched.pages(), self.touched.lens());
        let num_indices = table.kv_page_indices.len().min(i32::MAX as usize) as i32;
        let args = [
            Arg::from(k_new),
            Arg::from(v_new),
            Arg::from(&table.kv_indptr),
            Arg::from(&table.kv_page_indices),
            Arg::from(&table.kv_last_page_len),
            Arg::from(&*targets.k_cache),
            Arg::from(&*targets.v_cache),
            Arg::from(touched_pages),
            Arg::from(touched_lens),
            Arg::I32(self.batch as i32),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.page_size as i32),
            Arg::I32(kv.num_pages as i32),
            Arg::I32(num_indices),
            packed,
            scale,
            zero,
            page_min,
            page_max,
            channels,
            labels,
            blk_indptr,
            blk_indices,
            num_blk_indices,
            num_blocks,
            block_size,
            k_t,
            k_open,
            v_sum,
        ];
        dusk.device().launch(&self.kernel, self.grid, &args)?;
        Ok(())
    }

    /// The quantized copy's arguments, checked against the plan.
    fn quantized_args<'a>(
        &'a self,
        q: Option<&'a QuantizedK>,
    ) -> Result<(Arg<'a>, Arg<'a>, Arg<'a>)> {
        let Some(bits) = self.parts.quantized else {
            ensure!(
                q.is_none(),
                "quantized",
                "none (the plan's parts leave it out)",
                "a copy",
            );
            let u = Arg::from(&self.unused_f16);
            return Ok((Arg::from(&self.unused_u8), u, Arg::from(&self.unused_f16)));
        };
        let q =
            q.ok_or_else(|| invalid("quantized", format!("the {bits}-bit copy of K"), "none"))?;
        ensure!(
            q.kv == self.kv && q.bits == bits,
            "quantized",
            format!("a {bits}-bit copy of a cache of shape {:?}", self.kv),
            format!("{} bits, {:?}", q.bits, q.kv),
        );
        q.check_lengths()?;
        Ok((
            Arg::from(&q.packed),
            Arg::from(&q.scale),
            Arg::from(&q.zero),
        ))
    }

    /// Quest's state arguments, checked against the plan.
    fn quest_args<'a>(&'a self, s: Option<&'a SelectorState>) -> Result<(Arg<'a>, Arg<'a>)> {
        if !self.parts.quest {
            ensure!(
                s.is_none(),
                "quest",
                "none (the plan's parts leave it out)",
                "a state",
            );
            return Ok((Arg::from(&self.unused_f16), Arg::from(&self.unused_f16)));
        }
        let s = s.ok_or_else(|| invalid("quest", "Quest's state", "none"))?;
        ensure!(
            s.selector().name == QUEST.name && s.kv() == self.kv,
            "quest",
            format!("Quest's state for a cache of shape {:?}", self.kv),
            format!("selector `{}`'s for {:?}", s.selector().name, s.kv()),
        );
        let (lo, hi) = (s.f16("page_min"), s.f16("page_max"));
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Err(invalid(
                "quest",
                "Quest's page_min and page_max",
                "other arrays",
            ));
        };
        Ok((Arg::from(lo), Arg::from(hi)))
    }

    /// Double Sparsity's arguments (channels and labels), checked against the plan.
    fn ds_args<'a>(&'a self, s: Option<&'a DsState>) -> Result<(Arg<'a>, Arg<'a>)> {
        let Some(r) = self.parts.ds else {
            ensure!(
                s.is_none(),
                "ds",
                "none (the plan's parts leave it out)",
                "a state",
            );
            return Ok((Arg::from(&self.unused_i32), Arg::from(&self.unused_f16)));
        };
        let s =
            s.ok_or_else(|| invalid("ds", format!("Double Sparsity's state of r {r}"), "none"))?;
        ensure!(
            s.kv() == self.kv && s.calibration().r() == r,
            "ds",
            format!(
                "a state of label width {r} for a cache of shape {:?}",
                self.kv
            ),
            format!("label width {} for {:?}", s.calibration().r(), s.kv()),
        );
        Ok((Arg::from(s.channels()), Arg::from(s.labels())))
    }

    /// SparQ's arguments (the copy's block table, its shape, the copy and the sums of V),
    /// checked against the plan.
    fn sparq_args<'a>(&'a self, s: Option<(&'a SparqState, &'a CsrPages)>) -> Result<[Arg<'a>; 8]> {
        let (s, blocks) = match (self.parts.sparq, s) {
            (true, Some(given)) => given,
            (true, None) => {
                return Err(invalid("sparq", "SparQ's state and block table", "none"));
            }
            (false, Some(_)) => {
                return Err(invalid(
                    "sparq",
                    "none (the plan's parts leave it out)",
                    "a state",
                ));
            }
            (false, None) => {
                let i = || Arg::from(&self.unused_i32);
                let one = || Arg::I32(1);
                let (h, f) = (|| Arg::from(&self.unused_f16), Arg::from(&self.unused_f32));
                return Ok([i(), i(), one(), one(), one(), h(), h(), f]);
            }
        };
        ensure!(
            s.kv() == self.kv,
            "sparq",
            format!("SparQ's state for a cache of shape {:?}", self.kv),
            format!("{:?}", s.kv()),
        );
        ensure!(
            s.num_seqs() >= self.batch,
            "sparq",
            format!(
                "a state for at least {} sequences (the plan's batch)",
                self.batch
            ),
            s.num_seqs(),
        );
        ensure!(
            blocks.kv_indptr.len() == self.batch + 1,
            "sparq_blocks",
            format!("a block table of {} offsets (batch + 1)", self.batch + 1),
            blocks.kv_indptr.len(),
        );
        ensure!(
            !blocks.kv_page_indices.is_empty(),
            "sparq_blocks",
            "a block table of at least 1 block",
            0,
        );
        let b = s.blocks();
        Ok([
            Arg::from(&blocks.kv_indptr),
            Arg::from(&blocks.kv_page_indices),
            Arg::I32(blocks.kv_page_indices.len().min(i32::MAX as usize) as i32),
            Arg::I32(b.num_blocks.min(i32::MAX as usize) as i32),
            Arg::I32(b.block_size as i32),
            Arg::from(s.k_t()),
            Arg::from(s.k_open()),
            Arg::from(s.v_sum()),
        ])
    }

    /// What the last run wrote to: entry `b` is sequence `b`'s last page and its valid
    /// tokens, or `-1, 0` where its table entry was unusable. A page-level selector of
    /// one's own updates from it: `state.update(&dusk, &k_cache, plan.touched())`.
    pub fn touched(&self) -> &PageUpdates {
        &self.touched
    }

    /// Fills the touched list with `byte` (checks poison it first).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let (pages, lens) = self.touched.buffers_mut();
        dusk.device().fill_bytes(pages, byte)?;
        dusk.device().fill_bytes(lens, byte)?;
        Ok(())
    }

    pub fn kv(&self) -> KvShape {
        self.kv
    }
    pub fn batch(&self) -> usize {
        self.batch
    }
    pub fn parts(&self) -> AppendParts {
        self.parts
    }
    pub fn config(&self) -> AppendConfig {
        self.config
    }
    /// The kernel's grid: `ceil(batch * num_kv_heads / rows_per_program)` programs.
    pub fn grid(&self) -> [u32; 3] {
        self.grid
    }
}
