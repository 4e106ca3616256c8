//! Token selectors: the "select" stage before the pruner (DESIGN.md sections 2.4 and 10;
//! Twilight Section 4.1), each picking a budget of pages per (sequence, KV head) and
//! writing them as the CSR token lists ([`crate::paged::TokenLists`]' form: `sel_indptr`,
//! `sel_indices`, ascending positions) that the estimator, pruner and attention take.
//!
//! - [`selector`]: the API a selector is written with ([`Selector`]: state, update kernel,
//!   score kernel), its state ([`SelectorState`], [`PageUpdates`]) and plan
//!   ([`SelectorPlan`]).
//! - [`page`]: the kernel-language helpers selectors' kernels share (addressing).
//! - [`quest`], [`quest_kernels`]: Quest ([`QUEST`], [`QuestPlan`]).
//! - [`ds`], [`ds_kernels`]: Double Sparsity ([`DsCalibration`], [`DsState`], [`DsPlan`]:
//!   calibrated label channels per token, scores on them, the top tokens).
//! - [`sparq`], [`sparq_kernels`]: SparQ Attention ([`SparqPlan`], [`SparqState`]: K
//!   transposed in blocks, the running sum of V; the per-token helpers an append kernel
//!   calls), its f64 reference ([`sparq_reference`]) and benchmark ([`sparq_bench`]).
//! - [`topk`], [`topk_kernel`]: the device-side top-k every selector ends with
//!   ([`TopKPlan`]: variable k per row, always-kept sink and recent items, ties toward
//!   the lower index).
//! - [`mod@reference`]: host references in f64 and the sort-based top-k.
//! - [`bench`], [`ds_bench`]: random state and a timed `select`, for the GPU check.
//!
//! README.md in this folder has the layout, the conventions and a user's own selector.

pub mod bench;
pub mod ds;
pub mod ds_bench;
pub mod ds_kernels;
pub mod page;
pub mod quest;
pub mod quest_kernels;
pub mod reference;
pub mod selector;
pub mod sparq;
pub mod sparq_bench;
pub mod sparq_kernels;
pub mod sparq_reference;
pub mod topk;
pub mod topk_kernel;

pub use ds::{DsCalibration, DsOptions, DsPlan, DsState};
pub use quest::{QuestOptions, QuestPlan, QUEST};
pub use selector::{
    Build, FusedBuild, PageUpdates, ScoreKernel, Selector, SelectorPlan, SelectorState, StateArray,
    StateBuffer, StateType, Width,
};
pub use sparq::{SparqBlocks, SparqEntry, SparqOptions, SparqPlan, SparqState, SparqUpdates};
pub use topk::{Budget, Items, Keep, SelectionShape, TopKConfig, TopKPlan};
