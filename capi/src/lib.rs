//! `libdusk_capi.so`: the C ABI a C or C++ engine links to run a dusk bundle, with no Rust,
//! LLVM or CUDA toolkit on its side. The bundle's `dusk.h` declares these functions and,
//! for each kernel, a typed `dusk_<kernel>(CUstream, args..., grid inputs...)` that calls
//! [`dusk_launch`].
//!
//! ```c
//! #include "dusk.h"
//! // with a CUDA context current on this thread:
//! if (dusk_init("path/to/bundle") != 0) fprintf(stderr, "%s\n", dusk_last_error());
//! dusk_quantize_k4_d128(stream, k, packed, scale, zero, num_rows, num_kv_heads, page_size);
//! ```
//!
//! Kernels are loaded into the context current when [`dusk_init`] is called and launched
//! on the stream each call names; nothing synchronises. Errors are returned as -1 with the
//! message kept per thread for [`dusk_last_error`]; no call panics across the boundary.
//! `examples/c/spgemv.c` is a complete program.

use dusk_runtime::{Bundle, RawBundle, RuntimeError};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::RwLock;

static LOADED: RwLock<Option<RawBundle>> = RwLock::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) -> c_int {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
    -1
}

fn guard(f: impl FnOnce() -> Result<(), String>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => set_error(msg),
        Err(_) => set_error("dusk: internal error (a panic was caught)".into()),
    }
}

fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// Loads the bundle in directory `bundle_dir` into the CUDA context current on this
/// thread (replacing one loaded before). Returns 0, or -1 with [`dusk_last_error`] set.
///
/// # Safety
/// `bundle_dir` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dusk_init(bundle_dir: *const c_char) -> c_int {
    guard(|| {
        let dir = string(bundle_dir, "bundle_dir")?;
        let bundle = Bundle::open(dir).map_err(|e| e.to_string())?;
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(RuntimeError::NoGpu {
                reason: "the CUDA driver library (libcuda.so) could not be loaded".into(),
            }
            .to_string());
        }
        let raw = bundle
            .load_in_current_context()
            .map_err(|e| e.to_string())?;
        *LOADED.write().unwrap_or_else(|e| e.into_inner()) = Some(raw);
        Ok(())
    })
}

/// Unloads the bundle (its modules, from the current context).
#[no_mangle]
pub extern "C" fn dusk_shutdown() {
    let _ = std::panic::catch_unwind(|| {
        LOADED.write().unwrap_or_else(|e| e.into_inner()).take();
    });
}

/// The message of this thread's last failed call, or "". Valid until this thread's next
/// failing call.
#[no_mangle]
pub extern "C" fn dusk_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Launches kernel `name` on `stream`: `args[i]` points to the value of parameter `i`
/// (a `CUdeviceptr` for buffers), `inputs` holds the kernel's launch-only grid inputs.
/// Returns 0, or -1 with [`dusk_last_error`] set (unknown kernel, wrong counts, no bundle
/// loaded, a driver error).
///
/// # Safety
/// `name` is NUL-terminated; `args` holds `num_args` pointers to values of the parameters'
/// types; `inputs` holds `num_inputs` values (or is NULL when 0); the buffers are large
/// enough for the launch; the context of [`dusk_init`] is current.
#[no_mangle]
pub unsafe extern "C" fn dusk_launch(
    name: *const c_char,
    stream: cudarc::driver::sys::CUstream,
    args: *const *mut c_void,
    num_args: c_int,
    inputs: *const u64,
    num_inputs: c_int,
) -> c_int {
    guard(|| {
        let name = string(name, "name")?;
        let loaded = LOADED.read().unwrap_or_else(|e| e.into_inner());
        let raw = loaded
            .as_ref()
            .ok_or("no bundle loaded: call dusk_init first")?;
        let slice = |p: *const u64, n: c_int| -> Result<Vec<u64>, String> {
            match (p.is_null(), usize::try_from(n)) {
                (_, Ok(0)) => Ok(vec![]),
                (false, Ok(n)) => Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec()),
                _ => Err(format!("kernel `{name}`: bad input array ({n} values)")),
            }
        };
        let inputs = slice(inputs, num_inputs)?;
        let args: Vec<*mut c_void> = match (args.is_null(), usize::try_from(num_args)) {
            (_, Ok(0)) => vec![],
            (false, Ok(n)) => unsafe { std::slice::from_raw_parts(args, n) }.to_vec(),
            _ => return Err(format!("kernel `{name}`: bad argument array ({num_args})")),
        };
        // SAFETY: per this function's contract.
        unsafe { raw.launch(name, stream, &args, &inputs) }.map_err(|e| e.to_string())
    })
}
