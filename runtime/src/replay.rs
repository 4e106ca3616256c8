//! One submission for a call's launches: a call that queues several kernels (a plan's
//! `run`: the attention's split and merge) is recorded as a CUDA graph at its first call,
//! and every call then submits that graph once, with the arguments that changed since the
//! previous call patched into its nodes first. A launch is most of an eager call's host
//! time (about 3 us on the H100 and H200 machines, python/benches/host_overhead.py); a
//! graph launch of two kernels costs about one.
//!
//! Only eager calls are replayed: under a stream capture (the caller's CUDA graph) the
//! launches go to the stream as they are, so the caller's graph records them as before.
//! A call with one launch is launched directly (a graph would save nothing).

use crate::device::{Backend, Device, Gpu};
use crate::error::{driver, Result, RuntimeError};
use crate::kernel::{Arg, GpuKernel};
use crate::launch::{launch_raw, slot};
use cudarc::driver::{sys, CudaFunction};
use std::cell::RefCell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

thread_local! {
    /// Launches recorded on this thread while [`Device::replay`] runs its call: (the
    /// device's `Gpu` address, the launches so far).
    static RECORDING: RefCell<Option<(usize, Vec<Launch>)>> = const { RefCell::new(None) };
}

/// One launch of a call, as [`Device::launch`] would have queued it.
#[derive(Clone)]
pub(crate) struct Launch {
    func: CudaFunction,
    early_start: bool,
    grid: [u32; 3],
    threads: u32,
    /// The arguments' parameter slots (see [`slot`]).
    slots: Vec<u64>,
}

impl Launch {
    /// Whether `other` launches the same kernel over the same grid (its arguments aside).
    fn same_kernel(&self, other: &Launch) -> bool {
        self.func.cu_function() == other.func.cu_function()
            && self.early_start == other.early_start
            && self.grid == other.grid
            && self.threads == other.threads
            && self.slots.len() == other.slots.len()
    }

    /// Launches it on `stream` (bound to this thread).
    fn launch(&self, stream: sys::CUstream) -> Result<()> {
        let mut slots = self.slots.clone();
        let mut params: Vec<*mut c_void> =
            slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
        // SAFETY: the slots were made from arguments checked against the kernel's
        // parameters when the launch was recorded (`Device::launch`); `params` points at
        // them, alive until the call returns; the caller bound the stream's context.
        unsafe {
            launch_raw(
                stream,
                &self.func,
                self.early_start,
                self.grid,
                self.threads,
                params.as_mut_ptr(),
            )
        }
    }
}

/// Records the launch instead of queueing it when this thread is inside a
/// [`Device::replay`] call for `g`; false otherwise (the caller launches it).
pub(crate) fn record(
    g: &Arc<Gpu>,
    gk: &GpuKernel,
    grid: [u32; 3],
    threads: u32,
    args: &[Arg<'_>],
) -> bool {
    let key = Arc::as_ptr(g) as usize;
    RECORDING.with(|r| match r.borrow_mut().as_mut() {
        Some((k, launches)) if *k == key => {
            launches.push(Launch {
                func: gk.func.clone(),
                early_start: gk.early_start,
                grid,
                threads,
                slots: args.iter().map(slot).collect(),
            });
            true
        }
        _ => false,
    })
}

/// The graph [`Device::replay`] submits for one call site (a plan's `run`): made at its
/// first eager call, remade only if the call's kernels or grids change. Empty on the CPU.
#[derive(Default)]
pub struct Replay {
    /// The launches of the latest call (kept to reuse their memory).
    calls: Vec<Launch>,
    graph: Option<ReplayGraph>,
}

/// An instantiated graph of a call's launches, a node a launch, and each node's arguments
/// as last set.
struct ReplayGraph {
    gpu: Arc<Gpu>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    launches: Vec<Launch>,
}

// SAFETY: the graph handles are the driver's, usable from any thread with their context
// bound (every use binds it); `Replay` has no interior mutability, so sharing `&Replay`
// between threads allows nothing.
unsafe impl Send for ReplayGraph {}
unsafe impl Sync for ReplayGraph {}

impl Device {
    /// Runs `call` (which queues launches on this device, as a plan's `run` does) with its
    /// launches recorded rather than queued, then queues them as one submission: the graph
    /// of `replay`, made at the first call and patched with the arguments that changed
    /// since (see the module docs). When the launch stream is being captured, or on the
    /// CPU, `call` runs as it is. An error from `call` queues nothing.
    ///
    /// ```
    /// use dusk_runtime::{Device, Replay, RuntimeError};
    ///
    /// let dev = Device::best();
    /// let mut replay = Replay::default(); // one per call site, e.g. kept with a plan
    /// for step in 0..3 {
    ///     // What a plan's `run` does: checks, then `dev.launch(..)` of its kernels.
    ///     let r: Result<i32, RuntimeError> = dev.replay(&mut replay, || Ok(step));
    ///     assert_eq!(r.unwrap(), step);
    /// }
    /// ```
    pub fn replay<R, E: From<RuntimeError>>(
        &self,
        replay: &mut Replay,
        call: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let Backend::Gpu(g) = &self.backend else {
            return call();
        };
        let stream = g.launch_stream();
        if capturing(stream) {
            return call();
        }
        /// Puts back the recording of an enclosing call (none, usually), also on unwind.
        struct Restore(Option<(usize, Vec<Launch>)>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let outer = self.0.take();
                RECORDING.with(|r| *r.borrow_mut() = outer);
            }
        }
        let mut launches = std::mem::take(&mut replay.calls);
        launches.clear();
        let key = Arc::as_ptr(g) as usize;
        let restore = Restore(RECORDING.with(|r| r.replace(Some((key, launches)))));
        let out = call();
        if let Some((_, launches)) = RECORDING.with(|r| r.borrow_mut().take()) {
            replay.calls = launches;
        }
        drop(restore);
        let out = out?;
        replay.submit(g, stream)?;
        Ok(out)
    }
}

/// Whether `stream` is being captured (or cannot be asked, as the legacy stream while
/// another stream captures globally): its launches then go to it as they are.
fn capturing(stream: sys::CUstream) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one status; fails cleanly for a stream in a bad state.
    let r = unsafe { sys::cuStreamIsCapturing(stream, &mut status) };
    r != sys::CUresult::CUDA_SUCCESS
        || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

impl Replay {
    /// Queues the recorded launches on `stream`.
    fn submit(&mut self, g: &Arc<Gpu>, stream: sys::CUstream) -> Result<()> {
        g.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        match &self.calls[..] {
            [] => return Ok(()),
            [one] => return one.launch(stream),
            _ => {}
        }
        let reusable = self.graph.as_ref().is_some_and(|rg| {
            Arc::ptr_eq(&rg.gpu, g)
                && rg.launches.len() == self.calls.len()
                && rg
                    .launches
                    .iter()
                    .zip(&self.calls)
                    .all(|(a, b)| a.same_kernel(b))
        });
        if !reusable {
            self.graph = None;
            self.graph = Some(ReplayGraph::record(g, &self.calls)?);
        }
        let rg = self.graph.as_mut().expect("made above");
        for ((node, set), call) in rg.nodes.iter().zip(&mut rg.launches).zip(&self.calls) {
            if set.slots != call.slots {
                set_args(rg.exec, *node, call)?;
                set.slots.clone_from(&call.slots);
            }
        }
        // SAFETY: an executable graph of this context (bound above); `stream` belongs to it.
        unsafe { sys::cuGraphLaunch(rg.exec, stream) }
            .result()
            .map_err(driver("cuGraphLaunch"))
    }
}

/// Sets the arguments of kernel node `node` of `exec` to `call`'s.
fn set_args(exec: sys::CUgraphExec, node: sys::CUgraphNode, call: &Launch) -> Result<()> {
    let mut slots = call.slots.clone();
    let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
    let p = sys::CUDA_KERNEL_NODE_PARAMS_v2 {
        func: call.func.cu_function(),
        gridDimX: call.grid[0],
        gridDimY: call.grid[1],
        gridDimZ: call.grid[2],
        blockDimX: call.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: params.as_mut_ptr(),
        extra: null_mut(),
        kern: null_mut(),
        ctx: null_mut(),
    };
    // SAFETY: `node` is a kernel node of the graph `exec` was made from, launching the same
    // function over the same grid (checked by the caller); the parameters point at slots
    // of arguments checked when recorded, alive until the call returns (the driver copies
    // them).
    unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &p) }
        .result()
        .map_err(driver("cuGraphExecKernelNodeSetParams"))
}

impl ReplayGraph {
    /// Captures `calls` into a graph, on a stream of its own (nothing else is queued on it
    /// meanwhile), and instantiates it. Nothing runs.
    fn record(g: &Arc<Gpu>, calls: &[Launch]) -> Result<ReplayGraph> {
        let side = g.ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let s = side.cu_stream();
        // SAFETY: a stream of this context, bound by the caller.
        unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .result()
        .map_err(driver("cuStreamBeginCapture"))?;
        let mut nodes = Vec::with_capacity(calls.len());
        let queued = calls.iter().try_for_each(|c| {
            c.launch(s)?;
            nodes.push(last_node(s)?);
            Ok::<(), RuntimeError>(())
        });
        let mut graph: sys::CUgraph = null_mut();
        // SAFETY: ends the capture begun above, whatever happened in between.
        let ended = unsafe { sys::cuStreamEndCapture(s, &mut graph) }
            .result()
            .map_err(driver("cuStreamEndCapture"));
        let made = queued.and(ended).and_then(|()| {
            let mut exec: sys::CUgraphExec = null_mut();
            // SAFETY: a graph just captured, of kernel nodes of this context.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
                .result()
                .map_err(driver("cuGraphInstantiate"))?;
            Ok(exec)
        });
        match made {
            Ok(exec) => Ok(ReplayGraph {
                gpu: g.clone(),
                graph,
                exec,
                nodes,
                launches: calls.to_vec(),
            }),
            Err(e) => {
                if !graph.is_null() {
                    // SAFETY: the graph captured above, used by nothing.
                    unsafe { sys::cuGraphDestroy(graph) };
                }
                Err(e)
            }
        }
    }
}

/// The node the last launch on capturing stream `s` added (the capture's one dependency).
fn last_node(s: sys::CUstream) -> Result<sys::CUgraphNode> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: writes the capture's status and a pointer to its dependencies (owned by the
    // driver, valid until the next call on the stream), read at once.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s,
            &mut status,
            null_mut(),
            null_mut(),
            &mut deps,
            &mut edges,
            &mut n,
        )
    }
    .result()
    .map_err(driver("cuStreamGetCaptureInfo"))?;
    if n != 1 || deps.is_null() {
        return Err(RuntimeError::InvalidLaunch {
            kernel: "a replayed call".into(),
            msg: format!("the capture of its launches has {n} last nodes, not one"),
        });
    }
    // SAFETY: `n` is 1: one node at `deps`.
    Ok(unsafe { *deps })
}

impl Drop for ReplayGraph {
    fn drop(&mut self) {
        // SAFETY: the handles were made in this context and are used by nothing else; a
        // launch still running keeps what it needs (the driver defers the release).
        let _ = self.gpu.ctx.bind_to_thread();
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}
