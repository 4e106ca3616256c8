//! The select slot of a pipeline: whatever picks each (sequence, KV head)'s candidate
//! tokens, as CSR lists whose row offsets are fixed when it is planned and whose positions
//! it writes on the device at every step.
//!
//! [`SelectStage`] is a planned selector as the pipeline drives it; [`SelectFactory`] plans
//! one for a cache shape and a page table. The page selectors of
//! [`crate::selectors`] (Quest, or a user's [`Selector`]) are built in
//! ([`PageSelect`]); other selectors plug in by implementing the two traits, with no change
//! to the pipeline: Double Sparsity ([`super::ds::DsSelect`]) and SparQ
//! ([`super::sparq::SparqSelect`]) do, as would one's own token selector.

use crate::attention_ops::SparqMix;
use crate::cache::AppendParts;
use crate::engines::CsrPages;
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use crate::selectors::{
    Budget, DsState, Items, Keep, PageUpdates, Selector, SelectorPlan, SelectorState, SparqState,
    QUEST,
};
use dusk_runtime::Buffer;
use half::f16;

/// The selector state a decode step's append ([`crate::cache::AppendPlan`]) writes in its
/// one launch, beside the cache and the INT4 copy.
pub enum AppendState<'a> {
    /// Quest's page minimum and maximum.
    Quest(&'a mut SelectorState),
    /// Double Sparsity's labels.
    Ds(&'a mut DsState),
    /// SparQ's transposed copy of K and sums of V, with the copy's block table after the
    /// append (on the device).
    Sparq(&'a mut SparqState, &'a CsrPages),
}

/// A selector's budget and the buffers its kernels read sizes from, which a step on a
/// device page table writes each step (`step_table`) instead of the host at plan time.
pub struct DeviceSizing<'a> {
    /// What the scores are over, how many each sequence keeps, and always.
    pub items: Items,
    pub budget: Budget,
    pub keep: Keep,
    /// The score kernel's copy of the page table: `batch + 1` page offsets, the page ids.
    pub table: [&'a Buffer<i32>; 2],
    /// Its tokens before each sequence (`batch + 1`), where a token selector's score
    /// kernel reads them.
    pub token_indptr: Option<&'a Buffer<i32>>,
    /// The top-k's sizes: items before each sequence, items each keeps, and each row's
    /// kept items' and tokens' offsets.
    pub top_k: [&'a Buffer<i32>; 4],
}

/// A selector planned over one page table, as a pipeline's step runs it.
pub trait SelectStage: Send {
    /// The lists' row offsets, `batch * num_kv_heads + 1` entries, fixed by the plan (each
    /// row's length follows from the page table and the budget).
    fn sel_indptr(&self) -> &[i32];
    /// The positions [`SelectStage::select`] writes, ascending within each row (at least
    /// `sel_indptr`'s last entry of them).
    fn sel_indices(&self) -> &Buffer<i32>;
    /// Queues the selection for `q` (f16 `[batch, num_q_heads, head_dim]`): no allocation,
    /// no host sync.
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()>;
    /// Recomputes the state kept beside the cache for `updates`' pages from `k` (nothing
    /// for a selector without state).
    fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()>;
    /// Builds the state of every token of `table` (the plan's, or the sequences on the
    /// device at a plan on a device table) from the cache, as after a prefill (`all`: every
    /// page of it): by default [`SelectStage::update`]; a selector whose state reads V as
    /// well (SparQ's sums of V) needs `v` and fails without it.
    fn prefill(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        _v: Option<&Buffer<f16>>,
        _table: &PageTable,
        all: &PageUpdates,
    ) -> Result<()> {
        self.update(dusk, k, all)
    }
    /// The same selector over another page table, keeping its state.
    fn replan(self: Box<Self>, dusk: &Dusk, table: &PageTable) -> Result<Box<dyn SelectStage>>;
    /// SparQ's output mix (`alpha` per query row, the running mean of V), for a selector
    /// that makes it; `None` otherwise.
    fn sparq_mix(&self) -> Option<SparqMix<'_, f16>> {
        None
    }
    /// What a step on a device page table ([`super::Pipeline::plan_device`]) rewrites on
    /// the device for this selector (its table and sizes); `None` (the default) for a
    /// selector that cannot run so.
    fn device_sizing(&self) -> Option<DeviceSizing<'_>> {
        None
    }
    /// Names in `parts` the state a decode step's append writes for this selector
    /// ([`SelectStage::append_state`]); the default names none, and the pipeline runs
    /// [`SelectStage::update`] over the appended pages instead.
    fn append_parts(&self, _parts: &mut AppendParts) {}
    /// The state [`SelectStage::append_parts`] names, for the append to write.
    fn append_state(&mut self) -> Option<AppendState<'_>> {
        None
    }
    /// Fills the outputs with `byte` (checks poison them first).
    fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()>;
    /// With `on`, selects in one launch where the selector has its score and top-k fused
    /// ([`SelectorPlan::fuse`]: a new plan's default), kept across replans; returns whether
    /// it now does. For stages without a fused kernel: never.
    fn fuse(&mut self, _dusk: &Dusk, _on: bool) -> Result<bool> {
        Ok(false)
    }
    /// Whether [`SelectStage::select`] runs one fused launch.
    fn is_fused(&self) -> bool {
        false
    }
}

/// A selector as a pipeline declares it: its name, its budget, and how to plan it.
pub trait SelectFactory: Send + Sync {
    /// The name errors and reports use.
    fn name(&self) -> &str;
    /// What each sequence keeps; a sequence no longer than it is attended densely.
    fn budget(&self) -> Budget;
    /// Whether the planned stage gives SparQ's output mix ([`SelectStage::sparq_mix`]).
    fn makes_sparq_mix(&self) -> bool {
        false
    }
    /// Plans the stage for a cache of shape `kv`, `num_q_heads` query heads and `table`.
    fn plan(
        &self,
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        table: &PageTable,
    ) -> Result<Box<dyn SelectStage>>;
}

/// A page selector of [`crate::selectors`] (Quest's [`crate::selectors::QUEST`], or a
/// user's [`Selector`]) with its budget and always-kept pages.
#[derive(Clone, Copy, Debug)]
pub struct PageSelect {
    pub selector: Selector,
    pub budget: Budget,
    pub keep: Keep,
}

impl SelectFactory for PageSelect {
    fn name(&self) -> &str {
        self.selector.name
    }
    fn budget(&self) -> Budget {
        self.budget
    }
    fn plan(
        &self,
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        table: &PageTable,
    ) -> Result<Box<dyn SelectStage>> {
        let state = SelectorState::new(dusk, &self.selector, kv)?;
        let plan = SelectorPlan::new(dusk, state, num_q_heads, table, self.budget, self.keep)?;
        Ok(Box::new(PageStage {
            plan,
            spec: *self,
            num_q_heads,
            fused: true,
        }))
    }
}

/// A planned [`PageSelect`].
struct PageStage {
    plan: SelectorPlan,
    spec: PageSelect,
    num_q_heads: usize,
    /// Whether the fused selection is asked for (the default; [`SelectStage::fuse`]).
    fused: bool,
}

impl SelectStage for PageStage {
    fn sel_indptr(&self) -> &[i32] {
        &self.plan.shape().sel_indptr
    }
    fn sel_indices(&self) -> &Buffer<i32> {
        self.plan.sel_indices()
    }
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        self.plan.select(dusk, q)
    }
    fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()> {
        self.plan.update(dusk, k, updates)
    }
    fn replan(self: Box<Self>, dusk: &Dusk, table: &PageTable) -> Result<Box<dyn SelectStage>> {
        let PageStage {
            plan,
            spec,
            num_q_heads,
            fused,
        } = *self;
        let mut plan = SelectorPlan::new(
            dusk,
            plan.into_state(),
            num_q_heads,
            table,
            spec.budget,
            spec.keep,
        )?;
        plan.fuse(dusk, fused)?;
        Ok(Box::new(PageStage {
            plan,
            spec,
            num_q_heads,
            fused,
        }))
    }
    fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        self.plan.poison_outputs(dusk, byte)
    }
    fn fuse(&mut self, dusk: &Dusk, on: bool) -> Result<bool> {
        self.fused = on;
        self.plan.fuse(dusk, on)
    }
    fn is_fused(&self) -> bool {
        self.plan.is_fused()
    }
    fn device_sizing(&self) -> Option<DeviceSizing<'_>> {
        let topk = self.plan.top_k_plan();
        let (budget, keep) = topk.budget();
        let (indptr, pages) = self.plan.table_buffers();
        Some(DeviceSizing {
            items: Items::Pages,
            budget,
            keep,
            table: [indptr, pages],
            token_indptr: None,
            top_k: topk.size_buffers(),
        })
    }
    fn append_parts(&self, parts: &mut AppendParts) {
        parts.quest = self.is_quest();
    }
    fn append_state(&mut self) -> Option<AppendState<'_>> {
        self.is_quest()
            .then(|| AppendState::Quest(self.plan.state_mut()))
    }
}

impl PageStage {
    /// Quest's state has its own part in the append; a user's selector is updated after it.
    fn is_quest(&self) -> bool {
        self.spec.selector.name == QUEST.name
    }
}
