//! Pipelines: a selector, zero or more pruners and an attention, declared once and run as
//! one decode step (DESIGN.md sections 2, 3 and 10; Twilight's Select-then-Prune, Section
//! 4.1). The builder is usable on its own; the `pipeline!` macro is sugar over it.
//!
//! - [`builder`]: the declaration ([`Select`], [`Prune`], [`Attend`],
//!   [`PipelineBuilder`]) checked as a whole into a [`Pipeline`].
//! - [`plan`]: [`PipelinePlan`], every sub-plan and buffer sized for a cache and a page
//!   table; `step` queues the whole step with no allocation and no host sync; per-head
//!   budgets, a CUDA graph of the step, each stage's time.
//! - [`select`]: the select slot ([`SelectStage`], [`SelectFactory`]), where selectors
//!   beyond the built-in page selectors plug in.
//! - [`ds`], [`sparq`]: Double Sparsity and SparQ as plugins of the select slot
//!   ([`DsSelect`], [`SparqSelect`]).
//! - [`fallback`]: the kernel merging dense rows (short sequences) into the pruned lists.
//! - [`table`]: a step on a page table the device writes: the launch that sizes it.
//! - [`mod@reference`]: the same algorithm in f64 on the host, the oracle of the tests.
//! - [`replay`]: a decode loop on a device table checked step by step (tests, `gpu-check`).
//!
//! README.md in this folder has an example and the rules of composition.

pub mod builder;
pub mod ds;
pub mod fallback;
pub mod plan;
pub mod reference;
pub mod replay;
pub mod select;
pub mod sparq;
pub mod table;

pub use builder::{Attend, Pipeline, PipelineBuilder, Prune, Select};
pub use ds::DsSelect;
pub use plan::{PipelinePlan, PipelineShape, Stage, StepLimits};
pub use select::{AppendState, PageSelect, SelectFactory, SelectStage};
pub use sparq::SparqSelect;
