//! dusk: a DSL and compiler for sparse-attention decode kernels.
//!
//! This facade re-exports the parts: [`compiler`] (tile IR, interpreter, NVPTX codegen),
//! [`runtime`] (devices, buffers, launches on the GPU or the CPU interpreter) and
//! [`kernels`] (the stock kernels and their host entry points), and `#[kernel]`, the kernel
//! language ([`guide`], `docs/kernel-language.md`).

pub use dusk_compiler as compiler;
pub use dusk_kernels as kernels;
pub use dusk_runtime as runtime;

/// A device and the kernels compiled for it (`Dusk::load` for your own `#[kernel]`s).
pub use dusk_kernels::ops::Dusk;
/// `#[kernel]`: a Rust function in the kernel language to a kernel builder and a typed
/// launch helper; see `docs/kernel-language.md`.
pub use dusk_macros::kernel;
/// `pipeline!`: a select-then-prune pipeline (selector, pruners, attention) declared in a
/// few lines over `dusk::kernels::pipeline::PipelineBuilder`; see
/// `kernels_gen/src/pipeline/README.md`.
pub use dusk_macros::pipeline;
/// `#[policy]`: a pruning rule (a monotone predicate over the kept set) that the fused
/// threshold search runs; see `dusk::kernels::policies` for the stock ones.
pub use dusk_macros::policy;
/// The `f16` and `bf16` element types of buffers (used by the signatures `#[kernel]` generates).
pub use half;

/// The kernel language's guide, `docs/kernel-language.md`. Every example in it is a doc test:
/// each kernel is built, run through the CPU interpreter and compared with plain Rust (in
/// lines rustdoc hides), so `cargo test` keeps the guide true.
#[doc = include_str!("../docs/kernel-language.md")]
pub mod guide {}

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The pipelines' README (`kernels_gen/src/pipeline/README.md`), its example a doc test.
#[cfg(doctest)]
#[doc = include_str!("../kernels_gen/src/pipeline/README.md")]
pub struct PipelineReadmeDoctests;
