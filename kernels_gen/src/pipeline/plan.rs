//! A pipeline planned for a cache shape and a page table: every sub-plan made and every
//! buffer sized once, here; [`PipelinePlan::step`] then queues the decode step (select,
//! INT4 estimate, prune, attend) with no allocation and no host sync, so it can be
//! captured in a CUDA graph ([`PipelinePlan::capture`]) and replayed with new queries.

use super::builder::{Attend, Pipeline};
use super::fallback::Fallback;
use super::select::SelectStage;
use crate::attention_ops::{AttentionMeta, AttentionMode, AttentionPlan, AttentionSpec};
use crate::cache::{AppendParts, AppendTargets};
use crate::error::{ensure, invalid, Result};
use crate::ops::{Dusk, QuantizedK, SpgemvPlan};
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::prune::PrunePlan;
use crate::selectors::{PageUpdates, QUEST};
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
        PipelinePlan::new(dusk, self.clone(), shape, table, None, None)
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
        let dense = !narrowed || dense_row.iter().all(|d| *d);
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
        let attention = AttentionPlan::new(dusk, spec)?;
        let (route, meta) = if dense {
            (Route::Dense, attention.upload_meta(dusk, table, None)?)
        } else {
            let indices_len = match &select {
                Some(s) if !pruning => s.sel_indices().len(),
                _ => nnz.max(1),
            };
            let meta = attention.device_meta(
                dusk,
                table,
                dev.upload(&cand_indptr)?,
                dev.alloc::<i32>(indices_len)?,
            )?;
            let route = if !pruning {
                Route::Copy
            } else if dense_row.iter().any(|d| *d) {
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
        })
    }
}

impl PipelinePlan {
    /// Fills what the pipeline keeps beside K from `k` (f16, the cache): the INT4 copy the
    /// estimate reads (the whole cache) and the selector's state for every page of the
    /// plan's table, as after a prefill. Queued, no sync. A selector whose state reads V
    /// too (SparQ) needs [`PipelinePlan::prepare_kv`].
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
        if let Some(qk) = &mut self.qk {
            dusk.quantize_k_into(k, qk)?;
        }
        if let Some(s) = &mut self.select {
            let updates = PageUpdates::all(dusk, &self.shape.kv, &self.table)?;
            s.prefill(dusk, k, v, &updates)?;
        }
        Ok(())
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

    /// What a decode step's append ([`crate::cache::AppendPlan`]) must write beside the cache to keep
    /// this plan's state current: the INT4 copy (with pruners) and Quest's page min and
    /// max (with Quest). One launch does the cache's K and V and these together.
    pub fn append_parts(&self) -> AppendParts {
        let quest = self
            .select
            .as_ref()
            .and_then(|s| s.page_state())
            .is_some_and(|st| st.selector().name == QUEST.name);
        AppendParts {
            quantized: self.qk.as_ref().map(|q| q.bits),
            quest,
            ..AppendParts::default()
        }
    }

    /// Where a [`crate::cache::AppendPlan`] of [`PipelinePlan::append_parts`] writes: the caller's
    /// cache and this plan's INT4 copy and Quest state, updated in place for the new
    /// tokens so that the next step selects and estimates over them.
    pub fn append_targets<'a>(
        &'a mut self,
        k_cache: &'a mut Buffer<f16>,
        v_cache: &'a mut Buffer<f16>,
    ) -> AppendTargets<'a> {
        let quest = self.append_parts().quest;
        AppendTargets {
            k_cache,
            v_cache,
            quantized: self.qk.as_mut(),
            quest: match (&mut self.select, quest) {
                (Some(s), true) => s.page_state_mut(),
                _ => None,
            },
            ds: None,
            sparq: None,
        }
    }

    /// The same pipeline over another page table (the next step's lengths), keeping the
    /// selector's state and the INT4 copy.
    pub fn replan(self, dusk: &Dusk, table: &PageTable) -> Result<PipelinePlan> {
        PipelinePlan::new(dusk, self.pipeline, self.shape, table, self.select, self.qk)
    }

    /// One decode step: select, estimate, prune, write attention's lists, attend; `out`
    /// (`[batch, num_q_heads, head_dim]`) and `lse` (per query row) written. No
    /// allocation, no host sync. The `run_*` methods are its stages one by one (for
    /// checks and timings), in this order.
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
    /// The candidates' row offsets (the selection's, or every token's).
    pub fn candidate_indptr(&self) -> &[i32] {
        &self.cand_indptr
    }
    /// The selector, when the plan has one.
    pub fn selector(&self) -> Option<&dyn SelectStage> {
        self.select.as_deref()
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
