//! The error every host entry point returns: a bad argument (named, with what was expected),
//! or a failure below it.

use dusk_compiler::CompileError;
use dusk_runtime::RuntimeError;

/// `Debug` prints the same line as `Display`.
#[derive(thiserror::Error)]
pub enum DuskError {
    #[error("invalid argument `{arg}`: expected {expected}, found {found}")]
    InvalidArgument {
        arg: &'static str,
        expected: String,
        found: String,
    },
    /// On a GPU without the `jit` feature (no LLVM): the bundle does not hold this kernel.
    #[error(
        "kernel `{kernel}` (ir_hash {ir_hash}) is not in the bundle ({bundle}), and this build \
         cannot compile PTX (dusk-kernels without the `jit` feature): write a bundle that \
         holds it (`cargo dusk compile`), or build with `jit`"
    )]
    NotInBundle {
        kernel: String,
        ir_hash: String,
        bundle: String,
    },
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl std::fmt::Debug for DuskError {
    /// The same line as `Display`, so that `?` in `main` and `unwrap` print it readably.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

pub type Result<T> = std::result::Result<T, DuskError>;

/// An `InvalidArgument` error.
pub(crate) fn invalid(
    arg: &'static str,
    expected: impl Into<String>,
    found: impl ToString,
) -> DuskError {
    DuskError::InvalidArgument {
        arg,
        expected: expected.into(),
        found: found.to_string(),
    }
}

/// Returns an `InvalidArgument` error naming `arg` from the enclosing function unless
/// `cond`. The message's parts (`expected`, `found`: as [`invalid`] takes them) are built
/// only on failure: the checks sit on every launch path, where formatting each message
/// up front is host time spent on every run (`python/benches/host_overhead.py`).
macro_rules! ensure {
    ($cond:expr, $arg:expr, $expected:expr, $found:expr $(,)?) => {
        if !$cond {
            return Err($crate::error::invalid($arg, $expected, $found).into());
        }
    };
}
pub(crate) use ensure;
