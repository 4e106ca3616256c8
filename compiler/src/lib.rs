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
/// and, where known, the source line that made the op.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CompileError {
    #[error("kernel `{kernel}`: op `{op}`{loc}: {msg}")]
    Build {
        kernel: String,
        op: String,
        loc: String,
        msg: String,
    },
    #[error("kernel `{kernel}` failed verification: op `{op}`{loc}: {msg}")]
    Verify {
        kernel: String,
        op: String,
        loc: String,
        msg: String,
    },
    #[error("kernel `{kernel}`: code generation: {msg}")]
    Codegen { kernel: String, msg: String },
}
