"""The timing rule every peer script here follows: the same rule as dusk's own harness
(`Device::time_calls` in runtime/src/timing.rs, with the same constants), so that both
sides of a ratio are timed alike (DESIGN.md section 6).

- Inputs rotate: a call's inputs come in `rotation_sets(bytes_per_set)` copies, together
  more than twice the L2, so that each call reads from DRAM as it would in a model step.
  `bytes_per_set` is what one call must read (the inputs that dominate).
- GPU time only: one measurement is `calls = len(fns) * ceil(min_calls / len(fns))` calls,
  cycling through `fns` (one zero-argument callable per rotated input set) in order. Each
  callable is first run once eagerly on a side stream (compilation, lazy initialisation
  and module loads stay out of the figures); then the calls are captured once in a
  `torch.cuda.CUDAGraph`, replayed `warmup` times untimed and `replays` times each between
  two CUDA events recorded outside the graph. A sample is one replay's time divided by
  `calls`; the figure is the median sample, in microseconds. The host's cost of launching
  (Python, the framework's dispatch, the driver) stays out of the window.
- Where the capture or a replay fails, the same `calls` calls are queued back to back
  between two events instead, `warmup` rounds untimed then `replays` timed rounds, and the
  figure is again the median per call ("queued": GPU time with launch gaps included). Never
  one call with a sync after it.

API: `l2_bytes()`, `rotation_sets(bytes_per_set)`, `time_calls(fns, ...) -> (median_us,
how)`, `measure(fns, ...) -> Measured` (the samples too), `copy_gbps()`, and `put(entry,
prefix, measured)`, which writes `<prefix>_us`, `<prefix>_timing` ("graph" or "queued")
and `<prefix>_spread_us` ([min, p10, p50, p90, max]) into a result case; `run_cases(case,
seed)`, the command line of a peer script whose cases are the selector benchmarks' shapes.
"""
import argparse
import ctypes
import json
import math

import torch

# The harness's rule (runtime/src/timing.rs `TimeConfig::default()` uses the same numbers).
MIN_CALLS = 20
REPLAYS = 15
WARMUP = 1
# The device-to-device copy that every bandwidth figure is a fraction of: 1 GiB each way.
COPY_BYTES = 1 << 30

# Everything CUDA goes through this name, so that a test can put a fake in its place.
cuda = torch.cuda


def l2_bytes():
    """The L2 cache of device 0 in bytes."""
    return cuda.get_device_properties(0).L2_cache_size


def rotation_sets(bytes_per_set):
    """How many copies of a call's inputs to rotate through so that together they exceed
    twice the L2: `2 * l2_bytes() // max(bytes_per_set, 1) + 1`."""
    return 2 * l2_bytes() // max(int(bytes_per_set), 1) + 1


def median(xs):
    """The median (the mean of the two middle values for an even count); NaN when empty."""
    v = sorted(xs)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def spread(xs):
    """[min, p10, p50, p90, max] of `xs`, nearest rank (as gpu-check's `spread`)."""
    v = sorted(xs)
    if not v:
        return []
    return [v[int(math.floor((len(v) - 1) * q + 0.5))] for q in (0.0, 0.1, 0.5, 0.9, 1.0)]


class Measured:
    """Per-call times of one measured side and how they were taken."""

    def __init__(self, samples_us, timing, calls, graph_error=None):
        self.samples_us = list(samples_us)  # one a timed replay (or round): time / calls
        self.timing = timing  # "graph" or "queued"
        self.calls = calls  # calls in each sample
        self.graph_error = graph_error  # why the graph was not used, when queued

    @property
    def median_us(self):
        return median(self.samples_us)

    def spread_us(self):
        return spread(self.samples_us)

    def __repr__(self):
        return f"Measured({self.median_us:.2f} us, {self.timing}, {self.calls} calls)"


class CaptureFailed(RuntimeError):
    pass


def calls_for(sets, min_calls=MIN_CALLS):
    """Calls in one measurement: `min_calls` or more, a whole number of turns through the sets."""
    sets = max(sets, 1)
    return sets * math.ceil(max(min_calls, 1) / sets)


def measure(fns, min_calls=MIN_CALLS, replays=REPLAYS, warmup=WARMUP, graph=True):
    """Times `fns` (zero-argument callables, one per rotated input set) by the rule above.
    An exception from a callable's eager first run propagates (the callable itself is
    broken); one during the capture or a replay makes the calls queued instead.
    `graph=False` queues them from the start (the copy yardstick, as dusk's copy_gbps)."""
    fns = list(fns)
    if not fns:
        raise ValueError("measure: no callables")
    calls = calls_for(len(fns), min_calls)
    seq = [fns[i % len(fns)] for i in range(calls)]
    side = cuda.Stream()
    _eager(fns, side)
    graph_error = None
    if graph:
        try:
            samples = _graph_samples(seq, calls, replays, warmup, side)
            return Measured(samples, "graph", calls)
        except Exception as e:  # noqa: BLE001 -- any capture or replay failure: queue instead
            graph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            _recover()

    def queue():
        for f in seq:
            f()  # each call's result dropped at once, as in the graph

    samples = _replay_samples(queue, calls, replays, warmup)
    return Measured(samples, "queued", calls, graph_error)


def time_calls(fns, min_calls=MIN_CALLS, replays=REPLAYS, warmup=WARMUP):
    """`(median_us, how)`: the median per-call time in microseconds and "graph" or "queued"."""
    m = measure(fns, min_calls, replays, warmup)
    return m.median_us, m.timing


def put(entry, prefix, m):
    """Writes measurement `m` into result case `entry` as `<prefix>_us`, `<prefix>_timing`,
    `<prefix>_spread_us` (and `<prefix>_graph_error` when a capture failed)."""
    entry[f"{prefix}_us"] = m.median_us
    entry[f"{prefix}_timing"] = m.timing
    entry[f"{prefix}_spread_us"] = m.spread_us()
    if m.graph_error:
        entry[f"{prefix}_graph_error"] = m.graph_error
    return entry


def measure_copy(nbytes=COPY_BYTES):
    """`(gbps, Measured)` of a device-to-device copy of `nbytes` (bytes read plus bytes
    written per second), queued between events as dusk's `Device::copy_gbps` times it (a
    copy captured in a graph ran at 2438 GB/s on an H100, about 20% below the same copies
    queued)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0x5A)
    b = torch.empty_like(a)
    m = measure([lambda: b.copy_(a)], graph=False)
    del a, b
    cuda.empty_cache()
    return 2 * nbytes / (m.median_us * 1e-6) / 1e9, m


def copy_gbps():
    """The device-to-device copy rate of 1 GiB each way, in GB/s (read + written)."""
    return measure_copy()[0]


def _eager(fns, side):
    """Each callable once, on a side stream (as PyTorch asks before a capture)."""
    side.wait_stream(cuda.current_stream())
    with cuda.stream(side):
        for f in fns:
            f()
    cuda.current_stream().wait_stream(side)
    cuda.synchronize()


def _graph_samples(seq, calls, replays, warmup, stream):
    """Captures `seq` in one graph on `stream` and times its replays. The capture is always
    ended (and the previous stream restored) before an error leaves."""
    graph = cuda.CUDAGraph()
    cuda.synchronize()
    cuda.empty_cache()  # what the eager runs left cached, free for the graph's own pool
    err = None
    try:
        with cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for f in seq:
                    f()
            except Exception as e:  # noqa: BLE001
                err = e
            finally:
                try:
                    graph.capture_end()
                except Exception as e:  # noqa: BLE001
                    err = err or e
        if err is not None:
            raise CaptureFailed(f"capture: {err}") from err
        return _replay_samples(graph.replay, calls, replays, warmup)
    finally:
        try:
            cuda.synchronize()  # nothing of the graph still running when it goes
            graph.reset()
        except Exception:  # noqa: BLE001
            pass
        del graph


def _replay_samples(replay, calls, replays, warmup):
    """Runs `replay` `warmup` times, then `replays` times each between two events (made up
    front, so their creation is not timed); returns each timed replay's time / `calls`, us."""
    for _ in range(warmup):
        replay()
    events = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
              for _ in range(max(replays, 1))]
    for start, end in events:
        start.record()
        replay()
        end.record()
    cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 / calls for start, end in events]


def _recover():
    """After a failed capture: wait for the device, clear the runtime's last error (a
    capture error is not sticky, but a stale one would fail the next launch check), free
    the graph's memory."""
    try:
        cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
    _clear_last_error()
    try:
        cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _clear_last_error():
    """cudaGetLastError() on the CUDA runtime this process loaded (best effort)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return
    for path in paths:
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            pass


# The selector benchmarks' shapes (gpu-check selectors): (batch, query heads, KV heads,
# context), GQA 32/8 and MHA 32/32 at 32k, batch 32 and 64.
SELECTOR_SHAPES = [(b, 32, hkv, 32768) for b in (32, 64) for hkv in (8, 32)]


def run_cases(case, seed, shapes=SELECTOR_SHAPES):
    """A peer script's command line (`--out FILE`): the device and the copy rate, then
    `case(*shape, gen)` for every shape (`gen` a CUDA generator seeded with `seed`), each
    result case printed as it comes and all written to FILE."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    copy, copy_m = measure_copy()
    result = {"device": cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": l2_bytes(),
              "copy_gbps": copy, "copy_timing": copy_m.timing, "cases": []}
    for shape in shapes:
        entry = case(*shape, gen)
        print(json.dumps(entry), flush=True)
        result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
