//! A pipeline planned for a cache shape and a page table: every sub-plan made and every
//! buffer sized once, here; [`PipelinePlan::step`] then queues the decode step (select,
//! INT4 estimate, prune, attend) with no allocation and no host sync, so it can be
//! captured in a CUDA graph ([`PipelinePlan::capture`]) and replayed with new queries.
//!
//! A plan on a device page table ([`Pipeline::plan_device`]) is sized for maxima instead;
//! its step ([`PipelinePlan::decode_step`]) reads the table from the device, after an
//! optional append of each sequence's new token, so a graph of it replays a decode loop
//! whose lengths grow ([`super::table`]).

use super::builder::{Attend, Pipeline};
use super::fallback::Fallback;
use super::select::{AppendState, SelectStage};
use super::table::{StepTable, TableTargets};
use crate::attention_ops::{AttentionMeta, AttentionMode, AttentionPlan, AttentionSpec};
use crate::cache::{AppendParts, AppendPlan, AppendTargets};
use crate::engines::CsrPages;
use crate::error::{ensure, invalid, Result};
use crate::ops::{Dusk, QuantizedK, SpgemvPlan};
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::prune::PrunePlan;
use crate::selectors::{Budget, Items, Keep, PageUpdates};
use dusk_compiler::DType;
use dusk_runtime::{Buffer, Graph, Measured};
use half::f16;

/// The shapes a pipeline is planned for: the paged cache (K and V `[num_pages, page_size,
/// num_kv_heads, head_dim]`, the serving engines' layout), the query heads and the element
/// type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PipelineShape {
    pub kv: KvShape,
    pub num_q_heads: usize,
    pub dtype: DType,
}

/// What a plan on a device page table ([`Pipeline::plan_device`]) is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Sequences a step holds (`q`'s batch). A sequence without pages is empty: nothing
    /// selected, a zero output.
    pub batch: usize,
    /// Tokens a sequence may hold (rounded up to whole pages); a longer one is cut to it.
    pub max_tokens: usize,
    /// Whether [`PipelinePlan::decode_step`] first appends each sequence's new token (K
    /// and V, the INT4 copy, the selector's state: [`AppendPlan`]).
    pub append: bool,
}

/// The parts of a step, for [`PipelinePlan::time_stages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The selector's scores and top-k.
    Select,
    /// The INT4 scores of every pruner's candidates (SpGEMV).
    Estimate,
    /// The pruners' threshold searches.
    Prune,
    /// Attention's lists written from the stages before (the dense fallback's merge, or
    /// a copy of the selector's lists when nothing prunes them).
    Lists,
    /// Attention over the kept tokens.
    Attend,
    /// The whole step.
    Step,
}

impl Stage {
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Select => "select",
            Stage::Estimate => "estimate",
            Stage::Prune => "prune",
            Stage::Lists => "lists",
            Stage::Attend => "attend",
            Stage::Step => "step",
        }
    }
}

/// How attention's token lists are made each step.
enum Route {
    /// Dense attention, nothing before it: no selector nor pruner, or every sequence no
    /// longer than `dense_below`.
    Dense,
    /// The selector's lists, copied where attention reads them (no pruner).
    Copy,
    /// The last pruner writes attention's lists itself.
    Pruned,
    /// The last pruner's lists, merged with the dense rows' (a batch mixing both).
    Fallback(Fallback),
}

/// A pipeline sized for one page table. See the module docs.
pub struct PipelinePlan {
    pipeline: Pipeline,
    shape: PipelineShape,
    table: PageTable,
    route: Route,
    /// The selector (none for `Select::Full`, or when every sequence is attended densely).
    select: Option<Box<dyn SelectStage>>,
    /// `Select::Full`'s candidates, every token, when a pruner reads them.
    all_tokens: Option<Buffer<i32>>,
    /// The candidates' row offsets (the selection's), `batch * num_kv_heads + 1`.
    cand_indptr: Vec<i32>,
    /// The copy of K the estimate reads (with pruners); kept across page tables.
    qk: Option<QuantizedK>,
    estimate: Option<SpgemvPlan>,
    scores: Option<Buffer<f32>>,
    prune: Vec<PrunePlan>,
    attention: AttentionPlan,
    meta: AttentionMeta,
    /// The plan reads its page table from the device ([`Pipeline::plan_device`]).
    device: Option<DeviceTable>,
}

/// What a plan on a device page table adds: the sizing launch, the append, and stand-ins
/// for the table's readers the plan lacks.
struct DeviceTable {
    limits: StepLimits,
    sizing: StepTable,
    append: Option<AppendPlan>,
    /// The append writes the selector's state (Quest's, DS's, SparQ's), else the selector
    /// (a page selector of one's own) is updated over the appended pages after it.
    state_in_append: bool,
    spare: Spares,
}

/// Buffers of the sizes the sizing launch writes, for readers a plan does not have.
struct Spares {
    indptr: [Buffer<i32>; 3],
    tokens: [Buffer<i32>; 2],
    pages: [Buffer<i32>; 2],
    k_items: Buffer<i32>,
    sel_item: Buffer<i32>,
    sel: [Buffer<i32>; 4],
    dense: Buffer<i32>,
}

impl Spares {
    fn new(dusk: &Dusk, batch: usize, rows: usize, pages: usize) -> Result<Spares> {
        let dev = dusk.device();
        let a = |n: usize| dev.alloc::<i32>(n.max(1));
        Ok(Spares {
            indptr: [a(batch + 1)?, a(batch + 1)?, a(batch + 1)?],
            tokens: [a(batch + 1)?, a(batch + 1)?],
            pages: [a(pages)?, a(pages)?],
            k_items: a(batch)?,
            sel_item: a(rows + 1)?,
            sel: [a(rows + 1)?, a(rows + 1)?, a(rows + 1)?, a(rows + 1)?],
            dense: a(rows)?,
        })
    }
}

impl Pipeline {
    /// Plans the pipeline for a cache of `shape` and the sequences of `table`: checks the
    /// shapes against the stages, plans the selector, the estimate, each pruner and
    /// attention, and allocates every buffer a step uses (sized for this batch, its longest
    /// sequence and the selector's budget). The INT4 copy of K and the selector's state
    /// start zeroed: [`PipelinePlan::prepare`] fills them from K.
    pub fn plan(
        &self,
        dusk: &Dusk,
        shape: PipelineShape,
        table: &PageTable,
    ) -> Result<PipelinePlan> {
        PipelinePlan::new(dusk, self.clone(), shape, table, None, None, false)
    }

    /// Plans the pipeline for a page table the device writes each step (an engine
    /// converter's output, [`crate::engines::vllm_to_csr`]): every buffer sized for
    /// `limits` (its batch, each sequence at `max_tokens`, the selector's budget at that
    /// length), each step's lengths, budgets and list offsets computed on the device from
    /// the table [`PipelinePlan::decode_step`] is given, so that one captured graph
    /// replays a decode loop whose lengths grow. The selector is a page selector (Quest or
    /// a user's [`crate::selectors::Selector`]), Double Sparsity or SparQ with its copy
    /// paged as the cache (budgets over tokens), or `Full` (every token, written where each
    /// row's offsets put it by the sizing launch); SparQ in blocks of its own is refused
    /// (its blocks come from a free list the host keeps). The INT4 copy and the selector's
    /// state start zeroed:
    /// [`PipelinePlan::prefill`] fills them.
    pub fn plan_device(
        &self,
        dusk: &Dusk,
        shape: PipelineShape,
        limits: StepLimits,
    ) -> Result<PipelinePlan> {
        let kv = shape.kv;
        kv.validate()?;
        ensure!(limits.batch > 0, "batch", "at least 1", limits.batch);
        ensure!(
            limits.max_tokens > 0 && limits.max_tokens < (1 << 30),
            "max_tokens",
            "1 to 2^30 - 1",
            limits.max_tokens,
        );
        let max_pages = limits.max_tokens.div_ceil(kv.page_size);
        let most = max_pages * kv.page_size;
        // The most each buffer holds: every sequence at its longest (page ids repeat
        // where the cache is smaller; they are never read from this table).
        let ids = (0..limits.batch * max_pages)
            .map(|i| (i % kv.num_pages) as i32)
            .collect();
        let table = PageTable::from_lengths(&vec![most; limits.batch], kv.page_size, ids)?;
        let mut plan = PipelinePlan::new(dusk, self.clone(), shape, &table, None, None, true)?;
        let (items, budget, keep) = match plan.select.as_deref().map(|s| s.device_sizing()) {
            Some(Some(s)) => (s.items, s.budget, s.keep),
            Some(None) => {
                return Err(invalid(
                    "select",
                    "a selector that sizes itself on the device (Quest, a user's page \
                     Selector, Double Sparsity, SparQ with its copy paged as the cache) on a \
                     device table",
                    plan.pipeline.select.as_ref().map_or("none", |f| f.name()),
                ))
            }
            None => (
                Items::Pages,
                Budget::Fraction(1.0),
                Keep { sink: 0, recent: 1 },
            ),
        };
        let parts = plan.append_parts();
        let state_in_append = parts.quest || parts.ds.is_some() || parts.sparq;
        let append = if limits.append {
            Some(AppendPlan::new(dusk, kv, limits.batch, parts)?)
        } else {
            None
        };
        let rows = limits.batch * kv.num_kv_heads;
        let sizing = StepTable::new(
            dusk,
            kv,
            items,
            limits.batch,
            max_pages,
            budget,
            keep,
            self.dense_below,
        )?;
        plan.device = Some(DeviceTable {
            limits,
            sizing,
            append,
            state_in_append,
            spare: Spares::new(dusk, limits.batch, rows, limits.batch * max_pages)?,
        });
        Ok(plan)
    }
}

impl PipelinePlan {
    fn new(
        dusk: &Dusk,
        pipeline: Pipeline,
        shape: PipelineShape,
        table: &PageTable,
        select: Option<Box<dyn SelectStage>>,
        qk: Option<QuantizedK>,
        device: bool,
    ) -> Result<PipelinePlan> {
        let kv = shape.kv;
        kv.validate()?;
        table.validate(&kv)?;
        ensure!(
            shape.dtype == pipeline.dtype,
            "dtype",
            format!("the pipeline's {}", pipeline.dtype.name()),
            shape.dtype.name(),
        );
        let hkv = kv.num_kv_heads;
        ensure!(
            shape.num_q_heads > 0 && shape.num_q_heads.is_multiple_of(hkv),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({hkv})"),
            shape.num_q_heads,
        );
        let group = shape.num_q_heads / hkv;
        ensure!(
            pipeline.attend != Attend::HeadVarlen || group == 1,
            "attend",
            "GroupVarlen for GQA (the pruner keeps one list per KV head; HeadVarlen is MHA's)",
            format!("HeadVarlen with {group} query heads a KV head"),
        );
        let ps = kv.page_size;
        let lens: Vec<usize> = (0..table.batch()).map(|b| table.seq_len(b, ps)).collect();
        if let Some(b) = lens.iter().position(|n| *n == 0) {
            return Err(invalid(
                "kv_indptr",
                "sequences of at least one token",
                format!("sequence {b} empty"),
            ));
        }
        let dense_row: Vec<bool> = lens
            .iter()
            .flat_map(|n| std::iter::repeat_n(*n <= pipeline.dense_below, hkv))
            .collect();
        let narrowed = pipeline.select.is_some() || !pipeline.prune.is_empty();
        // On a device table, lengths are known only on the device: the step never
        // switches to dense attention alone, and a dense row may come at any step.
        let dense = !narrowed || (!device && dense_row.iter().all(|d| *d));
        let any_dense = if device {
            pipeline.dense_below > 0
        } else {
            dense_row.iter().any(|d| *d)
        };
        let dev = dusk.device();
        let longest = lens.iter().copied().max().unwrap_or(1);

        // Select: the planned selector (its state kept from an earlier plan), or every
        // token. A selector is planned even when the whole batch is dense, so that its
        // state outlives this plan.
        let select = match (&pipeline.select, select) {
            (Some(_), Some(old)) => Some(old.replan(dusk, table)?),
            (Some(f), None) => Some(f.plan(dusk, kv, shape.num_q_heads, table)?),
            (None, _) => None,
        };
        let all = TokenLists::all_tokens(table, ps, hkv);
        let cand_indptr = match &select {
            Some(s) if !dense => s.sel_indptr().to_vec(),
            _ => all.indptr.clone(),
        };
        ensure!(
            cand_indptr.len() == table.batch() * hkv + 1,
            "select",
            format!("a selector writing {} list rows", table.batch() * hkv),
            cand_indptr.len().saturating_sub(1),
        );
        let nnz = *cand_indptr.last().expect("rows + 1") as usize;
        let longest_row = cand_indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        let pruning = !dense && !pipeline.prune.is_empty();
        let all_tokens = if pruning && select.is_none() {
            Some(dev.upload(&nonempty(&all.indices))?)
        } else {
            None
        };

        // Estimate and prune: one SpGEMV plan (rerun over each later pruner's candidates,
        // which are fewer), one search per pruner.
        let (mut qk, mut estimate, mut scores, mut prune) = (qk, None, None, vec![]);
        if pruning {
            let bits = pipeline.bits;
            if qk.as_ref().is_none_or(|q| q.kv != kv || q.bits != bits) {
                qk = Some(alloc_quantized(dusk, kv, bits)?);
            }
            let plan = SpgemvPlan::with_device_lists(
                dusk,
                kv,
                shape.num_q_heads,
                bits,
                table,
                &cand_indptr,
            )?;
            scores = Some(dev.alloc::<f32>(plan.num_scores().max(1))?);
            estimate = Some(plan);
            let scale = 1.0 / (kv.head_dim as f32).sqrt();
            for p in &pipeline.prune {
                prune.push(PrunePlan::with_device_lists(
                    dusk,
                    &p.policy,
                    &cand_indptr,
                    group,
                    scale,
                    &p.params,
                )?);
            }
        }

        // Attend.
        let mode = match (dense, pipeline.attend) {
            (true, _) | (_, Attend::Dense) => AttentionMode::Dense,
            (false, Attend::HeadVarlen) => AttentionMode::HeadVarlen,
            (false, Attend::GroupVarlen) => AttentionMode::GroupVarlen,
        };
        let sparq = pipeline.sparq_mix && !dense;
        let spec = AttentionSpec {
            kv,
            batch: table.batch(),
            num_q_heads: shape.num_q_heads,
            mode,
            max_tokens: if dense { longest } else { longest_row.max(1) },
            sm_scale: None,
            sparq,
            dtype: shape.dtype,
        };
        // Dense attention on a device table clamps what it reads of it (an empty sequence
        // among them); the list modes read only positions the selection wrote.
        let attention = if dense && device {
            AttentionPlan::for_device_table(dusk, spec, |_| {})?
        } else {
            AttentionPlan::new(dusk, spec)?
        };
        let (route, meta) = if dense && device {
            let meta = attention.device_table_meta(
                dev.upload(&table.kv_indptr)?,
                dev.upload(&nonempty(&table.kv_page_indices))?,
                dev.upload(&table.kv_last_page_len)?,
                None,
            )?;
            (Route::Dense, meta)
        } else if dense {
            (Route::Dense, attention.upload_meta(dusk, table, None)?)
        } else {
            let mut indices_len = match &select {
                Some(s) if !pruning => s.sel_indices().len(),
                _ => nnz.max(1),
            };
            if device && pruning && any_dense {
                // Room for every row dense, should `dense_below` pass the budget.
                let rows = table.batch() * hkv;
                indices_len = indices_len.max(rows * pipeline.dense_below.min(longest));
            }
            let meta = attention.device_meta(
                dusk,
                table,
                dev.upload(&cand_indptr)?,
                dev.alloc::<i32>(indices_len)?,
            )?;
            let route = if !pruning {
                Route::Copy
            } else if any_dense {
                let dense_len: Vec<i32> = dense_row
                    .iter()
                    .enumerate()
                    .map(|(r, d)| if *d { lens[r / hkv] as i32 } else { -1 })
                    .collect();
                Route::Fallback(Fallback::new(dusk, &dense_len)?)
            } else {
                Route::Pruned
            };
            (route, meta)
        };
        Ok(PipelinePlan {
            pipeline,
            shape,
            table: table.clone(),
            route,
            select,
            all_tokens,
            cand_indptr,
            qk,
            estimate,
            scores,
            prune,
            attention,
            meta,
            device: None,
        })
    }
}

impl PipelinePlan {
    /// Fills what the pipeline keeps beside K from `k` (f16, the cache): the INT4 copy the
    /// estimate reads (the whole cache) and the selector's state for every page of the
    /// plan's table, as after a prefill. It waits for its own upload (the pages to
    /// rebuild), then queues its kernels. A selector whose state reads V too (SparQ) needs
    /// [`PipelinePlan::prepare_kv`].
    pub fn prepare(&mut self, dusk: &Dusk, k: &Buffer<f16>) -> Result<()> {
        self.prepare_with(dusk, k, None)
    }

    /// [`PipelinePlan::prepare`] with the cache's V as well, for the selectors whose state
    /// reads it (SparQ's sums of V); the same as `prepare` for the others.
    pub fn prepare_kv(&mut self, dusk: &Dusk, k: &Buffer<f16>, v: &Buffer<f16>) -> Result<()> {
        self.prepare_with(dusk, k, Some(v))
    }

    fn prepare_with(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        v: Option<&Buffer<f16>>,
    ) -> Result<()> {
        ensure!(
            self.device.is_none(),
            "table",
            "a host-table plan (one on a device table has no table of its own: prefill)",
            "a plan made by plan_device",
        );
        let kv = self.shape.kv;
        fill_beside_k(dusk, &mut self.qk, &mut self.select, &kv, k, v, &self.table)
    }

    /// The INT4 copy of K (the whole cache) and the selector's state of every page of
    /// `table` (the sequences on the device at a plan made by [`Pipeline::plan_device`],
    /// which keeps no table of its own), from the cache as after a prefill; `v` for the
    /// selectors whose state reads it. It waits for its own upload, then queues.
    pub fn prefill(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        v: Option<&Buffer<f16>>,
        table: &PageTable,
    ) -> Result<()> {
        let kv = self.shape.kv;
        fill_beside_k(dusk, &mut self.qk, &mut self.select, &kv, k, v, table)
    }

    /// Recomputes the selector's state of `updates`' pages from `k` (what a decode step
    /// that appended tokens wrote). The INT4 copy is requantized whole by
    /// [`PipelinePlan::prepare`]; one launch for both is left to cache maintenance.
    pub fn update_selector(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        updates: &PageUpdates,
    ) -> Result<()> {
        match &mut self.select {
            Some(s) => s.update(dusk, k, updates),
            None => Ok(()),
        }
    }

    /// What a decode step's append ([`crate::cache::AppendPlan`]) must write beside the
    /// cache to keep this plan's state current: the INT4 copy (with pruners) and the
    /// selector's state (Quest's page min and max, Double Sparsity's labels, SparQ's
    /// transposed K and sums of V). One launch does the cache's K and V and these together.
    pub fn append_parts(&self) -> AppendParts {
        let mut parts = AppendParts {
            quantized: self.qk.as_ref().map(|q| q.bits),
            ..AppendParts::default()
        };
        if let Some(s) = &self.select {
            s.append_parts(&mut parts);
        }
        parts
    }

    /// Where a [`crate::cache::AppendPlan`] of [`PipelinePlan::append_parts`] writes: the
    /// caller's cache, this plan's INT4 copy and its selector's state, updated in place for
    /// the new tokens so that the next step selects and estimates over them. The plan's
    /// table is the one after the append (the new tokens last).
    pub fn append_targets<'a>(
        &'a mut self,
        k_cache: &'a mut Buffer<f16>,
        v_cache: &'a mut Buffer<f16>,
    ) -> AppendTargets<'a> {
        append_targets_of(&mut self.qk, &mut self.select, k_cache, v_cache)
    }

    /// The same pipeline over another page table (the next step's lengths), keeping the
    /// selector's state and the INT4 copy (a host-table plan, also from one made by
    /// [`Pipeline::plan_device`]).
    pub fn replan(self, dusk: &Dusk, table: &PageTable) -> Result<PipelinePlan> {
        PipelinePlan::new(
            dusk,
            self.pipeline,
            self.shape,
            table,
            self.select,
            self.qk,
            false,
        )
    }

    /// One decode step: select, estimate, prune, write attention's lists, attend; `out`
    /// (`[batch, num_q_heads, head_dim]`) and `lse` (per query row) written. No
    /// allocation, no host sync. The `run_*` methods are its stages one by one (for
    /// checks and timings), in this order. On a plan made by [`Pipeline::plan_device`] it
    /// runs over the table the last [`PipelinePlan::run_table`] wrote
    /// ([`PipelinePlan::decode_step`] runs both).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<()> {
        self.run_select(dusk, q)?;
        for i in 0..self.prune.len() {
            self.run_estimate(dusk, q, i)?;
            self.run_prune(dusk, i)?;
        }
        self.run_lists(dusk)?;
        self.run_attend(dusk, q, k, v, out, lse)
    }

    /// One decode step of a plan made by [`Pipeline::plan_device`], on the page table
    /// `table` on the device (the table after this step's append: an engine converter's
    /// output, or [`crate::cache::AppendPlan::upload_table`]'s): with `new` (`k_new`,
    /// `v_new`, f16 `[batch, num_kv_heads, head_dim]`), first the append of each sequence's
    /// new token into `k` and `v`, the INT4 copy and the selector's state; then the sizes
    /// (each sequence's length, budget and list offsets) written on the device from
    /// `table`, then [`PipelinePlan::step`]. No allocation, no host sync: a graph of it
    /// replays new queries, tokens and lengths written in place. The table is read on the
    /// device only, clamped into the plan's limits (a sequence past `max_tokens` is cut, a
    /// page id out of range read as the last page): a bad table gives wrong answers,
    /// never an access out of bounds.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_step(
        &mut self,
        dusk: &Dusk,
        table: &CsrPages,
        new: Option<(&Buffer<f16>, &Buffer<f16>)>,
        q: &Buffer<f16>,
        k: &mut Buffer<f16>,
        v: &mut Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<()> {
        self.run_table(dusk, table, new, k, v)?;
        self.step(dusk, q, k, v, out, lse)
    }

    /// [`PipelinePlan::decode_step`] captured as a CUDA graph (needs a GPU): replays
    /// read whatever `table`, `new`, `q`, `k` and `v` hold then.
    #[allow(clippy::too_many_arguments)]
    pub fn capture_decode(
        &mut self,
        dusk: &Dusk,
        table: &CsrPages,
        new: Option<(&Buffer<f16>, &Buffer<f16>)>,
        q: &Buffer<f16>,
        k: &mut Buffer<f16>,
        v: &mut Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<Graph> {
        Ok(dusk
            .device()
            .capture(|| self.decode_step(dusk, table, new, q, k, v, out, lse))?)
    }

    /// The first stage of [`PipelinePlan::decode_step`]: the append (with `new`), then the
    /// sizes from `table`, written where the later stages read them.
    pub fn run_table(
        &mut self,
        dusk: &Dusk,
        table: &CsrPages,
        new: Option<(&Buffer<f16>, &Buffer<f16>)>,
        k: &mut Buffer<f16>,
        v: &mut Buffer<f16>,
    ) -> Result<()> {
        let d = self.device.as_ref().ok_or_else(|| {
            invalid(
                "table",
                "a plan made by plan_device (this one follows its host table: step)",
                "a device table",
            )
        })?;
        d.sizing.check(table)?;
        if let Some((k_new, v_new)) = new {
            let append = d.append.as_ref().ok_or_else(|| {
                invalid(
                    "new",
                    "none: the plan was made without StepLimits::append",
                    "new tokens",
                )
            })?;
            let mut targets = append_targets_of(&mut self.qk, &mut self.select, k, v);
            // SparQ's copy is paged as the cache here: its block table is the caller's.
            if let Some((state, _)) = targets.sparq.take() {
                targets.sparq = Some((state, table));
            }
            append.run(dusk, table, k_new, v_new, targets)?;
            if !d.state_in_append {
                if let Some(s) = &mut self.select {
                    s.update(dusk, k, append.touched())?;
                }
            }
        }
        d.sizing.run(dusk, table, self.table_targets()?)
    }

    /// Where the sizing launch writes: each sub-plan's table and offsets, or stand-ins.
    fn table_targets(&self) -> Result<TableTargets<'_>> {
        let d = self
            .device
            .as_ref()
            .ok_or_else(|| invalid("table", "a plan made by plan_device", "a host table"))?;
        let sp = &d.spare;
        let sizing = self.select.as_deref().and_then(|s| s.device_sizing());
        let sel_table = sizing.as_ref().map(|s| s.table);
        let topk = sizing.as_ref().map(|s| s.top_k);
        // A token selector's top-k counts tokens before each sequence, a page selector's
        // pages.
        let tokens = sizing.as_ref().is_some_and(|s| s.items == Items::Tokens);
        let item_pages = topk.filter(|_| !tokens).map(|t| t[0]);
        let item_tokens = topk.filter(|_| tokens).map(|t| t[0]);
        let score_tokens = sizing.as_ref().and_then(|s| s.token_indptr);
        let est = self.estimate.as_ref().map(|e| e.table_buffers());
        let [m_indptr, m_pages, m_last] = self.meta.table_buffers();
        let copy_lists = match (&self.route, self.meta.lists()) {
            (Route::Copy, Some((ip, _))) => Some(ip),
            _ => None,
        };
        let dense = match &self.route {
            Route::Fallback(f) => f.dense_len(),
            _ => &sp.dense,
        };
        Ok(TableTargets {
            indptr: [
                sel_table.map_or(&sp.indptr[0], |t| t[0]),
                item_pages.unwrap_or(&sp.indptr[1]),
                est.map_or(&sp.indptr[2], |e| e[0]),
                m_indptr,
            ],
            token_indptr: [
                item_tokens.unwrap_or(&sp.tokens[0]),
                score_tokens.unwrap_or(&sp.tokens[1]),
            ],
            pages: [
                sel_table.map_or(&sp.pages[0], |t| t[1]),
                est.map_or(&sp.pages[1], |e| e[1]),
                m_pages,
            ],
            last: m_last,
            k_items: topk.map_or(&sp.k_items, |t| t[1]),
            sel_item_indptr: topk.map_or(&sp.sel_item, |t| t[2]),
            sel: [
                topk.map_or(&sp.sel[0], |t| t[3]),
                est.map_or(&sp.sel[1], |e| e[2]),
                self.prune.first().map_or(&sp.sel[2], |p| p.cand_indptr()),
                copy_lists.unwrap_or(&sp.sel[3]),
            ],
            dense_len: dense,
            all_tokens: self.all_tokens.as_ref(),
        })
    }

    /// Captures [`PipelinePlan::step`] over these buffers as a CUDA graph (needs a GPU).
    /// Replays read whatever `q`, `k`, `v` hold then (write a new query into `q` in place)
    /// and give what eager steps would.
    #[allow(clippy::too_many_arguments)]
    pub fn capture(
        &mut self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<Graph> {
        Ok(dusk
            .device()
            .capture(|| self.step(dusk, q, k, v, out, lse))?)
    }

    /// Times each stage of the step alone, then the whole step, with the harness
    /// ([`dusk_runtime::Device::time_calls`]: graph-captured replays on a GPU, wall-clock
    /// on the CPU) over the plan's own buffers: each stage reads what the step before left
    /// (the same data every call; a cache larger than the L2 still comes from DRAM).
    /// Stages the plan does not run are left out.
    #[allow(clippy::too_many_arguments)]
    pub fn time_stages(
        &mut self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<Vec<(Stage, Measured)>> {
        self.step(dusk, q, k, v, out, lse)?;
        let dev = dusk.device().clone();
        let mut times = vec![];
        let dense = matches!(self.route, Route::Dense);
        if self.select.is_some() && !dense {
            times.push((
                Stage::Select,
                dev.time_calls(1, |_| self.run_select(dusk, q))?,
            ));
        }
        if !self.prune.is_empty() && !dense {
            let n = self.prune.len();
            let t = dev.time_calls(1, |_| {
                (0..n).try_for_each(|i| self.run_estimate(dusk, q, i))
            })?;
            times.push((Stage::Estimate, t));
            let t = dev.time_calls(1, |_| (0..n).try_for_each(|i| self.run_prune(dusk, i)))?;
            times.push((Stage::Prune, t));
        }
        if matches!(self.route, Route::Copy | Route::Fallback(_)) {
            times.push((Stage::Lists, dev.time_calls(1, |_| self.run_lists(dusk))?));
        }
        let t = dev.time_calls(1, |_| self.run_attend(dusk, q, k, v, out, lse))?;
        times.push((Stage::Attend, t));
        let t = dev.time_calls(1, |_| self.step(dusk, q, k, v, out, lse))?;
        times.push((Stage::Step, t));
        Ok(times)
    }

    /// The select stage alone (nothing when there is no selector or the step is dense).
    pub fn run_select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        match (&mut self.select, &self.route) {
            (_, Route::Dense) | (None, _) => Ok(()),
            (Some(s), _) => s.select(dusk, q),
        }
    }

    /// Pruner `i`'s INT4 estimate of its candidates' scores into [`PipelinePlan::scores`]:
    /// the selection's for the first, the tokens pruner `i - 1` kept for the others
    /// (nothing without pruners or in a dense step).
    pub fn run_estimate(&mut self, dusk: &Dusk, q: &Buffer<f16>, i: usize) -> Result<()> {
        let (Some(est), Some(qk), Some(scores)) = (&self.estimate, &self.qk, &mut self.scores)
        else {
            return Ok(());
        };
        ensure!(
            i < self.prune.len(),
            "i",
            format!("a pruner of the plan's {}", self.prune.len()),
            i,
        );
        if i == 0 {
            let cand = first_candidates(&self.select, &self.all_tokens)?;
            est.run_lists(dusk, q, qk, cand, scores)
        } else {
            let prev = &self.prune[i - 1];
            est.run_csr(dusk, q, qk, prev.sel_indptr(), prev.sel_indices(), scores)
        }
    }

    /// Pruner `i`'s search over the scores [`PipelinePlan::run_estimate`] left; the last
    /// writes attention's lists unless the dense fallback merges them.
    pub fn run_prune(&mut self, dusk: &Dusk, i: usize) -> Result<()> {
        let Some(scores) = &self.scores else {
            return Ok(());
        };
        ensure!(
            i < self.prune.len(),
            "i",
            format!("a pruner of the plan's {}", self.prune.len()),
            i,
        );
        let into_meta = i + 1 == self.prune.len() && matches!(self.route, Route::Pruned);
        let out = if into_meta {
            let (ip, ix) = self
                .meta
                .lists()
                .ok_or_else(|| invalid("attend", "token lists", "dense"))?;
            Some((ip, ix))
        } else {
            None
        };
        let (before, rest) = self.prune.split_at_mut(i);
        let plan = &mut rest[0];
        if i == 0 {
            let cand = first_candidates(&self.select, &self.all_tokens)?;
            match out {
                Some((ip, ix)) => plan.run_lists_into(dusk, scores, cand, ip, ix),
                None => plan.run_lists(dusk, scores, cand),
            }
        } else {
            let prev = &before[i - 1];
            plan.run_csr_into(dusk, scores, prev.sel_indptr(), prev.sel_indices(), out)
        }
    }

    /// Writes attention's lists where the last stage did not: the selector's copied (no
    /// pruner), or the dense fallback's merge.
    pub fn run_lists(&mut self, dusk: &Dusk) -> Result<()> {
        match &self.route {
            Route::Dense | Route::Pruned => Ok(()),
            Route::Copy => {
                let s = self
                    .select
                    .as_ref()
                    .ok_or_else(|| invalid("select", "a selector", "none"))?;
                let (_, ix) = self
                    .meta
                    .lists_mut()
                    .ok_or_else(|| invalid("attend", "token lists", "dense"))?;
                Ok(ix.copy_from(s.sel_indices())?)
            }
            Route::Fallback(f) => {
                let last = self
                    .prune
                    .last()
                    .ok_or_else(|| invalid("prune", "a pruner", "none"))?;
                let (ip, ix) = self
                    .meta
                    .lists()
                    .ok_or_else(|| invalid("attend", "token lists", "dense"))?;
                f.run(dusk, last.sel_indptr(), last.sel_indices(), ip, ix)
            }
        }
    }

    /// Attention over the lists the step wrote (or every token).
    #[allow(clippy::too_many_arguments)]
    pub fn run_attend(
        &mut self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<()> {
        let mix = if self.attention.spec().sparq {
            let s = self.select.as_ref().and_then(|s| s.sparq_mix());
            Some(s.ok_or_else(|| invalid("sparq_mix", "a selector making SparQ's mix", "none"))?)
        } else {
            None
        };
        self.attention.run(dusk, q, k, v, &self.meta, mix, out, lse)
    }

    /// Each list row's budget after the last step (`batch * num_kv_heads` rows: the tokens
    /// attention read for that (sequence, KV head), the union over its group; a dense
    /// row's is its length). A download: it waits for the step.
    pub fn budgets(&self) -> Result<Vec<i32>> {
        let hkv = self.shape.kv.num_kv_heads;
        if let (Route::Dense, Some(_)) = (&self.route, &self.device) {
            // The table the last step read, as the sizing launch clamped it.
            let [ip, _, last] = self.meta.table_buffers();
            let (ip, last) = (ip.download()?, last.download()?);
            let ps = self.shape.kv.page_size as i32;
            return Ok((0..last.len() * hkv)
                .map(|r| {
                    let (b, n) = (r / hkv, ip[r / hkv + 1] - ip[r / hkv]);
                    if n > 0 {
                        (n - 1) * ps + last[b]
                    } else {
                        0
                    }
                })
                .collect());
        }
        if matches!(self.route, Route::Dense) {
            let ps = self.shape.kv.page_size;
            return Ok((0..self.table.batch() * hkv)
                .map(|r| self.table.seq_len(r / hkv, ps) as i32)
                .collect());
        }
        let (ip, _) = self
            .meta
            .lists()
            .ok_or_else(|| invalid("attend", "token lists", "dense"))?;
        Ok(ip.download()?.windows(2).map(|w| w[1] - w[0]).collect())
    }

    /// Attention's token lists after the last step (`None` when the step is dense): the
    /// row offsets and positions on the device.
    pub fn lists(&self) -> Option<(&Buffer<i32>, &Buffer<i32>)> {
        match self.route {
            Route::Dense => None,
            _ => self.meta.lists(),
        }
    }
    /// The candidates' row offsets (the selection's, or every token's) of the plan's
    /// table; on a device table, of its limits (each row's capacity):
    /// [`PipelinePlan::selection_indptr`] has the last step's.
    pub fn candidate_indptr(&self) -> &[i32] {
        &self.cand_indptr
    }
    /// The selection's row offsets of the last step: on a device table, written by its
    /// sizing launch (a download, so it waits for the step); else the plan's.
    pub fn selection_indptr(&self) -> Result<Vec<i32>> {
        let sizing = self.select.as_deref().and_then(|s| s.device_sizing());
        match (&self.device, sizing) {
            (Some(_), Some(s)) => Ok(s.top_k[3].download()?),
            _ => Ok(self.cand_indptr.clone()),
        }
    }
    /// The limits of a plan on a device page table ([`Pipeline::plan_device`]).
    pub fn limits(&self) -> Option<StepLimits> {
        self.device.as_ref().map(|d| d.limits)
    }
    /// The selector, when the plan has one.
    pub fn selector(&self) -> Option<&dyn SelectStage> {
        self.select.as_deref()
    }
    /// With `on` (the default), the select stage runs in one launch where its selector has
    /// the score and the top-k fused (Quest at 513 to 2048 pages a sequence:
    /// [`SelectStage::fuse`]), also after a replan; with `on` false, in two. Returns whether
    /// it now runs one (false for a plan without a selector).
    pub fn fuse_selection(&mut self, dusk: &Dusk, on: bool) -> Result<bool> {
        match &mut self.select {
            Some(s) => s.fuse(dusk, on),
            None => Ok(false),
        }
    }
    /// The estimate's scores (the last pruner's candidates'), laid out as `spgemv_quant`
    /// writes them; `None` without pruners.
    pub fn scores(&self) -> Option<&Buffer<f32>> {
        self.scores.as_ref()
    }
    /// The pruners' plans, in order (each one's own lists, budgets and kept mass).
    pub fn pruners(&self) -> &[PrunePlan] {
        &self.prune
    }
    /// The INT4 copy of K the estimate reads (`None` without pruners).
    pub fn quantized_k(&self) -> Option<&QuantizedK> {
        self.qk.as_ref()
    }
    /// Whether the step is dense attention alone (no selector nor pruner, or every
    /// sequence no longer than `dense_below`).
    pub fn is_dense(&self) -> bool {
        matches!(self.route, Route::Dense)
    }
    /// Whether the batch mixes dense and pruned sequences (the fallback merges lists).
    pub fn has_fallback(&self) -> bool {
        matches!(self.route, Route::Fallback(_))
    }
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }
    pub fn shape(&self) -> &PipelineShape {
        &self.shape
    }
    /// The page table the plan was made for (on a device table: its limits, every
    /// sequence at its longest).
    pub fn table(&self) -> &PageTable {
        &self.table
    }
    /// Fills every intermediate and output the step writes with `byte` (checks poison
    /// them first, to prove each stage writes what it reports).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let dev = dusk.device();
        if let Some(s) = &mut self.select {
            s.poison_outputs(dusk, byte)?;
        }
        if let Some(sc) = &mut self.scores {
            dev.fill_bytes(sc, byte)?;
        }
        for p in &mut self.prune {
            p.poison_outputs(dusk, byte)?;
        }
        if let (false, Some((ip, ix))) = (self.is_dense(), self.meta.lists_mut()) {
            if self.prune.is_empty() {
                // The selector's row offsets are uploaded once, not written by the step.
                dev.fill_bytes(ix, byte)?;
            } else {
                dev.fill_bytes(ip, byte)?;
                dev.fill_bytes(ix, byte)?;
            }
        }
        Ok(())
    }
}

/// A zeroed INT4 (or INT8) copy of a cache of shape `kv`.
/// The first pruner's candidates: the selector's token lists, or every token without one.
fn first_candidates<'a>(
    select: &'a Option<Box<dyn SelectStage>>,
    all_tokens: &'a Option<Buffer<i32>>,
) -> Result<&'a Buffer<i32>> {
    match (select, all_tokens) {
        (Some(s), _) => Ok(s.sel_indices()),
        (None, Some(all)) => Ok(all),
        (None, None) => Err(invalid("select", "candidates", "none")),
    }
}

fn alloc_quantized(dusk: &Dusk, kv: KvShape, bits: u32) -> Result<QuantizedK> {
    let dev = dusk.device();
    let rows = kv.rows();
    Ok(QuantizedK {
        packed: dev.alloc::<u8>(rows * kv.head_dim * bits as usize / 8)?,
        scale: dev.alloc::<f16>(rows)?,
        zero: dev.alloc::<f16>(rows)?,
        kv,
        bits,
    })
}

/// `v`, or one zero when it is empty (devices refuse empty allocations).
fn nonempty(v: &[i32]) -> Vec<i32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}

/// `made` once the device's own stream, which uploaded it, has: a prefill's list of pages
/// is made when it runs, and its kernels may be queued on a caller's stream
/// (`Device::with_stream`), which would not wait for the upload.
/// The INT4 copy of K and the selector's state of every page of `table`, from the cache
/// (what [`PipelinePlan::prepare`] and [`PipelinePlan::prefill`] fill); waits for its own
/// upload, then queues.
fn fill_beside_k(
    dusk: &Dusk,
    qk: &mut Option<QuantizedK>,
    select: &mut Option<Box<dyn SelectStage>>,
    kv: &KvShape,
    k: &Buffer<f16>,
    v: Option<&Buffer<f16>>,
    table: &PageTable,
) -> Result<()> {
    if let Some(qk) = qk {
        dusk.quantize_k_into(k, qk)?;
    }
    if let Some(s) = select {
        let updates = ready(dusk, PageUpdates::all(dusk, kv, table)?)?;
        s.prefill(dusk, k, v, table, &updates)?;
        retire(dusk, updates)?;
    }
    Ok(())
}

pub(crate) fn ready<T>(dusk: &Dusk, made: T) -> Result<T> {
    dusk.device().synchronize()?;
    Ok(made)
}

/// Drops `used` (a prefill's list of pages, made by [`ready`]) once the kernels queued to
/// read it will have: its memory goes back to the device's own stream, which is first
/// ordered after the caller's (`Device::order_after_launches`). Dropped at once, a list
/// freed there while the kernels still waited on the caller's stream was handed out again
/// and overwritten under them (the next plan's uploads): SparQ's sums of V came out wrong
/// whenever the kernels ran late, as under compute-sanitizer.
pub(crate) fn retire<T>(dusk: &Dusk, used: T) -> Result<()> {
    dusk.device().order_after_launches()?;
    drop(used);
    Ok(())
}

/// Where an append writes for a plan with this INT4 copy and selector: the caller's cache,
/// the copy, and the selector's state.
fn append_targets_of<'a>(
    qk: &'a mut Option<QuantizedK>,
    select: &'a mut Option<Box<dyn SelectStage>>,
    k_cache: &'a mut Buffer<f16>,
    v_cache: &'a mut Buffer<f16>,
) -> AppendTargets<'a> {
    let mut targets = AppendTargets {
        k_cache,
        v_cache,
        quantized: qk.as_mut(),
        quest: None,
        ds: None,
        sparq: None,
    };
    match select.as_deref_mut().and_then(|s| s.append_state()) {
        Some(AppendState::Quest(s)) => targets.quest = Some(s),
        Some(AppendState::Ds(s)) => targets.ds = Some(s),
        Some(AppendState::Sparq(s, blocks)) => targets.sparq = Some((s, blocks)),
        None => {}
    }
    targets
}
