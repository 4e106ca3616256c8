//! Timing: CUDA events on the GPU (what the GPU spent, not what the host waited), a
//! monotonic clock on the CPU, and the median the benchmarks report.

use crate::device::{Backend, Device};
use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::sys::CUevent_flags;
use std::time::Instant;

impl Device {
    /// Runs `f` `warmup` times untimed, then `iters` times, and returns each timed run's
    /// duration in microseconds.
    ///
    /// On the GPU each run is bracketed by two events recorded on the device's stream
    /// (made with `CU_EVENT_DEFAULT`: events made without timing cannot be timed), so the
    /// figure is the GPU time of the work `f` queued on this device, launch gaps within
    /// `f` included. On the CPU it is wall-clock time. An error from `f` stops the loop
    /// and is returned as [`RuntimeError::Timed`].
    pub fn time_us<E>(
        &self,
        iters: usize,
        warmup: usize,
        mut f: impl FnMut() -> Result<(), E>,
    ) -> Result<Vec<f64>>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut call = || f().map_err(|e| RuntimeError::Timed(e.into()));
        for _ in 0..warmup {
            call()?;
        }
        match &self.backend {
            Backend::Cpu => (0..iters)
                .map(|_| {
                    let t = Instant::now();
                    call()?;
                    Ok(t.elapsed().as_secs_f64() * 1e6)
                })
                .collect(),
            Backend::Gpu(g) => {
                // Events are made up front so their creation is not timed.
                let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
                let mut events = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let start = g.ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
                    let end = g.ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
                    events.push((start, end));
                }
                for (start, end) in &events {
                    start.record(&g.stream).map_err(driver("cuEventRecord"))?;
                    call()?;
                    end.record(&g.stream).map_err(driver("cuEventRecord"))?;
                }
                g.stream
                    .synchronize()
                    .map_err(driver("cuStreamSynchronize"))?;
                events
                    .iter()
                    .map(|(s, e)| {
                        s.elapsed_ms(e)
                            .map(|ms| ms as f64 * 1e3)
                            .map_err(driver("cuEventElapsedTime"))
                    })
                    .collect()
            }
        }
    }
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
