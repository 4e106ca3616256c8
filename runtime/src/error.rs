//! The one error type of the runtime. Every public entry point returns it instead of
//! panicking, so a serving engine can report a bad launch and carry on.

use cudarc::driver::DriverError;
use dusk_compiler::interp::InterpError;
use dusk_compiler::DType;

/// Everything that can go wrong in the runtime. Messages name the kernel, the argument and
/// the driver call involved, so they can be acted on without a debugger. `Debug` prints the
/// same line as `Display`.
#[derive(thiserror::Error)]
pub enum RuntimeError {
    /// No CUDA driver could be loaded, it found no device, or the ordinal is out of range.
    #[error("no usable GPU: {reason}")]
    NoGpu { reason: String },

    /// A CUDA driver call failed.
    #[error("CUDA driver call `{call}` failed: {}", describe_driver_error(.error))]
    Driver {
        call: &'static str,
        error: DriverError,
    },

    /// The driver refused the PTX; `log` is the JIT compiler's error log.
    #[error("kernel `{kernel}`: the driver could not load its PTX ({code}): {log}")]
    PtxLoad {
        kernel: String,
        code: String,
        log: String,
    },

    /// A GPU kernel was loaded without PTX.
    #[error("kernel `{kernel}`: PTX is required to load it on the GPU, none was given")]
    MissingPtx { kernel: String },

    /// The PTX module has no entry point with the kernel's name.
    #[error("kernel `{kernel}`: the PTX module has no entry `{kernel}` (entries: {entries:?})")]
    KernelNotFound {
        kernel: String,
        entries: Vec<String>,
    },

    /// A launch got a different number of arguments than the kernel has parameters.
    #[error("kernel `{kernel}`: expected {expected} arguments, found {found}")]
    ArgCount {
        kernel: String,
        expected: usize,
        found: usize,
    },

    /// A launch argument does not match its parameter's type.
    #[error("kernel `{kernel}`: argument {index} (`{param}`): expected {expected}, found {found}")]
    ArgMismatch {
        kernel: String,
        index: usize,
        param: String,
        expected: String,
        found: String,
    },

    /// Two buffers, or a buffer and host data, disagree in length or element type.
    #[error("{op}: expected {expected}, found {found}")]
    BufferMismatch {
        op: &'static str,
        expected: String,
        found: String,
    },

    /// A buffer whose size in bytes does not fit in memory's address range.
    #[error("a buffer of {len} {} elements is too large", .dtype.name())]
    BufferTooLarge { len: usize, dtype: DType },

    /// A buffer or kernel used on a device other than the one that made it.
    #[error("{what} belongs to {found}, but was used on {expected}")]
    WrongDevice {
        what: String,
        expected: String,
        found: String,
    },

    /// A grid or block outside the limits of CUDA (or of the loaded function).
    #[error("kernel `{kernel}`: invalid launch: {msg}")]
    InvalidLaunch { kernel: String, msg: String },

    /// The CPU interpreter reported an error (an out-of-bounds access, a bad argument).
    #[error("interpreter: {0}")]
    Interp(#[from] InterpError),

    /// The CPU interpreter panicked (a bug in the interpreter, reported rather than
    /// propagated).
    #[error("kernel `{kernel}`: the interpreter panicked: {msg}")]
    InterpPanic { kernel: String, msg: String },

    /// A bundle directory that cannot be read or whose manifest and PTX disagree.
    #[error("bundle {path}: {msg}")]
    Bundle { path: String, msg: String },

    /// The work given to [`Device::capture`](crate::Device::capture) failed while it was
    /// being captured.
    #[error("the captured work failed: {0}")]
    Captured(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The closure given to [`Device::time_calls`](crate::Device::time_calls) failed.
    #[error("the timed closure failed: {0}")]
    Timed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Debug for RuntimeError {
    /// The same line as `Display`, so that `?` in `main` and `unwrap` print it readably.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The runtime's result type.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// `CUDA_ERROR_X (description)`, as far as the driver can tell us.
pub(crate) fn describe_driver_error(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n} ({t})"),
        (Ok(n), Err(_)) => n,
        _ => format!("{:?}", e.0),
    }
}

/// Maps a driver error to [`RuntimeError::Driver`] naming `call`.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> RuntimeError {
    move |error| RuntimeError::Driver { call, error }
}
