//! dusk-aot: everything between the stock kernels and an engine that ships them.
//!
//! - [`bundle`]: writes a bundle directory: one PTX file per kernel and configuration, a
//!   `manifest.json` (parameters, launch rules, configurations, tuning results) that
//!   `dusk-runtime` reads with no LLVM, and `dusk.h`, the C header of `dusk-capi`'s ABI.
//! - [`stock`]: the kernels of the committed bundle (`kernels_gen/bundle/`) and how their
//!   grids are sized.
//! - [`config_text`]: the one `key=value` syntax of kernel configurations
//!   (`block_tokens=64,num_warps=2,...`) that the tuner's reports print and the benchmark
//!   binary's `--config` reads.
//! - [`space`]: config spaces declared next to each kernel family, the pruning hook that
//!   drops configs that cannot fit before compiling, and the tuning key that buckets shapes.
//! - [`tune`]: the tuner: every surviving config checked against the reference before it
//!   is timed, results kept in a persistent cache.
//! - [`spgemv_tune`], [`search_tune`], [`attention_tune`]: `spgemv_quant`, the top-p
//!   threshold search and dense paged decode attention as tuning problems (inputs,
//!   reference, candidates).
//!
//! Writing the stock bundle and reading it back:
//!
//! ```
//! use dusk_aot::{bundle, stock};
//! use dusk_compiler::codegen::Target;
//! # fn main() -> Result<(), dusk_aot::AotError> {
//! let dir = std::env::temp_dir().join(format!("dusk-bundle-doc-{}", std::process::id()));
//! bundle::write(&dir, &Target::sm90a(), &stock::kernels()?, None)?;
//! let b = dusk_runtime::Bundle::open(&dir)?;
//! assert!(b.kernel("quantize_k4_d128").is_ok());
//! assert!(std::fs::read_to_string(dir.join("dusk.h")).unwrap().contains("dusk_quantize_k4_d128("));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

pub mod attention_tune;
pub mod bundle;
pub mod config_text;
pub mod search_tune;
pub mod space;
pub mod spgemv_tune;
pub mod stock;
pub mod tune;

use dusk_compiler::CompileError;
use dusk_kernels::DuskError;
use dusk_runtime::RuntimeError;

/// Errors of the ahead-of-time tools. Each says what it was doing and with which file or
/// kernel. `Debug` prints the same line as `Display`.
#[derive(thiserror::Error)]
pub enum AotError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Kernels(#[from] DuskError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{what}: {msg}")]
    Invalid { what: String, msg: String },
}

impl std::fmt::Debug for AotError {
    /// The same line as `Display`, so that `?` in `main` and `unwrap` print it readably.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

pub type Result<T, E = AotError> = std::result::Result<T, E>;

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> AotError + '_ {
    move |source| AotError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// FNV-1a (64 bits) of `text`, as 16 hex digits: stable across runs and machines.
pub fn fnv_hex(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
