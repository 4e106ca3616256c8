//! CUDA graphs of work made of plans' launches (a whole decode step): captured once from
//! the calls that queue it, then replayed with whatever the buffers it reads hold at the
//! time. A replay costs one driver call, whatever the launches inside; what changes
//! between steps (queries, token lists written on the device) must live in the same
//! buffers, since the graph holds their addresses.

use crate::device::{Backend, Device};
use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::{sys, CudaGraph};

/// Work captured by [`Device::capture`], replayed by [`Graph::replay`].
pub struct Graph {
    graph: CudaGraph,
}

impl Device {
    /// Captures the work `queue` sends to this device's stream into a graph, without
    /// running it (nothing runs until [`Graph::replay`]). `queue` must neither allocate
    /// nor synchronise, as a plan's `run` or `step` does not; an error from it ends the
    /// capture and is returned as [`RuntimeError::Captured`]. On
    /// the CPU there is no graph: an error naming the device.
    pub fn capture<E>(&self, queue: impl FnOnce() -> std::result::Result<(), E>) -> Result<Graph>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Backend::Gpu(g) = &self.backend else {
            return Err(RuntimeError::InvalidLaunch {
                kernel: "a captured graph".into(),
                msg: "CUDA graphs need a GPU; on the CPU call the work directly".into(),
            });
        };
        g.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        g.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("cuStreamBeginCapture"))?;
        let queued = queue();
        let graph = g
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver("cuStreamEndCapture"));
        queued.map_err(|e| RuntimeError::Captured(e.into()))?;
        let graph = graph?.ok_or_else(|| RuntimeError::InvalidLaunch {
            kernel: "a captured graph".into(),
            msg: "the capture recorded no work".into(),
        })?;
        graph.upload().map_err(driver("cuGraphUpload"))?;
        Ok(Graph { graph })
    }
}

impl Graph {
    /// Queues the captured work on the stream it was captured from: no host sync.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().map_err(driver("cuGraphLaunch"))
    }
}
