//! The timing harness: how every dusk figure is measured, and the rule the Python peers
//! (`benches/baselines/harness.py`) follow too, so that both sides of a ratio are timed
//! alike.
//!
//! - Inputs rotate: a call's inputs come in [`rotation_sets`] copies, together more than
//!   twice the L2, so each call reads from DRAM as it would in a model step.
//! - GPU time only: the calls of one measurement ([`TimeConfig::min_calls`] or more, the
//!   sets in turn) are captured once in a CUDA graph; each replay is bracketed by two events
//!   and divided by its calls. The host's cost of launching (argument checks, the driver)
//!   stays out of the window, as it does in an engine that replays its decode step. Where a
//!   call cannot be captured, the same calls are queued between two events instead (never
//!   one call with a sync after it). [`Measured::timing`] says which.
//! - On the CPU (the interpreter) it is wall-clock time over a few rounds.

use crate::device::{Backend, Device, Gpu};
use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::sys;
use std::time::Instant;

/// How a side's calls were timed. Every result case records it for both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Captured in a CUDA graph and replayed (GPU time only).
    Graph,
    /// Queued back to back between two events (GPU time, launch gaps included).
    Queued,
    /// Wall-clock time on the CPU interpreter.
    Cpu,
}

impl Timing {
    /// The name results use: `graph`, `queued` or `cpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Graph => "graph",
            Timing::Queued => "queued",
            Timing::Cpu => "cpu",
        }
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many calls a measurement takes and how often it is repeated. The defaults are the
/// harness's rule; `harness.py` uses the same numbers.
#[derive(Clone, Debug)]
pub struct TimeConfig {
    /// Calls in one measurement, at least: rounded up to a whole number of turns through
    /// the rotation sets.
    pub min_calls: usize,
    /// Timed measurements (replays of the graph); the samples are their per-call times.
    pub replays: usize,
    /// Untimed replays before them.
    pub warmup: usize,
    /// Try a CUDA graph first (else queue the calls between events at once).
    pub graph: bool,
    /// Rounds on the CPU interpreter, which is slow (each round calls every set once).
    pub cpu_rounds: usize,
}

impl Default for TimeConfig {
    fn default() -> Self {
        TimeConfig {
            min_calls: 20,
            replays: 15,
            warmup: 1,
            graph: true,
            cpu_rounds: 3,
        }
    }
}

/// Per-call times of one measured side, and how they were taken.
#[derive(Clone, Debug)]
pub struct Measured {
    /// One sample a timed replay (or CPU round): its time divided by its calls, in us.
    pub samples_us: Vec<f64>,
    pub timing: Timing,
    /// Calls in each sample.
    pub calls: usize,
    /// Why the graph was not used, when `timing` is [`Timing::Queued`] after a failed
    /// capture.
    pub graph_error: Option<String>,
}

impl Measured {
    /// The median per-call time in microseconds.
    pub fn median_us(&self) -> f64 {
        median(&self.samples_us)
    }
}

/// How many copies of a call's inputs to rotate through so that together they exceed
/// twice the L2: `2 * l2_bytes / bytes_per_set + 1` (at least one). `bytes_per_set` is
/// what one call must read.
pub fn rotation_sets(bytes_per_set: usize, l2_bytes: usize) -> usize {
    2 * l2_bytes / bytes_per_set.max(1) + 1
}

impl Device {
    /// The GPU's L2 cache in bytes; `None` on the CPU.
    pub fn l2_bytes(&self) -> Option<usize> {
        self.gpu_inner().map(|g| g.l2_bytes)
    }

    /// [`rotation_sets`] for this device's L2 (1 on the CPU, which has no L2 to beat).
    pub fn rotation_sets(&self, bytes_per_set: usize) -> usize {
        self.l2_bytes()
            .map_or(1, |l2| rotation_sets(bytes_per_set, l2))
    }

    /// The device-to-device copy rate in GB/s (bytes read plus bytes written per second)
    /// of `bytes` each way: the yardstick every figure is a fraction of. The copies are
    /// queued between events, not replayed from a graph: a copy captured in a graph ran
    /// at 2438 GB/s on an H100 where the same copies queued ran at about 3000.
    pub fn copy_gbps(&self, bytes: usize) -> Result<f64> {
        let src = self.alloc::<u8>(bytes)?;
        let mut dst = self.alloc::<u8>(bytes)?;
        let queued = TimeConfig {
            graph: false,
            ..TimeConfig::default()
        };
        let t = self.time_calls_with(&queued, 1, |_| dst.copy_from(&src))?;
        Ok(2.0 * bytes as f64 / (t.median_us() * 1e-6) / 1e9)
    }

    /// Times `call(set)` with the harness's default rule ([`TimeConfig::default`]);
    /// `call` queues one call on this device over rotation set `set` (`0..sets`) and must
    /// neither allocate nor synchronise for the graph to hold it.
    pub fn time_calls<E>(
        &self,
        sets: usize,
        call: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<Measured>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.time_calls_with(&TimeConfig::default(), sets, call)
    }

    /// [`Device::time_calls`] with another rule. Each set is first called once eagerly
    /// (module loads and first-launch work stay out of the figures). An error from `call`
    /// outside a capture is returned as [`RuntimeError::Timed`]. The capture and the events
    /// are on the device's own stream: launches `call` sends elsewhere (inside
    /// [`Device::with_stream`]) are not timed.
    pub fn time_calls_with<E>(
        &self,
        cfg: &TimeConfig,
        sets: usize,
        mut call: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<Measured>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let sets = sets.max(1);
        let mut call = |i: usize| call(i % sets).map_err(|e| RuntimeError::Timed(e.into()));
        for i in 0..sets {
            call(i)?;
        }
        match &self.backend {
            Backend::Cpu => {
                let rounds = cfg.cpu_rounds.max(1);
                let mut samples = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let t = Instant::now();
                    for i in 0..sets {
                        call(i)?;
                    }
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / sets as f64);
                }
                Ok(Measured {
                    samples_us: samples,
                    timing: Timing::Cpu,
                    calls: sets,
                    graph_error: None,
                })
            }
            Backend::Gpu(g) => {
                g.stream
                    .synchronize()
                    .map_err(driver("cuStreamSynchronize"))?;
                let calls = sets * cfg.min_calls.max(1).div_ceil(sets);
                let mut graph_error = None;
                if cfg.graph {
                    match graph_samples(g, cfg, calls, &mut call) {
                        Ok(samples) => {
                            return Ok(Measured {
                                samples_us: samples,
                                timing: Timing::Graph,
                                calls,
                                graph_error: None,
                            })
                        }
                        Err(e) => graph_error = Some(e.to_string()),
                    }
                }
                let samples = replay_samples(g, cfg, calls, || {
                    for i in 0..calls {
                        call(i)?;
                    }
                    Ok(())
                })?;
                Ok(Measured {
                    samples_us: samples,
                    timing: Timing::Queued,
                    calls,
                    graph_error,
                })
            }
        }
    }
}

/// Captures `calls` calls in one graph and times its replays. Any failure (a call the
/// graph cannot hold, a driver error) ends the capture and is returned, so the caller
/// can queue the calls instead.
fn graph_samples(
    g: &Gpu,
    cfg: &TimeConfig,
    calls: usize,
    call: &mut impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f64>> {
    g.stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver("cuStreamBeginCapture"))?;
    let captured = (0..calls).try_for_each(&mut *call);
    let graph = g
        .stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(driver("cuStreamEndCapture"));
    captured?;
    let graph = graph?.ok_or_else(|| RuntimeError::Timed("the capture recorded no work".into()))?;
    graph.upload().map_err(driver("cuGraphUpload"))?;
    replay_samples(g, cfg, calls, || {
        graph.launch().map_err(driver("cuGraphLaunch"))
    })
}

/// Runs `replay` `cfg.warmup` times, then `cfg.replays` times each between two events,
/// and returns each timed replay's time divided by `calls`, in microseconds.
fn replay_samples(
    g: &Gpu,
    cfg: &TimeConfig,
    calls: usize,
    mut replay: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    for _ in 0..cfg.warmup {
        replay()?;
    }
    // Events are made up front so their creation is not timed; `CU_EVENT_DEFAULT`, as
    // events made without timing cannot be timed.
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let replays = cfg.replays.max(1);
    let mut events = Vec::with_capacity(replays);
    for _ in 0..replays {
        let start = g.ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
        let end = g.ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
        events.push((start, end));
    }
    for (start, end) in &events {
        start.record(&g.stream).map_err(driver("cuEventRecord"))?;
        replay()?;
        end.record(&g.stream).map_err(driver("cuEventRecord"))?;
    }
    g.stream
        .synchronize()
        .map_err(driver("cuStreamSynchronize"))?;
    events
        .iter()
        .map(|(s, e)| {
            s.elapsed_ms(e)
                .map(|ms| ms as f64 * 1e3 / calls as f64)
                .map_err(driver("cuEventElapsedTime"))
        })
        .collect()
}

/// The median of `xs` (the mean of the two middle values for an even count); NaN when
/// `xs` is empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
