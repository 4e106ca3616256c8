//! The CPU interpreter: runs a kernel's IR program by program. It is the reference the
//! GPU code is tested against, and the backend when no GPU is present.

use crate::ir::*;

/// A kernel argument, in the order of [`Kernel::params`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// A pointer: `memory[buffer]`, starting `offset_bytes` in.
    Ptr { buffer: usize, offset_bytes: usize },
    Bool(bool),
    U8(u8),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// What can go wrong while interpreting. Out-of-bounds accesses are errors, never UB.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum InterpError {
    #[error("kernel `{kernel}`: argument {index} (`{name}`): expected {expected}, found {found}")]
    BadArgument { kernel: String, index: usize, name: String, expected: String, found: String },
    #[error("kernel `{kernel}`: expected {expected} arguments, found {found}")]
    ArgumentCount { kernel: String, expected: usize, found: usize },
    #[error("kernel `{kernel}`: op `{op}`{loc} in program {program:?}: {msg}")]
    Fault { kernel: String, op: String, loc: String, program: [u32; 3], msg: String },
}

/// Runs every program of `grid` (x fastest) over `memory`.
pub fn run(kernel: &Kernel, grid: [u32; 3], args: &[ArgValue], memory: &mut [&mut [u8]]) -> Result<(), InterpError> {
    let _ = (kernel, grid, args, memory);
    unimplemented!("being written")
}
