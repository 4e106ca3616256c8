//! Double Sparsity in a pipeline's select slot: [`DsSelect`] plans a
//! [`crate::selectors::DsPlan`] (calibrated label channels per token, scores on them, the
//! top tokens of each (sequence, KV head)) as a [`SelectStage`], so that DS feeds the
//! pruners as Quest does (Twilight's DS + Twilight).
//!
//! ```rust,ignore
//! let ds = DsSelect { calibration, budget: Budget::Fraction(0.25), options: DsOptions::default() };
//! let pipeline = PipelineBuilder::new().select(Select::Plugin(Arc::new(ds)))
//!     .prune(Prune::top_p(0.95)).attend(Attend::GroupVarlen).build()?;
//! ```

use super::select::{AppendState, DeviceSizing, SelectFactory, SelectStage};
use crate::cache::AppendParts;
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use crate::selectors::{Budget, DsCalibration, DsOptions, DsPlan, Items, PageUpdates};
use dusk_runtime::Buffer;
use half::f16;

/// Double Sparsity as a pipeline's selector: its calibration (the label channels of each
/// KV head), the tokens each (sequence, KV head) keeps, and the always-kept sink and
/// recent tokens (counted in the budget).
#[derive(Clone, Debug)]
pub struct DsSelect {
    pub calibration: DsCalibration,
    pub budget: Budget,
    pub options: DsOptions,
}

impl SelectFactory for DsSelect {
    fn name(&self) -> &str {
        "double_sparsity"
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
        let plan = DsPlan::new(
            dusk,
            kv,
            &self.calibration,
            num_q_heads,
            table,
            self.budget,
            self.options,
        )?;
        Ok(Box::new(DsStage {
            plan,
            budget: self.budget,
            options: self.options,
            num_q_heads,
        }))
    }
}

/// A planned [`DsSelect`]: the label cache outlives it ([`SelectStage::replan`]).
struct DsStage {
    plan: DsPlan,
    budget: Budget,
    options: DsOptions,
    num_q_heads: usize,
}

impl SelectStage for DsStage {
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
        let DsStage {
            plan,
            budget,
            options,
            num_q_heads,
        } = *self;
        let plan =
            DsPlan::with_state(dusk, plan.into_state(), num_q_heads, table, budget, options)?;
        Ok(Box::new(DsStage {
            plan,
            budget,
            options,
            num_q_heads,
        }))
    }
    fn append_parts(&self, parts: &mut AppendParts) {
        parts.ds = Some(self.plan.state().calibration().r());
    }
    fn device_sizing(&self) -> Option<DeviceSizing<'_>> {
        let [indptr, pages, tokens] = self.plan.table_buffers();
        Some(DeviceSizing {
            items: Items::Tokens,
            budget: self.budget,
            keep: self.options.keep(),
            table: [indptr, pages],
            token_indptr: Some(tokens),
            top_k: self.plan.top_k_plan().size_buffers(),
        })
    }
    fn append_state(&mut self) -> Option<AppendState<'_>> {
        Some(AppendState::Ds(self.plan.state_mut()))
    }
    fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        self.plan.poison_outputs(dusk, byte)
    }
}
