//! Loaded kernels and their arguments. A [`LoadedKernel`] keeps the kernel's IR next to
//! its GPU function: the IR's parameter list is what launches are checked against, and on
//! the CPU it is what the interpreter runs.

use crate::buffer::{AnyBuffer, Buffer, Element};
use crate::device::{Backend, Device, Gpu};
use crate::error::{describe_driver_error, driver, Result, RuntimeError};
use cudarc::driver::{result, sys, CudaFunction, DriverError};
use cudarc::nvrtc::Ptx;
use dusk_compiler::{DType, Elem, Kernel, Type};
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::Arc;

/// One launch argument, in the order of the kernel's parameters: a buffer for a pointer
/// parameter, a scalar of the parameter's type otherwise.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    Buffer(&'a AnyBuffer),
    I32(i32),
    I64(i64),
    F32(f32),
    U8(u8),
    Bool(bool),
}

impl Arg<'_> {
    /// How errors show this argument: `buffer<f32>[n]` or the scalar type.
    pub fn describe(&self) -> String {
        match self {
            Arg::Buffer(b) => format!("buffer<{}>[{}]", b.dtype().lang_name(), b.len()),
            Arg::I32(_) => "i32".into(),
            Arg::I64(_) => "i64".into(),
            Arg::F32(_) => "f32".into(),
            Arg::U8(_) => "u8".into(),
            Arg::Bool(_) => "bool".into(),
        }
    }

    /// The scalar type of a scalar argument.
    pub(crate) fn scalar_dtype(&self) -> Option<DType> {
        match self {
            Arg::Buffer(_) => None,
            Arg::I32(_) => Some(DType::I32),
            Arg::I64(_) => Some(DType::I64),
            Arg::F32(_) => Some(DType::F32),
            Arg::U8(_) => Some(DType::U8),
            Arg::Bool(_) => Some(DType::Bool),
        }
    }
}

impl fmt::Debug for Arg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Buffer(b) => write!(f, "{b:?}"),
            Arg::I32(v) => write!(f, "{v}i32"),
            Arg::I64(v) => write!(f, "{v}i64"),
            Arg::F32(v) => write!(f, "{v}f32"),
            Arg::U8(v) => write!(f, "{v}u8"),
            Arg::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl<'a, T: Element> From<&'a Buffer<T>> for Arg<'a> {
    fn from(b: &'a Buffer<T>) -> Arg<'a> {
        Arg::Buffer(b.untyped())
    }
}
impl<'a, T: Element> From<&'a mut Buffer<T>> for Arg<'a> {
    fn from(b: &'a mut Buffer<T>) -> Arg<'a> {
        Arg::Buffer(b.untyped())
    }
}
impl<'a> From<&'a AnyBuffer> for Arg<'a> {
    fn from(b: &'a AnyBuffer) -> Arg<'a> {
        Arg::Buffer(b)
    }
}
macro_rules! scalar_arg {
    ($t:ty, $v:ident) => {
        impl From<$t> for Arg<'_> {
            fn from(x: $t) -> Self {
                Arg::$v(x)
            }
        }
    };
}
scalar_arg!(i32, I32);
scalar_arg!(i64, I64);
scalar_arg!(f32, F32);
scalar_arg!(u8, U8);
scalar_arg!(bool, Bool);

/// How errors show a parameter's type.
pub(crate) fn describe_param(ty: &Type) -> String {
    match ty.elem {
        Elem::Ptr(d) if ty.is_scalar() => format!("a buffer of {}", d.lang_name()),
        Elem::Num(d) if ty.is_scalar() => d.lang_name().to_string(),
        _ => format!("{ty} (block parameters cannot be passed)"),
    }
}

/// A kernel ready to launch on the device that loaded it.
pub struct LoadedKernel {
    pub(crate) ir: Arc<Kernel>,
    pub(crate) gpu: Option<GpuKernel>,
}

pub(crate) struct GpuKernel {
    pub(crate) func: CudaFunction,
    /// The device it was loaded on (functions belong to one context).
    pub(crate) device: Arc<Gpu>,
    pub(crate) num_regs: u32,
    /// Launched so that its programs may start before the previous kernel on the stream
    /// ends (it waits for it itself: [`Kernel::waits_on_prior_grid`], Hopper and newer).
    pub(crate) early_start: bool,
}

impl LoadedKernel {
    pub fn ir(&self) -> &Arc<Kernel> {
        &self.ir
    }
    pub fn name(&self) -> &str {
        &self.ir.name
    }
    /// Threads per program (block), from the IR.
    pub fn num_threads(&self) -> u32 {
        self.ir.num_threads()
    }
    /// Registers per thread the driver allocated; `None` on the CPU.
    pub fn num_regs(&self) -> Option<u32> {
        self.gpu.as_ref().map(|g| g.num_regs)
    }
    /// Whether this kernel was loaded on a GPU (else it runs through the interpreter).
    pub fn is_gpu(&self) -> bool {
        self.gpu.is_some()
    }
}

impl fmt::Debug for LoadedKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LoadedKernel");
        d.field("name", &self.ir.name)
            .field("params", &self.ir.params.len())
            .field("threads", &self.ir.num_threads());
        if let Some(g) = &self.gpu {
            d.field("gpu", &g.device.ordinal)
                .field("num_regs", &g.num_regs);
        }
        d.finish()
    }
}

impl Device {
    /// Makes `ir` launchable on this device. On the GPU, `ptx` (the module `ir` was
    /// compiled to) is required and the entry named `ir.name` is looked up in it; on the
    /// CPU only the IR is kept and `ptx` is ignored.
    pub fn load_kernel(&self, ir: Arc<Kernel>, ptx: Option<&str>) -> Result<LoadedKernel> {
        let g = match &self.backend {
            Backend::Cpu => return Ok(LoadedKernel { ir, gpu: None }),
            Backend::Gpu(g) => g,
        };
        let kernel = ir.name.clone();
        let ptx = ptx.ok_or_else(|| RuntimeError::MissingPtx {
            kernel: kernel.clone(),
        })?;
        if ptx.contains('\0') {
            return Err(RuntimeError::PtxLoad {
                kernel,
                code: "invalid input".into(),
                log: "the PTX text contains a NUL byte".into(),
            });
        }
        let module = match g.ctx.load_module(Ptx::from_src(ptx)) {
            Ok(m) => m,
            Err(e) => return Err(ptx_error(g, &kernel, ptx, e)),
        };
        let not_found = || RuntimeError::KernelNotFound {
            kernel: kernel.clone(),
            entries: ptx_entries(ptx),
        };
        if kernel.contains('\0') {
            return Err(not_found());
        }
        let func = match module.load_function(&kernel) {
            Ok(f) => f,
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND)) => return Err(not_found()),
            Err(e) => return Err(driver("cuModuleGetFunction")(e)),
        };
        let attr = |a| {
            // SAFETY: `func` is a live function of a loaded module.
            unsafe { result::function::get_function_attribute(func.cu_function(), a) }
                .map_err(driver("cuFuncGetAttribute"))
        };
        let num_regs = attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?.max(0) as u32;
        let max_threads =
            attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?.max(0) as u32;
        if ir.num_threads() > max_threads {
            return Err(RuntimeError::InvalidLaunch {
                kernel,
                msg: format!(
                    "{} threads per program, but the loaded function allows at most {max_threads} ({num_regs} registers per thread)",
                    ir.num_threads()
                ),
            });
        }
        let early_start = ir.waits_on_prior_grid() && g.compute_capability.0 >= 9;
        Ok(LoadedKernel {
            ir,
            gpu: Some(GpuKernel {
                early_start,
                func,
                device: g.clone(),
                num_regs,
            }),
        })
    }
}

/// The `.entry` names of a PTX module, for a helpful "not found" error.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l
                .trim_start()
                .strip_prefix(".visible ")
                .unwrap_or(l.trim_start());
            let rest = rest.strip_prefix(".entry")?;
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Reloads the PTX with the JIT's error log attached, so the error says why the driver
/// refused it rather than just `CUDA_ERROR_INVALID_PTX`.
fn ptx_error(g: &Gpu, kernel: &str, ptx: &str, e: DriverError) -> RuntimeError {
    let code = describe_driver_error(&e);
    let log = jit_error_log(g, ptx).unwrap_or_default();
    let log = if log.trim().is_empty() {
        "(the driver gave no log)".to_string()
    } else {
        log.trim().to_string()
    };
    RuntimeError::PtxLoad {
        kernel: kernel.to_string(),
        code,
        log,
    }
}

fn jit_error_log(g: &Gpu, ptx: &str) -> Option<String> {
    g.ctx.bind_to_thread().ok()?;
    let src = CString::new(ptx).ok()?;
    let mut log = vec![0u8; 1 << 16];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the option arrays have two entries each; the log buffer outlives the call;
    // the source is NUL-terminated.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr().cast(),
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS && !module.is_null() {
        // SAFETY: `module` was just loaded and is not used again.
        unsafe { sys::cuModuleUnload(module) };
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Some(String::from_utf8_lossy(&log[..end]).into_owned())
}
