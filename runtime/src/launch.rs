//! Launching: every argument is checked against the kernel's parameters on the host
//! before anything runs, then the grid goes to the GPU's stream or to the interpreter.

use crate::buffer::AnyBuffer;
use crate::device::{panic_message, Backend, Device, Gpu};
use crate::error::{driver, Result, RuntimeError};
use crate::kernel::{describe_param, Arg, GpuKernel, LoadedKernel};
use cudarc::driver::{sys, CudaFunction};
use dusk_compiler::interp::{self, ArgValue};
use dusk_compiler::{Elem, Kernel};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

/// CUDA's grid limits: x below 2^31, y and z at most 65535.
const MAX_GRID: [u32; 3] = [(1 << 31) - 1, 65535, 65535];
/// CUDA's limit on threads per block.
const MAX_BLOCK: u32 = 1024;

impl Device {
    /// Runs `kernel` over `grid` programs (x fastest) with `args` in the order of its
    /// parameters. Pointer parameters take a buffer of the pointee's element type from
    /// this device, scalar parameters a scalar of the same type; a mismatch is an error
    /// naming the argument, and nothing is launched. Each program has
    /// `kernel.num_threads()` threads. A grid with a zero dimension launches nothing.
    ///
    /// On the GPU the launch is queued on the device's stream and this returns at once;
    /// errors raised while the kernel runs surface at the next synchronising call
    /// ([`Device::synchronize`], [`Buffer::download`](crate::Buffer::download)). The
    /// kernel is trusted to stay inside the buffers it is given; host entry points check
    /// the shapes that bound its accesses.
    pub fn launch(&self, kernel: &LoadedKernel, grid: [u32; 3], args: &[Arg<'_>]) -> Result<()> {
        let ir = &kernel.ir;
        check_args(ir, args, self)?;
        check_grid(ir, grid)?;
        if grid.contains(&0) {
            return Ok(());
        }
        match &self.backend {
            Backend::Gpu(g) => launch_gpu(g, kernel, grid, args),
            Backend::Cpu => launch_cpu(ir, grid, args),
        }
    }
}

/// Checks `args` against `ir.params`: count, kinds and element types, and that every
/// buffer lives on `device`.
fn check_args(ir: &Kernel, args: &[Arg<'_>], device: &Device) -> Result<()> {
    if args.len() != ir.params.len() {
        return Err(RuntimeError::ArgCount {
            kernel: ir.name.clone(),
            expected: ir.params.len(),
            found: args.len(),
        });
    }
    for (index, (p, a)) in ir.params.iter().zip(args).enumerate() {
        let ok = p.ty.is_scalar()
            && match (p.ty.elem, a) {
                (Elem::Ptr(d), Arg::Buffer(b)) => b.dtype() == d,
                (Elem::Num(d), a) => a.scalar_dtype() == Some(d),
                _ => false,
            };
        if !ok {
            return Err(RuntimeError::ArgMismatch {
                kernel: ir.name.clone(),
                index,
                param: p.name.clone(),
                expected: describe_param(&p.ty),
                found: a.describe(),
            });
        }
        if let Arg::Buffer(b) = a {
            b.check_on(device, || {
                format!("kernel `{}`: argument {index} (`{}`)", ir.name, p.name)
            })?;
        }
    }
    Ok(())
}

fn check_grid(ir: &Kernel, grid: [u32; 3]) -> Result<()> {
    for (axis, (&n, &max)) in grid.iter().zip(&MAX_GRID).enumerate() {
        if n > max {
            return Err(RuntimeError::InvalidLaunch {
                kernel: ir.name.clone(),
                msg: format!(
                    "grid {grid:?}: axis {axis} has {n} programs, CUDA allows at most {max}"
                ),
            });
        }
    }
    let threads = ir.num_threads();
    if threads == 0 || threads > MAX_BLOCK {
        return Err(RuntimeError::InvalidLaunch {
            kernel: ir.name.clone(),
            msg: format!(
                "{threads} threads per program ({} warps); CUDA allows 1 to {MAX_BLOCK}",
                ir.num_warps
            ),
        });
    }
    Ok(())
}

fn launch_gpu(g: &Arc<Gpu>, kernel: &LoadedKernel, grid: [u32; 3], args: &[Arg<'_>]) -> Result<()> {
    let ir = &kernel.ir;
    let gk: &GpuKernel = kernel
        .gpu
        .as_ref()
        .ok_or_else(|| RuntimeError::WrongDevice {
            what: format!("kernel `{}`", ir.name),
            expected: format!("GPU {} ({})", g.ordinal, g.name),
            found: "the CPU (it was loaded without PTX)".into(),
        })?;
    if !Arc::ptr_eq(&gk.device, g) {
        return Err(RuntimeError::WrongDevice {
            what: format!("kernel `{}`", ir.name),
            expected: format!("GPU {} ({})", g.ordinal, g.name),
            found: format!("GPU {} (another device handle)", gk.device.ordinal),
        });
    }
    let threads = ir.num_threads();
    if crate::replay::record(g, gk, grid, threads, args) {
        return Ok(());
    }
    let stream = g.launch_stream();
    g.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: the arguments were checked against the kernel's parameters (count, pointer or
    // scalar, element type, device); the function is from the module compiled from the
    // same IR, in the context bound above; `stream` belongs to that context (the device's
    // own, or the caller's per `Device::with_stream`).
    with_params(args, |params| unsafe {
        launch_raw(stream, &gk.func, gk.early_start, grid, threads, params)
    })
}

/// `cuLaunchKernel`, or [`launch_early`] for a kernel that starts early.
///
/// # Safety
/// `params` must be the parameter array (see [`with_params`]) of arguments checked against
/// the kernel's parameters, and `stream` a stream of the function's context, bound to
/// this thread.
pub(crate) unsafe fn launch_raw(
    stream: sys::CUstream,
    func: &CudaFunction,
    early_start: bool,
    grid: [u32; 3],
    threads: u32,
    params: *mut *mut c_void,
) -> Result<()> {
    if early_start {
        return launch_early(stream, func, grid, threads, params);
    }
    // SAFETY: per this function's contract.
    unsafe {
        sys::cuLaunchKernel(
            func.cu_function(),
            grid[0],
            grid[1],
            grid[2],
            threads,
            1,
            1,
            0,
            stream,
            params,
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver("cuLaunchKernel"))
}

/// Arguments whose parameter array lives on the stack (a launch with more allocates it).
const INLINE_PARAMS: usize = 48;

/// Calls `launch` with the driver's parameter array for `args`: one pointer per argument,
/// to an aligned 8-byte slot holding the value little-endian at its start (the driver reads
/// as many bytes as the parameter has). The slots live until `launch` returns; a launch of
/// up to [`INLINE_PARAMS`] arguments allocates nothing (a run launches on every call).
fn with_params<R>(args: &[Arg<'_>], launch: impl FnOnce(*mut *mut c_void) -> R) -> R {
    let n = args.len();
    let (mut slots_inline, mut ptrs_inline) = ([0u64; INLINE_PARAMS], [null_mut(); INLINE_PARAMS]);
    let (mut slots_heap, mut ptrs_heap) = (vec![], vec![]);
    let (slots, ptrs): (&mut [u64], &mut [*mut c_void]) = if n <= INLINE_PARAMS {
        (&mut slots_inline[..n], &mut ptrs_inline[..n])
    } else {
        slots_heap.resize(n, 0);
        ptrs_heap.resize(n, null_mut());
        (&mut slots_heap, &mut ptrs_heap)
    };
    for ((s, p), a) in slots.iter_mut().zip(ptrs.iter_mut()).zip(args) {
        *s = slot(a);
        *p = (s as *mut u64).cast();
    }
    launch(ptrs.as_mut_ptr())
}

/// An argument's 8-byte parameter slot: its value, little-endian at the start.
pub(crate) fn slot(a: &Arg<'_>) -> u64 {
    match a {
        Arg::Buffer(b) => b.device_ptr().unwrap_or(0),
        Arg::I32(v) => *v as u32 as u64,
        Arg::I64(v) => *v as u64,
        Arg::F32(v) => v.to_bits() as u64,
        Arg::U8(v) => *v as u64,
        Arg::Bool(v) => *v as u64,
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization: the kernel's programs may
/// start once the previous kernel's programs have all started (or released it) and wait
/// for its end themselves (programmatic dependent launch; CUDA graphs captured from the
/// stream keep the edge).
fn launch_early(
    stream: sys::CUstream,
    func: &CudaFunction,
    grid: [u32; 3],
    threads: u32,
    params: *mut *mut c_void,
) -> Result<()> {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the arguments were checked against the kernel's parameters; `params` is
    // their parameter array (see `with_params`); `attr` outlives the call; the function
    // belongs to the stream's context.
    unsafe { sys::cuLaunchKernelEx(&cfg, func.cu_function(), params, std::ptr::null_mut()) }
        .result()
        .map_err(driver("cuLaunchKernelEx"))
}

fn launch_cpu(ir: &Kernel, grid: [u32; 3], args: &[Arg<'_>]) -> Result<()> {
    // Each distinct buffer is locked once, in address order, so two launches sharing
    // buffers on different threads cannot deadlock.
    let mut distinct: Vec<&AnyBuffer> = args
        .iter()
        .filter_map(|a| match a {
            Arg::Buffer(b) => Some(*b),
            _ => None,
        })
        .collect();
    distinct.sort_by_key(|b| *b as *const AnyBuffer as usize);
    distinct.dedup_by_key(|b| *b as *const AnyBuffer as usize);
    let mut guards = Vec::with_capacity(distinct.len());
    for b in &distinct {
        guards.push(b.lock_cpu().ok_or_else(|| RuntimeError::WrongDevice {
            what: format!("a buffer passed to kernel `{}`", ir.name),
            expected: "the CPU".into(),
            found: b.describe_owner(),
        })?);
    }
    // Borrowed host memory may overlap (two views of one array). Views of exactly the same
    // bytes become one buffer of the interpreter; any other overlap is refused, since the
    // interpreter needs each buffer's bytes to itself.
    let spans: Vec<(usize, usize)> = guards
        .iter()
        .map(|g| (g.as_ptr() as usize, g.len()))
        .collect();
    let mut slot = vec![0usize; spans.len()];
    let mut first = vec![false; spans.len()];
    let mut slots = 0;
    for (i, &span) in spans.iter().enumerate() {
        match (0..i).find(|&j| span.1 > 0 && spans[j] == span) {
            Some(j) => slot[i] = slot[j],
            None => {
                (slot[i], first[i]) = (slots, true);
                slots += 1;
            }
        }
    }
    for (i, &(a, n)) in spans.iter().enumerate() {
        for (j, &(b, m)) in spans.iter().enumerate().skip(i + 1) {
            if slot[i] != slot[j] && n > 0 && m > 0 && a < b + m && b < a + n {
                let name = |k: usize| {
                    let at = distinct[k] as *const AnyBuffer as usize;
                    args.iter()
                        .zip(&ir.params)
                        .find(|(a, _)| {
                            matches!(a, Arg::Buffer(b) if *b as *const AnyBuffer as usize == at)
                        })
                        .map_or("?".to_string(), |(_, p)| format!("`{}`", p.name))
                };
                return Err(RuntimeError::InvalidLaunch {
                    kernel: ir.name.clone(),
                    msg: format!(
                        "the buffers given as {} and {} share memory; give each its own",
                        name(i),
                        name(j)
                    ),
                });
            }
        }
    }
    let values: Vec<ArgValue> = args
        .iter()
        .map(|a| match a {
            Arg::Buffer(b) => {
                let at = *b as *const AnyBuffer as usize;
                let buffer = distinct
                    .iter()
                    .position(|d| *d as *const AnyBuffer as usize == at)
                    .map_or(0, |i| slot[i]);
                ArgValue::Ptr {
                    buffer,
                    offset_bytes: 0,
                }
            }
            Arg::I32(v) => ArgValue::I32(*v),
            Arg::I64(v) => ArgValue::I64(*v),
            Arg::F32(v) => ArgValue::F32(*v),
            Arg::U8(v) => ArgValue::U8(*v),
            Arg::Bool(v) => ArgValue::Bool(*v),
        })
        .collect();
    let mut memory: Vec<&mut [u8]> = guards
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| first[*i])
        .map(|(_, g)| &mut ***g)
        .collect();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        interp::run(ir, grid, &values, &mut memory)
    }));
    match run {
        Ok(r) => r.map_err(RuntimeError::from),
        Err(p) => Err(RuntimeError::InterpPanic {
            kernel: ir.name.clone(),
            msg: panic_message(&*p),
        }),
    }
}
