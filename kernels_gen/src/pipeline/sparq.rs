//! SparQ Attention in a pipeline's select slot: [`SparqSelect`] plans a
//! [`crate::selectors::SparqPlan`] (the top `r` components of the group's query, approximate
//! logits from the transposed copy of K, the top `k` tokens with the local window, `alpha`
//! and the mean of V) as a [`SelectStage`] that also gives SparQ's output mix, which the
//! pipeline's attention applies with `sparq_mix`.
//!
//! SparQ's `alpha` is the approximate softmax mass of its own selection, so its mix goes with
//! SparQ alone: the builder refuses `sparq_mix` with a pruner after it (a pruner would attend
//! to fewer tokens than `alpha` weighs). Without the mix SparQ is a token selector like any
//! other, and pruners compose with it.
//!
//! ```rust,ignore
//! let sparq = SparqSelect { options: SparqOptions { r: 16, k: Budget::Fraction(0.125), window: 64 },
//!                           block_size: Some(256) };
//! let pipeline = PipelineBuilder::new().select(Select::Plugin(Arc::new(sparq)))
//!     .attend(Attend::GroupVarlen).sparq_mix(true).build()?;
//! let mut plan = pipeline.plan(&dusk, shape, &table)?;
//! plan.prepare_kv(&dusk, &k, &v)?;   // SparQ's state reads V too (the sums of V)
//! ```

use super::select::{AppendState, DeviceSizing, SelectFactory, SelectStage};
use crate::attention_ops::SparqMix;
use crate::cache::AppendParts;
use crate::engines::CsrPages;
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use crate::selectors::{
    Budget, Items, Keep, PageUpdates, SparqBlocks, SparqOptions, SparqPlan, SparqState,
    SparqUpdates,
};
use dusk_runtime::Buffer;
use half::f16;

/// SparQ as a pipeline's selector: Algorithm 1's `r`, `k` and window, and how the
/// transposed copy of K is paged: `None` as the cache (its page table is the block table),
/// `Some(n)` in blocks of `n` tokens of its own (a power of two, 8 to 256: longer runs read
/// faster, see the selectors README), each sequence's blocks kept across page tables.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparqSelect {
    pub options: SparqOptions,
    pub block_size: Option<usize>,
}

impl SelectFactory for SparqSelect {
    fn name(&self) -> &str {
        "sparq"
    }
    fn budget(&self) -> Budget {
        self.options.k
    }
    fn makes_sparq_mix(&self) -> bool {
        true
    }
    fn plan(
        &self,
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        table: &PageTable,
    ) -> Result<Box<dyn SelectStage>> {
        kv.validate()?;
        table.validate(&kv)?;
        let layout = match self.block_size {
            None => SparqBlocks::pages_of(&kv),
            Some(bs) => {
                ensure!(
                    bs.is_power_of_two() && (8..=256).contains(&bs),
                    "block_size",
                    "a power of two from 8 to 256 tokens",
                    bs,
                );
                // Every token of the cache, and a partial block per sequence.
                SparqBlocks {
                    num_blocks: (kv.num_pages * kv.page_size).div_ceil(bs) + table.batch(),
                    block_size: bs,
                }
            }
        };
        let blocks = block_table(None, table, &kv, self.block_size, layout.num_blocks)?;
        let state = SparqState::new(dusk, kv, table.batch(), layout)?;
        let plan = SparqPlan::new(dusk, state, num_q_heads, table, &blocks, self.options)?;
        Ok(Box::new(SparqStage {
            plan,
            spec: *self,
            table: table.clone(),
            blocks_on_device: CsrPages::upload(dusk, &blocks)?,
            blocks,
            num_q_heads,
        }))
    }
}

/// The copy's block table for `table`'s sequences: the page table itself when the copy is
/// paged as the cache (`block_size` `None`); otherwise each sequence keeps the blocks `old`
/// gave it, in order, and takes the next unused ids for the tokens beyond them.
fn block_table(
    old: Option<&PageTable>,
    table: &PageTable,
    kv: &KvShape,
    block_size: Option<usize>,
    num_blocks: usize,
) -> Result<PageTable> {
    let Some(bs) = block_size else {
        return Ok(table.clone());
    };
    let lens: Vec<usize> = (0..table.batch())
        .map(|b| table.seq_len(b, kv.page_size))
        .collect();
    let mut next = old.map_or(0, |o| {
        o.kv_page_indices
            .iter()
            .max()
            .map_or(0, |m| *m as usize + 1)
    });
    let mut ids = vec![];
    for (b, n) in lens.iter().enumerate() {
        let mut mine: Vec<i32> = match old {
            Some(o) if b < o.batch() => {
                o.kv_page_indices[o.kv_indptr[b] as usize..o.kv_indptr[b + 1] as usize].to_vec()
            }
            _ => vec![],
        };
        mine.truncate(n.div_ceil(bs));
        while mine.len() < n.div_ceil(bs) {
            mine.push(next as i32);
            next += 1;
        }
        ids.extend(mine);
    }
    ensure!(
        next <= num_blocks,
        "blocks",
        format!("sequences the copy's {num_blocks} blocks of {bs} hold"),
        format!("{next} blocks needed"),
    );
    PageTable::from_lengths(&lens, bs, ids)
}

/// A planned [`SparqSelect`], with the page table and the copy's block table it follows.
struct SparqStage {
    plan: SparqPlan,
    spec: SparqSelect,
    table: PageTable,
    blocks: PageTable,
    /// `blocks` on the device, where a decode step's append reads it.
    blocks_on_device: CsrPages,
    num_q_heads: usize,
}

impl SelectStage for SparqStage {
    fn sel_indptr(&self) -> &[i32] {
        &self.plan.shape().sel_indptr
    }
    fn sel_indices(&self) -> &Buffer<i32> {
        self.plan.sel_indices()
    }
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        self.plan.select(dusk, q)
    }
    /// SparQ's state is per token and reads V too: page updates cannot say which
    /// sequence's sums a token joins. [`super::PipelinePlan::prepare_kv`] rebuilds it;
    /// a decode step's append writes it (`sparq_token`, in `crate::cache`'s convention).
    fn update(&mut self, _dusk: &Dusk, _k: &Buffer<f16>, _updates: &PageUpdates) -> Result<()> {
        Err(invalid(
            "updates",
            "SparQ's own updates (its state reads V): PipelinePlan::prepare_kv, or the \
             cache append's sparq_token",
            "page updates",
        ))
    }
    fn prefill(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        v: Option<&Buffer<f16>>,
        table: &PageTable,
        _all: &PageUpdates,
    ) -> Result<()> {
        let v = v.ok_or_else(|| {
            invalid(
                "v",
                "the cache's V, for SparQ's sums of V (PipelinePlan::prepare_kv)",
                "none (PipelinePlan::prepare)",
            )
        })?;
        // On a device table (the copy paged as the cache) the sequences now on the device;
        // else the plan's own table and its copy's blocks.
        let (table, blocks) = match self.spec.block_size {
            None => (table, table),
            Some(_) => (&self.table, &self.blocks),
        };
        let updates = super::plan::ready(
            dusk,
            SparqUpdates::all(dusk, self.plan.state(), table, blocks)?,
        )?;
        self.plan.state_mut().clear_values(dusk)?;
        self.plan.update(dusk, k, v, &updates)?;
        super::plan::retire(dusk, updates)
    }
    fn replan(self: Box<Self>, dusk: &Dusk, table: &PageTable) -> Result<Box<dyn SelectStage>> {
        let SparqStage {
            plan,
            spec,
            blocks,
            num_q_heads,
            ..
        } = *self;
        let state = plan.into_state();
        let (kv, layout) = (state.kv(), state.blocks());
        table.validate(&kv)?;
        let blocks = block_table(
            Some(&blocks),
            table,
            &kv,
            spec.block_size,
            layout.num_blocks,
        )?;
        let plan = SparqPlan::new(dusk, state, num_q_heads, table, &blocks, spec.options)?;
        Ok(Box::new(SparqStage {
            plan,
            spec,
            table: table.clone(),
            blocks_on_device: CsrPages::upload(dusk, &blocks)?,
            blocks,
            num_q_heads,
        }))
    }
    fn sparq_mix(&self) -> Option<SparqMix<'_, f16>> {
        Some(SparqMix {
            alpha: self.plan.alpha(),
            v_mean: self.plan.v_mean(),
        })
    }
    fn append_parts(&self, parts: &mut AppendParts) {
        parts.sparq = true;
    }
    /// Only with the copy paged as the cache: its block table is then the page table the
    /// device holds (blocks of its own come from a free list the host keeps).
    fn device_sizing(&self) -> Option<DeviceSizing<'_>> {
        if self.spec.block_size.is_some() {
            return None;
        }
        let [blk_indptr, blk_indices, tok_indptr] = self.plan.table_buffers();
        Some(DeviceSizing {
            items: Items::Tokens,
            budget: self.spec.options.k,
            keep: Keep {
                sink: 0,
                recent: self.spec.options.window,
            },
            table: [blk_indptr, blk_indices],
            token_indptr: Some(tok_indptr),
            top_k: self.plan.top_k_plan().size_buffers(),
        })
    }
    fn append_state(&mut self) -> Option<AppendState<'_>> {
        Some(AppendState::Sparq(
            self.plan.state_mut(),
            &self.blocks_on_device,
        ))
    }
    fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        self.plan.poison_outputs(dusk, byte)
    }
}
