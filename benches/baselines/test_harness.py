"""harness.py's rule on a fake CUDA (no GPU, no torch needed):

    python3 benches/baselines/test_harness.py

rotation arithmetic, calls per measurement, the graph path (events outside the graph,
per-call time = replay time / calls), the fallback to queued calls after a failed capture
(capture ended, stream restored, the next capture works), errors of a callable's eager run
propagated, and the JSON fields `put` writes.
"""
import contextlib
import math
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch  # noqa: F401
except ImportError:  # the harness only needs torch.cuda, which the test replaces
    sys.modules["torch"] = types.SimpleNamespace(cuda=None)
import harness as h  # noqa: E402

class Fake:
    def __init__(self, l2):
        self.l2 = l2
        self.clock_ms = 0.0
        self.capturing = None  # list of ops while a capture is open
        self.stream_stack = ["default"]
        self.last_error = None
        self.syncs = 0
        self.graphs = []
    # device
    def get_device_properties(self, i):
        return type("P", (), {"L2_cache_size": self.l2})()
    def synchronize(self):
        self.syncs += 1
    def empty_cache(self):
        pass
    # streams
    def Stream(self):
        return FakeStream(self)
    def current_stream(self):
        return FakeStream(self, self.stream_stack[-1])
    @contextlib.contextmanager
    def stream(self, s):
        self.stream_stack.append(s.name)
        try:
            yield
        finally:
            self.stream_stack.pop()
    def Event(self, enable_timing=False):
        assert enable_timing
        return FakeEvent(self)
    def CUDAGraph(self):
        g = FakeGraph(self)
        self.graphs.append(g)
        return g
    # work
    def kernel(self, us, capturable=True):
        def run():
            if self.capturing is not None:
                if not capturable:
                    self.capture_invalid = True
                    raise RuntimeError("operation not permitted when stream is capturing")
                self.capturing.append(us)
            else:
                self.clock_ms += us / 1e3
                self.calls_run.append(us)
        return run

class FakeStream:
    n = 0
    def __init__(self, fake, name=None):
        FakeStream.n += 1
        self.fake, self.name = fake, name or f"side{FakeStream.n}"
    def wait_stream(self, other):
        pass

class FakeEvent:
    def __init__(self, fake):
        self.fake, self.t = fake, None
    def record(self):
        assert self.fake.capturing is None, "events are recorded outside the graph"
        self.t = self.fake.clock_ms
    def elapsed_time(self, end):
        return end.t - self.t

class FakeGraph:
    def __init__(self, fake):
        self.fake, self.ops, self.ok, self.reset_called = fake, None, False, False
    def capture_begin(self, capture_error_mode="global"):
        assert self.fake.stream_stack[-1] != "default", "capture on a side stream"
        self.fake.capturing, self.fake.capture_invalid = [], False
    def capture_end(self):
        ops, self.fake.capturing = self.fake.capturing, None
        if self.fake.capture_invalid:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        self.ops, self.ok = ops, True
    def replay(self):
        assert self.ok
        for us in self.ops:
            self.fake.clock_ms += us / 1e3
            self.fake.calls_run.append(us)
    def reset(self):
        self.reset_called = True

def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
    print("ok:", msg)

fake = Fake(l2=50 * 2**20)
h.cuda = fake

# rotation_sets: 2 * L2 // bytes + 1, and together the sets exceed twice the L2.
for b in [1, 1000, 4 << 20, 25 << 20, 50 << 20, 100 << 20, (100 << 20) + 1, 1 << 30, 0]:
    n = h.rotation_sets(b)
    check(n == 2 * fake.l2 // max(b, 1) + 1 and n >= 1 and n * max(b, 1) > 2 * fake.l2,
          f"rotation_sets({b}) = {n}")
check(h.l2_bytes() == 50 * 2**20, "l2_bytes from the device properties")
# calls: a whole number of turns, at least min_calls.
for sets, want in [(1, 20), (3, 21), (20, 20), (26, 26), (7, 21)]:
    check(h.calls_for(sets) == want, f"calls_for({sets}) = {want}")

# Graph path: 3 sets of different costs; per-call = mean cost over a turn.
fake.calls_run = []
fns = [fake.kernel(10.0), fake.kernel(20.0), fake.kernel(30.0)]
m = h.measure(fns)
check(m.timing == "graph" and m.calls == 21, f"graph path: {m}")
check(abs(m.median_us - 20.0) < 1e-9, f"per-call time = replay / calls ({m.median_us})")
check(len(m.samples_us) == h.REPLAYS, "15 samples")
# eager: each set once (3), warm-up replay (21), 15 timed replays (315)
check(len(fake.calls_run) == 3 + 21 + 15 * 21, f"calls run: {len(fake.calls_run)}")
check(fake.graphs[-1].reset_called, "graph freed after timing")
check(fake.stream_stack == ["default"], "current stream restored")
us, how = h.time_calls(fns)
check(abs(us - 20.0) < 1e-9 and how == "graph", "time_calls returns (median_us, 'graph')")

# Queued fallback: one set cannot be captured.
fake.calls_run = []
bad = [fake.kernel(10.0), fake.kernel(30.0, capturable=False)]
m = h.measure(bad, min_calls=5)
check(m.timing == "queued" and m.calls == 6, f"fallback: {m}")
check(abs(m.median_us - 20.0) < 1e-9, "queued per-call time")
check("capture" in (m.graph_error or ""), f"graph_error recorded: {m.graph_error}")
check(fake.capturing is None and fake.stream_stack == ["default"], "capture ended, stream restored")
# eager 2 + warm-up round 6 + 15 rounds of 6 (none ran inside the failed capture)
check(len(fake.calls_run) == 2 + 6 + 15 * 6, f"queued calls run: {len(fake.calls_run)}")
# ... and the next measurement captures again.
check(h.time_calls([fake.kernel(5.0)])[1] == "graph", "process usable: next capture works")

# An error in a callable's eager run propagates (not hidden as 'queued').
def broken():
    raise ValueError("broken peer")
try:
    h.measure([broken])
    check(False, "eager error propagates")
except ValueError:
    check(True, "eager error propagates")

# put and spread
e = {}
h.put(e, "flashinfer", h.Measured([5, 1, 4, 2, 3], "graph", 20))
check(e == {"flashinfer_us": 3, "flashinfer_timing": "graph", "flashinfer_spread_us": [1, 1, 3, 5, 5]}, f"put: {e}")
check(h.spread(list(range(15))) == [0, 1, 7, 13, 14], "spread nearest rank (as gpu-check)")
check(h.median([1, 2, 3, 4]) == 2.5 and math.isnan(h.median([])), "median")
print("harness: all checks passed")
print("1 passed, 0 failed")
