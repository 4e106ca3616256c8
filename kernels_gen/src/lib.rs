//! dusk-kernels: the stock kernels, written in the kernel language (`#[kernel]`), and their
//! host entry points.
//!
//! - [`quantize`]: f16 K to 4- or 8-bit codes with per-row scale and zero.
//! - [`attention`], [`attention_ops`]: varlen paged decode attention, split and merged.
//! - [`spgemv`]: scores of query heads against candidate tokens, reading quantized K.
//! - [`threshold`]: the fused threshold search (top-p and other [`policies`]) and
//!   [`prune`], its validated plan: scores in, compacted CSR token lists out.
//! - [`ops`]: validated, compiled-once entry points for both ([`ops::Dusk`]).
//! - [`selectors`]: token selectors (Quest, Double Sparsity, the selector API, the shared
//!   device-side top-k): the select stage before the pruner.
//! - [`synthetic`]: a seeded synthetic long-context batch (paged K/V, queries, planted
//!   tokens, focused and diffuse heads), made on the device.
//! - [`cache`]: a decode step's cache maintenance in one launch (append K and V, the
//!   quantized copy, Quest's page state).
//! - [`engines`]: vLLM's and SGLang's page tables to dusk's CSR, on the device.
//! - [`paged`]: the paged KV cache and token-list descriptions the entry points check.
//! - [`mod@reference`]: plain host versions, the oracles of tests and GPU checks.
//! - [`timeline`]: per-program clock records, a diagnosis option of attention and search.

pub mod attention;
pub mod attention_ops;
pub mod cache;
pub mod engines;
pub mod error;
pub mod ops;
pub mod paged;
pub mod policies;
pub mod prune;
pub mod quantize;
pub mod reference;
pub mod selectors;
pub mod spgemv;
pub mod synthetic;
pub mod threshold;
pub mod timeline;

pub use error::{DuskError, Result};

/// The paths `#[kernel(crate = "crate::dusk_paths")]` reaches dusk's crates through (the
/// facade `dusk` depends on this crate, so kernels here cannot name it).
#[doc(hidden)]
pub mod dusk_paths {
    pub use crate as kernels;
    pub use dusk_compiler as compiler;
    pub use dusk_runtime as runtime;
    pub use half;
}
