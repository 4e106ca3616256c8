//! Quest as a [`Selector`]: its state (the min and max of K per page and KV head), its
//! kernels ([`super::quest_kernels`]) for every head_dim and group the plans take, and
//! [`QuestPlan`], the plan most callers want.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::paged::{KvShape, PageTable};
//! use dusk_kernels::selectors::{Budget, PageUpdates, QuestOptions, QuestPlan};
//! use dusk_runtime::Device;
//! use half::f16;
//!
//! # fn main() -> Result<(), dusk_kernels::DuskError> {
//! let dusk = Dusk::new(Device::best())?;
//! let kv = KvShape { num_pages: 8, page_size: 16, num_kv_heads: 2, head_dim: 64 };
//! // One sequence of 70 tokens on pages 7, 2, 5, 0, 1 (the last holds 6).
//! let table = PageTable::from_lengths(&[70], 16, vec![7, 2, 5, 0, 1])?;
//! let k: Vec<f16> = (0..kv.elements()).map(|i| f16::from_f32((i % 7) as f32 - 3.0)).collect();
//! let k = dusk.device().upload(&k)?;
//! let q = dusk.device().upload(&vec![f16::from_f32(0.5); 4 * 64])?; // 4 query heads
//!
//! let mut plan = QuestPlan::new(&dusk, kv, 4, &table, Budget::Tokens(32), QuestOptions::default())?;
//! plan.update(&dusk, &k, &PageUpdates::all(&dusk, &kv, &table)?)?; // min/max of every page
//! plan.select(&dusk, &q)?;                    // scores, top pages, token lists
//! let indptr = plan.shape().sel_indptr.clone();  // known at plan time: [0, 22, 44]
//! assert_eq!(indptr, [0, 22, 44]);            // 2 pages a KV head: one full, the last (6)
//! let lists = plan.sel_indices().download()?;
//! assert_eq!(&lists[16..22], &[64, 65, 66, 67, 68, 69]); // the last page, always kept
//! # Ok(()) }
//! ```

use super::quest_kernels::{quest_score, quest_select, quest_update};
use super::selector::{Build, ScoreKernel, Selector, SelectorPlan, SelectorState, StateArray};
use super::topk::{Budget, Keep, TopKConfig};
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_runtime::Buffer;
use half::f16;
use std::ops::{Deref, DerefMut};

/// Token slots the update reads at once (any page size: shorter pages are masked, longer
/// ones loop).
const SLOTS: usize = 16;

fn update(kv: &KvShape) -> Option<Build> {
    Some(match kv.head_dim {
        64 => quest_update::build::<64, SLOTS>,
        128 => quest_update::build::<128, SLOTS>,
        256 => quest_update::build::<256, SLOTS>,
        _ => return None,
    })
}

/// Pages a score program's tile covers: 4096 state values of each array, 32 pages at
/// head_dim 128 on 4 warps (32 values a thread of each).
pub const fn score_tile(head_dim: usize) -> usize {
    4096 / head_dim
}

/// Tiles a score program walks, the next one's page ids loaded while one is scored.
pub const SCORE_TILES: usize = 8;

macro_rules! score_table {
    ($($d:literal: $($g:literal)*;)*) => {
        /// Quest's score kernel for this shape and group, each program walking `TILES` tiles
        /// (the stock selector's walk [`SCORE_TILES`]; the benchmark times others).
        pub fn score_walking<const TILES: usize>(kv: &KvShape, group: usize) -> Option<ScoreKernel> {
            let build = match (kv.head_dim, group) {
                $($(($d, $g) => quest_score::build::<$d, $g, { score_tile($d) }, 4, TILES> as Build,)*)*
                _ => return None,
            };
            Some(ScoreKernel { build, pages_per_program: score_tile(kv.head_dim) * TILES })
        }
    };
}

score_table! {
    64: 1 2 4 8 16;
    128: 1 2 4 8 16;
    256: 1 2 4 8 16;
}

macro_rules! fused_table {
    ($($d:literal: $($g:literal)*;)*) => {
        /// Quest's score walking `TILES` tiles with the top-k fused in ([`quest_select`]):
        /// for the top-k's resident tiles of 1024 and 2048 pages on the score's 4 warps (rows
        /// of 513 to 2048 pages, 8k to 32k tokens at page 16); `None` for other shapes.
        pub fn fused_walking<const TILES: usize>(
            kv: &KvShape,
            group: usize,
            topk: &TopKConfig,
        ) -> Option<ScoreKernel> {
            if !topk.resident || topk.radix || topk.num_warps != 4 {
                return None;
            }
            let build = match (kv.head_dim, group, topk.tile) {
                $($(
                    ($d, $g, 1024) => quest_select::build::<$d, $g, { score_tile($d) }, 4, TILES, 1024> as Build,
                    ($d, $g, 2048) => quest_select::build::<$d, $g, { score_tile($d) }, 4, TILES, 2048> as Build,
                )*)*
                _ => return None,
            };
            Some(ScoreKernel { build, pages_per_program: score_tile(kv.head_dim) * TILES })
        }
    };
}

fused_table! {
    128: 1 2 4 8 16;
}

/// Quest: `page_min` and `page_max`, f16 `[num_pages, num_kv_heads, head_dim]`.
pub const QUEST: Selector = Selector {
    name: "quest",
    state: &[
        StateArray::f16_per_page("page_min"),
        StateArray::f16_per_page("page_max"),
    ],
    update,
    score: score_walking::<SCORE_TILES>,
    fused: Some(fused_walking::<SCORE_TILES>),
};

/// Quest with its score kernel walking `TILES` tiles a program (the benchmark's and the
/// tests' alternatives to [`QUEST`]'s [`SCORE_TILES`]): the same selector to its plans, which
/// take only Quest's state.
pub const fn quest_walking<const TILES: usize>() -> Selector {
    Selector {
        score: score_walking::<TILES>,
        fused: Some(fused_walking::<TILES>),
        ..QUEST
    }
}

/// Quest's choices beside the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuestOptions {
    /// Always keep each sequence's first page (the attention sink) too.
    pub sink: bool,
}

impl QuestOptions {
    /// What the top-k always keeps: the last page, and the first with `sink`.
    pub fn keep(&self) -> Keep {
        Keep {
            sink: self.sink as usize,
            recent: 1,
        }
    }
}

/// Quest over one page table: a [`SelectorPlan`] of [`QUEST`] (which it derefs to: `update`,
/// `select`, `sel_indptr`, `sel_indices`, `sel_pages`, `flags`, ...).
pub struct QuestPlan(SelectorPlan);

impl QuestPlan {
    /// Allocates Quest's state for `kv` (zeroed: update the pages before selecting) and
    /// plans selecting `budget` of every sequence of `table` for `num_q_heads` query heads.
    pub fn new(
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: QuestOptions,
    ) -> Result<QuestPlan> {
        let state = SelectorState::new(dusk, &QUEST, kv)?;
        Self::with_state(dusk, state, num_q_heads, table, budget, options)
    }

    /// As [`QuestPlan::new`] over an existing state (made by [`QuestPlan::into_state`] or
    /// `SelectorState::new(dusk, &QUEST, kv)`): the next step's plan keeps the metadata.
    pub fn with_state(
        dusk: &Dusk,
        state: SelectorState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: QuestOptions,
    ) -> Result<QuestPlan> {
        Self::with_config(dusk, state, num_q_heads, table, budget, options, |_| {})
    }

    /// As [`QuestPlan::with_state`], with `tune` changing the top-k's configuration.
    pub fn with_config(
        dusk: &Dusk,
        state: SelectorState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: QuestOptions,
        tune: impl FnOnce(&mut TopKConfig),
    ) -> Result<QuestPlan> {
        crate::error::ensure!(
            state.selector().name == QUEST.name,
            "state",
            "Quest's state",
            format!("selector `{}`'s", state.selector().name),
        );
        let keep = options.keep();
        let plan = SelectorPlan::with_config(dusk, state, num_q_heads, table, budget, keep, tune)?;
        Ok(QuestPlan(plan))
    }

    /// The state, for the plan of the next page table.
    pub fn into_state(self) -> SelectorState {
        self.0.into_state()
    }
    /// Per (page, KV head) minimum of K, f16 `[num_pages, num_kv_heads, head_dim]`.
    pub fn page_min(&self) -> &Buffer<f16> {
        self.state().f16("page_min").expect("Quest's state")
    }
    /// Per (page, KV head) maximum of K.
    pub fn page_max(&self) -> &Buffer<f16> {
        self.state().f16("page_max").expect("Quest's state")
    }
}

impl Deref for QuestPlan {
    type Target = SelectorPlan;
    fn deref(&self) -> &SelectorPlan {
        &self.0
    }
}

impl DerefMut for QuestPlan {
    fn deref_mut(&mut self) -> &mut SelectorPlan {
        &mut self.0
    }
}
