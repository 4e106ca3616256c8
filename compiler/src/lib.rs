//! dusk-compiler: the tile IR and everything that reads it.
//!
//! Stages, in order: [`builder`] makes a [`ir::Kernel`], [`verify`] checks it, [`print`](mod@print)
//! shows it, [`interp`] runs it on the CPU (the reference and the no-GPU backend), and
//! `codegen` (feature `nvptx`, links LLVM 19) lowers it to PTX.

pub mod builder;
pub mod interp;
pub mod ir;
pub mod passes;
pub mod print;
pub mod verify;

#[cfg(feature = "nvptx")]
pub mod codegen;

pub use builder::{KernelBuilder, Value};
pub use ir::{BinOp, CacheLevel, CmpOp, Const, DType, Elem, Kernel, ReduceOp, Type, UnOp};

/// Errors from building, verifying or compiling a kernel. Each names the kernel, the op
/// and, where known, the source location that made the op; its `Display` (and `Debug`, so
/// that `?` in `main` and `unwrap` print it the same way) reads as one line:
///
/// ```text
/// kernel max_sub_exp_COLS128, examples/my_kernel/main.rs:13:17: add: operand types differ: f32[128] and i32[128]
/// ```
#[derive(thiserror::Error, Clone, PartialEq)]
pub enum CompileError {
    /// A type or shape error met while building (the builder's first).
    #[error("{}", located(&format!("kernel {kernel}"), loc, op, msg))]
    Build {
        kernel: String,
        /// The op, as the IR names it (`add`, `load`, `for`).
        op: String,
        /// `file:line:column` of the code that made the op (for a `#[kernel]`, the kernel's
        /// own source); empty when unknown.
        loc: String,
        msg: String,
    },
    /// A kernel the verifier rejects (one built by hand, or changed by a pass).
    #[error("{}", located(&format!("kernel {kernel} failed verification"), loc, op, msg))]
    Verify {
        kernel: String,
        op: String,
        /// As in [`CompileError::Build`].
        loc: String,
        msg: String,
    },
    #[error("kernel {kernel}: code generation failed: {msg}")]
    Codegen { kernel: String, msg: String },
}

impl std::fmt::Debug for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// `{what}, {loc}: {op}: {msg}`, or without the location when there is none.
pub(crate) fn located(what: &str, loc: &str, op: &str, msg: &str) -> String {
    if loc.is_empty() {
        format!("{what}: {op}: {msg}")
    } else {
        format!("{what}, {loc}: {op}: {msg}")
    }
}
