//! dusk: a DSL and compiler for sparse-attention decode kernels.
//!
//! This facade re-exports the parts: [`compiler`] (tile IR, interpreter, NVPTX codegen),
//! [`runtime`] (devices, buffers, launches on the GPU or the CPU interpreter) and
//! [`kernels`] (the stock kernels and their host entry points).

pub use dusk_compiler as compiler;
pub use dusk_kernels as kernels;
pub use dusk_runtime as runtime;

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
