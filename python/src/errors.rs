//! dusk's errors as Python exceptions (defined in `dusk/_errors.py`): a bad argument is a
//! `dusk.InvalidArgument` (a `ValueError`) naming it, with `arg`, `expected` and `found`;
//! a kernel the bundle lacks on a GPU build without LLVM is `dusk.NotInBundle`; a failure
//! of the CUDA driver or the interpreter is `dusk.DeviceError`.

use dusk_kernels::DuskError;
use dusk_runtime::RuntimeError;
use pyo3::prelude::*;

/// A `dusk.InvalidArgument` naming `arg`.
pub fn invalid(arg: &str, expected: impl ToString, found: impl ToString) -> PyErr {
    let (expected, found) = (expected.to_string(), found.to_string());
    let msg = format!("invalid argument `{arg}`: expected {expected}, found {found}");
    Python::attach(|py| {
        let made = py
            .import("dusk._errors")
            .and_then(|m| m.getattr("InvalidArgument"))
            .and_then(|cls| cls.call1((msg, arg, expected, found)));
        match made {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        }
    })
}

/// The Python argument a name of the Rust host API stands for (token lists are one
/// argument there, two here).
fn python_name(arg: &str) -> &str {
    match arg {
        "cand" => "cand_indices",
        "lists" => "sel_indices",
        "num_q_heads" => "num_qo_heads",
        other => other,
    }
}

/// The exception for an error of dusk's host code.
pub fn to_py(e: DuskError) -> PyErr {
    to_py_renamed(e, &[])
}

/// [`to_py`], with the arguments named in `renames` (Rust name, Python name) renamed.
pub fn to_py_renamed(e: DuskError, renames: &[(&str, &str)]) -> PyErr {
    match e {
        DuskError::InvalidArgument {
            arg,
            expected,
            found,
        } => {
            let arg = renames
                .iter()
                .find(|(from, _)| *from == arg)
                .map_or(python_name(arg), |(_, to)| to);
            invalid(arg, expected, found)
        }
        e @ DuskError::NotInBundle { .. } => simple("NotInBundle", e.to_string()),
        DuskError::Runtime(r) => runtime(r),
        e => simple("DuskError", e.to_string()),
    }
}

/// The exception for an error of the runtime (driver, launch, interpreter).
pub fn runtime(e: RuntimeError) -> PyErr {
    match e {
        e @ (RuntimeError::BufferMismatch { .. } | RuntimeError::WrongDevice { .. }) => {
            simple("InvalidArgument", e.to_string())
        }
        e => simple("DeviceError", e.to_string()),
    }
}

/// An exception of class `kind` with one message.
pub fn simple(kind: &str, msg: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("dusk._errors")
            .and_then(|m| m.getattr(kind))
            .and_then(|cls| cls.call1((msg,)));
        match made {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        }
    })
}

/// `?` on dusk's results.
pub trait OrPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> OrPy<T> for Result<T, DuskError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

impl<T> OrPy<T> for Result<T, RuntimeError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(runtime)
    }
}

impl<T> OrPy<T> for Result<T, dusk_runtime::cudarc::driver::DriverError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| simple("DeviceError", format!("CUDA driver call failed: {e:?}")))
    }
}
