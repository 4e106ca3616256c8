//! Devices: a CUDA GPU (through the driver API, loaded at run time) or the CPU, where
//! kernels run through the IR interpreter. The same calls work on both, so code written
//! against a [`Device`] runs on a laptop and on an H100 alike.

use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

thread_local! {
    /// The stream this thread's launches go to instead of their device's own, while a
    /// [`Device::with_stream`] call runs: (the device's own `CUstream`, which names the
    /// device, the `CUstream` launches go to).
    static LAUNCH_STREAM: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// Where this thread's launches on the device whose own stream is `own` go: the stream a
/// [`Device::with_stream`] call set, else `own`. Buffers know their device's stream, not
/// the device: copies between them take their queue from here.
pub(crate) fn launch_stream_of(own: &CudaStream) -> sys::CUstream {
    let key = own.cu_stream() as usize;
    match LAUNCH_STREAM.with(|s| s.get()) {
        Some((k, stream)) if k == key => stream as sys::CUstream,
        _ => own.cu_stream(),
    }
}

/// A device kernels run on. Cheap to clone: clones share the context and stream.
///
/// On the GPU every operation (copies, launches, timing events) is ordered on one
/// dedicated stream of the device, so no cross-stream synchronisation is needed, and
/// cudarc's per-buffer event tracking is turned off (it would add driver calls to every
/// launch and get in the way of graph capture).
#[derive(Clone)]
pub struct Device {
    pub(crate) backend: Backend,
}

#[derive(Clone)]
pub(crate) enum Backend {
    Cpu,
    Gpu(Arc<Gpu>),
}

/// A GPU device: its context, its stream, and the properties queried once at creation.
impl Gpu {
    /// See [`Device::launch_stream`].
    pub(crate) fn launch_stream(self: &Arc<Self>) -> sys::CUstream {
        launch_stream_of(&self.stream)
    }
}

pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    pub(crate) driver_version: (u32, u32),
    pub(crate) compute_capability: (u32, u32),
    pub(crate) num_sms: u32,
    pub(crate) l2_bytes: usize,
    /// Marks the point a launch stream has reached, for [`Device::order_after_launches`].
    pub(crate) join: CudaEvent,
}

impl Device {
    /// The CPU: kernels run through the IR interpreter.
    pub fn cpu() -> Device {
        Device {
            backend: Backend::Cpu,
        }
    }

    /// GPU number `ordinal`. Fails (never panics) when the CUDA driver library is missing,
    /// reports no device, or has fewer than `ordinal + 1` devices.
    pub fn gpu(ordinal: usize) -> Result<Device> {
        // cudarc's lazy loader panics when libcuda is absent: probe for it first.
        // SAFETY: only tries to dlopen the library and drops it again.
        if !unsafe { sys::is_culib_present() } {
            return Err(RuntimeError::NoGpu {
                reason: "the CUDA driver library (libcuda.so) could not be loaded".into(),
            });
        }
        // A driver older than the bindings may lack a symbol, which cudarc reports by
        // panicking; turn that into an error too.
        std::panic::catch_unwind(|| open_gpu(ordinal)).unwrap_or_else(|p| {
            Err(RuntimeError::NoGpu {
                reason: format!(
                    "the CUDA driver could not be initialised: {}",
                    panic_message(&*p)
                ),
            })
        })
    }

    /// GPU 0 when one is usable, the CPU otherwise. Never fails, never prints.
    pub fn best() -> Device {
        Device::gpu(0).unwrap_or_else(|_| Device::cpu())
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.backend, Backend::Gpu(_))
    }

    /// The GPU's name (e.g. "NVIDIA H100 80GB HBM3"), or "cpu (interpreter)".
    pub fn name(&self) -> &str {
        match &self.backend {
            Backend::Cpu => "cpu (interpreter)",
            Backend::Gpu(g) => &g.name,
        }
    }

    /// The GPU's ordinal; `None` on the CPU.
    pub fn ordinal(&self) -> Option<usize> {
        self.gpu_inner().map(|g| g.ordinal)
    }

    /// The CUDA version the driver supports, as (major, minor) (`cuDriverGetVersion`);
    /// `None` on the CPU. PTX must not use an ISA newer than this version reads.
    pub fn driver_version(&self) -> Option<(u32, u32)> {
        self.gpu_inner().map(|g| g.driver_version)
    }

    /// The GPU's compute capability, e.g. (9, 0) for an H100; `None` on the CPU.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        self.gpu_inner().map(|g| g.compute_capability)
    }

    /// Number of streaming multiprocessors; `None` on the CPU.
    pub fn num_sms(&self) -> Option<u32> {
        self.gpu_inner().map(|g| g.num_sms)
    }

    /// Waits for all work queued on the device's stream and reports any error a kernel
    /// raised asynchronously. A no-op on the CPU, where everything is synchronous.
    pub fn synchronize(&self) -> Result<()> {
        match &self.backend {
            Backend::Cpu => Ok(()),
            Backend::Gpu(g) => g
                .stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize")),
        }
    }

    /// The stream all of this device's work is queued on, for callers that interoperate
    /// with other CUDA code (order their work against it with events); `None` on the CPU.
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        self.gpu_inner().map(|g| &g.stream)
    }

    /// Runs `f` with every kernel launch this thread makes on this device queued on
    /// `stream` instead of the device's own stream: the caller's stream (PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`, an engine's), so that dusk's kernels
    /// are ordered with the caller's work, and captured into the caller's CUDA graph, with
    /// no event or synchronisation between them. Launches, fills ([`Device::fill_bytes`],
    /// which a run may use to clear a sum) and copies between device buffers
    /// ([`Buffer::copy_from`](crate::Buffer::copy_from), which a step may use to move a
    /// list) move; copies to or from the host, allocations and [`Device::synchronize`]
    /// stay on the device's stream. Calls nest (the innermost
    /// stream wins) and the previous stream is restored when `f` returns or unwinds. On
    /// the CPU this just calls `f`.
    ///
    /// # Safety
    /// `stream` must be a stream of this device's context (the primary context, which
    /// PyTorch and CuPy use) that stays valid until the work launched on it has run;
    /// buffers the device's own stream allocated or filled (a plan's) must be ready before
    /// `f` launches on `stream` (synchronise the device after making them); and buffers
    /// the launches read must not be dropped, nor copied into, on the device's own stream
    /// before those launches have run ([`Device::order_after_launches`] orders that stream
    /// after them).
    pub unsafe fn with_stream<R>(&self, stream: sys::CUstream, f: impl FnOnce() -> R) -> R {
        let Some(g) = self.gpu_inner() else {
            return f();
        };
        struct Restore(Option<(usize, usize)>);
        impl Drop for Restore {
            fn drop(&mut self) {
                LAUNCH_STREAM.with(|s| s.set(self.0));
            }
        }
        let key = g.stream.cu_stream() as usize;
        let _restore = Restore(LAUNCH_STREAM.with(|s| s.replace(Some((key, stream as usize)))));
        f()
    }

    /// Orders the device's own stream after the work queued so far on this thread's launch
    /// stream (the caller's, inside [`Device::with_stream`]), without waiting on the host:
    /// the copies and frees that go to the device's own stream afterwards (a plan's
    /// temporaries dropped once their kernels are queued, a replaced plan's buffers, new
    /// uploads into memory the pool hands out again) then happen after those kernels, not
    /// while they may still read the memory. One event record and one stream wait; nothing
    /// on the CPU, when launches go to the device's own stream, or while the launch stream
    /// is being captured into a graph (a wait on a captured event would pull the device's
    /// stream into the capture; nothing runs before the graph is launched anyway).
    pub fn order_after_launches(&self) -> Result<()> {
        let Some(g) = self.gpu_inner() else {
            return Ok(());
        };
        let launch = g.launch_stream();
        let own = g.stream.cu_stream();
        if launch == own {
            return Ok(());
        }
        g.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `launch` is a stream of this context (the contract of `with_stream`);
        // writes one status.
        unsafe { sys::cuStreamIsCapturing(launch, &mut status) }
            .result()
            .map_err(driver("cuStreamIsCapturing"))?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(());
        }
        // SAFETY: the event and both streams belong to this context; a record followed by a
        // wait on it is ordered by the driver even when the event is recorded again later.
        unsafe {
            result::event::record(g.join.cu_event(), launch).map_err(driver("cuEventRecord"))?;
            result::stream::wait_event(
                own,
                g.join.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(driver("cuStreamWaitEvent"))
        }
    }

    /// The stream launches on this device go to from this thread: the one set by
    /// [`Device::with_stream`], else the device's own. `None` on the CPU.
    pub fn launch_stream(&self) -> Option<sys::CUstream> {
        self.gpu_inner().map(|g| g.launch_stream())
    }

    pub(crate) fn gpu_inner(&self) -> Option<&Arc<Gpu>> {
        match &self.backend {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g),
        }
    }

    /// How errors name this device.
    pub(crate) fn describe(&self) -> String {
        match &self.backend {
            Backend::Cpu => "the CPU".into(),
            Backend::Gpu(g) => format!("GPU {} ({})", g.ordinal, g.name),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            Backend::Cpu => write!(f, "Device(cpu)"),
            Backend::Gpu(g) => write!(
                f,
                "Device(gpu {}: {}, sm_{}{}, {} SMs, driver {}.{})",
                g.ordinal,
                g.name,
                g.compute_capability.0,
                g.compute_capability.1,
                g.num_sms,
                g.driver_version.0,
                g.driver_version.1
            ),
        }
    }
}

fn no_gpu(what: &str, e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError::NoGpu {
        reason: format!("{what}: {}", crate::error::describe_driver_error(&e)),
    }
}

fn open_gpu(ordinal: usize) -> Result<Device> {
    result::init().map_err(|e| no_gpu("cuInit failed", e))?;
    let count = result::device::get_count().map_err(|e| no_gpu("cuDeviceGetCount failed", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(RuntimeError::NoGpu {
            reason: format!("GPU {ordinal} was asked for, the driver reports {count}"),
        });
    }
    let mut version = 0i32;
    // SAFETY: writes one int; the driver is initialised.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(driver("cuDriverGetVersion"))?;
    let driver_version = ((version / 1000) as u32, ((version % 1000) / 10) as u32);

    let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: all of this device's buffers are allocated, used and freed on the one stream
    // made below, so there is nothing for per-buffer events to order. Must precede the
    // first allocation.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
    let join = ctx.new_event(None).map_err(driver("cuEventCreate"))?;
    let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver("cuDeviceGetAttribute"))?;
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver("cuDeviceGetAttribute"))?;
    let l2 = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(driver("cuDeviceGetAttribute"))?;
    Ok(Device {
        backend: Backend::Gpu(Arc::new(Gpu {
            ctx,
            stream,
            ordinal,
            name,
            driver_version,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            num_sms: sms.max(0) as u32,
            l2_bytes: l2.max(0) as usize,
            join,
        })),
    })
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}
