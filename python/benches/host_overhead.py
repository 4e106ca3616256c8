"""Host time of one eager call from Python: how long `AttentionPlan.run` (and the other
plans' runs of a decode step) keep the CPU, measured with host timers on the GPU machine,
beside the pieces it is made of and FlashInfer's `run` on the same shape; and the GPU time
of the attention run submitted as one graph launch (the default), kernel by kernel, and as
one kernel (`fused_merge`).

Host time: a sample is `calls` back-to-back eager calls between two `time.perf_counter()`
reads, divided by `calls`; the GPU is synchronised before each sample (outside the timed
span), so the launch queue starts empty and never fills (`calls` is small against its
depth: a full queue would make the host wait for the GPU). The figure is the median of the
samples.

GPU time: "graph", benches/baselines/harness.py's rule (random K/V rotated through more
than twice the L2, the calls captured in a CUDA graph and replayed between events: inside
a capture every plan launches kernel by kernel); "eager", 200 eager calls over the same
rotation queued between two events (GPU time with the gaps between calls, the median of
5), where the default submits a graph launch a call.

    python3 python/benches/host_overhead.py --out host_overhead.json --commit COMMIT
"""
import argparse
import itertools
import json
import os
import statistics
import sys
import time

import torch

import dusk

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benches", "baselines"))

import harness  # noqa: E402

PAGE = 16
TARGET_US = 10.0


def host_us(fn, calls=50, samples=40, warmup=3):
    """Median host time of one call of `fn`, in microseconds (see the module docs)."""
    out = []
    for i in range(warmup + samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        if i >= warmup:
            out.append((t1 - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out), min(out)


def eager_us(fns, calls=200, reps=5):
    """GPU time (us) of one eager call: `calls` calls cycling through `fns` queued between
    two events, the median of `reps`."""
    out = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fns[i % len(fns)]()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(out[1:])


def gpu_times(plans, shape, q, out, kv_bytes):
    """GPU time (us) of each plan's run over rotated random K/V sets, captured ("graph")
    and eager."""
    sets = harness.rotation_sets(kv_bytes)
    caches = [(torch.randn(shape, device="cuda").half(), torch.randn(shape, device="cuda").half())
              for _ in range(sets)]
    r = {}
    for name, p in plans.items():
        fns = [lambda k=k, v=v, p=p: p.run(q, k, v, out) for k, v in caches]
        m = harness.measure(fns)
        r[name] = {"graph_us": m.median_us, "timing": m.timing, "spread_us": m.spread_us(),
                   "eager_us": eager_us(fns)}
    del caches
    torch.cuda.empty_cache()
    return r


def case(batch, context, samples, hq=32, hkv=8, d=128):
    pages = context // PAGE
    num_pages = batch * pages
    shape = (num_pages, PAGE, hkv, d)
    k = torch.randn(shape, device="cuda").half()
    v = torch.randn(shape, device="cuda").half()
    q = torch.randn((batch, hq, d), device="cuda").half()
    out = torch.empty_like(q)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    ids = torch.arange(num_pages, dtype=torch.int32)
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    dev_table = [t.cuda() for t in (indptr, ids, last)]

    def plan(**more):
        p = dusk.AttentionPlan("cuda")
        if more.pop("device_table", False):
            p.plan(*dev_table, device_table=True, max_tokens=context, **kw, **more)
        else:
            p.plan(indptr, ids, last, **kw, **more)
        return p

    a, t = plan(), plan(device_table=True)
    two, two_t = plan(graph_launch=False), plan(device_table=True, graph_launch=False)
    fused = plan(fused_merge=True)
    stream = torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    # New q and out every call (as a model's layers give): the graph's arguments patched.
    pairs = itertools.cycle([(q, out), (torch.randn_like(q), torch.empty_like(out))])

    def fresh():
        qi, oi = next(pairs)
        a.run(qi, k, v, oi)

    r = {"batch": batch, "context": context, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}
    timed = {
        "AttentionPlan.run": lambda: a.run(q, k, v, out),
        "AttentionPlan.run(stream=int)": lambda: a.run(q, k, v, out, stream=stream),
        "AttentionPlan.run on a side stream (stream=torch.cuda.Stream)": lambda: a.run(q, k, v, out, stream=side),
        "AttentionPlan.run, new q and out every call": fresh,
        "AttentionPlan.run, device table": lambda: t.run(q, k, v, out),
        "AttentionPlan.run, graph_launch=False (two launches)": lambda: two.run(q, k, v, out),
        "AttentionPlan.run, graph_launch=False, device table": lambda: two_t.run(q, k, v, out),
        "AttentionPlan.run, fused_merge=True (one kernel)": lambda: fused.run(q, k, v, out),
        "dusk.data_ptr(q) (one tensor read)": lambda: dusk.data_ptr(q),
        # What dusk asks of each torch tensor a run takes, asked from Python: the floor under
        # a tensor's share of a run.
        "torch's own reads of q (dtype, is_cuda, get_device, shape, stride, data_ptr)": lambda: (
            q.dtype, q.is_cuda, q.get_device(), q.shape, q.stride(), q.data_ptr()),
        "torch current stream lookup": lambda: torch._C._cuda_getCurrentRawStream(0),
        # One kernel launch with almost nothing around it (a pybind11 call, cudaLaunchKernel):
        # what the driver's launch costs on this host.
        "torch._C._cuda_sleep(1) (a bare launch)": lambda: torch._C._cuda_sleep(1),
        "torch out.zero_() (one launch through torch)": lambda: out.zero_(),
    }
    # The other plans of a step, at the same heads: the SpGEMV over 64 candidates a row
    # (INT4 codes of K) and the top-p search over its scores.
    cand = 64
    rows = batch * hkv
    cand_indptr = torch.arange(rows + 1, dtype=torch.int32) * cand
    cand_indices = torch.arange(cand, dtype=torch.int32).repeat(rows)
    pshape, sshape = dusk.quantized_k_shapes(shape)
    packed = torch.empty(pshape, dtype=torch.uint8, device="cuda")
    scale = torch.empty(sshape, dtype=torch.float16, device="cuda")
    zero = torch.empty(sshape, dtype=torch.float16, device="cuda")
    dusk.quantize_k(k, packed, scale, zero)
    s = dusk.SpgemvPlan("cuda")
    s.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
           num_pages=num_pages)
    scores = torch.empty(s.num_scores, device="cuda")
    s2 = dusk.SpgemvPlan("cuda")
    s2.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
            num_pages=num_pages, graph_launch=True)
    timed["SpgemvPlan.run (five tensors, two kernels)"] = lambda: s.run(q, packed, scale, zero, scores)
    timed["SpgemvPlan.run, graph_launch=True"] = lambda: s2.run(q, packed, scale, zero, scores)
    # The search over the same scores, one row a query head (the stock bundle's group).
    q_rows = batch * hq
    p = dusk.PrunePlan("cuda")
    p.plan(torch.arange(q_rows + 1, dtype=torch.int32) * cand, torch.arange(cand, dtype=torch.int32).repeat(q_rows),
           policy="top_p", params={"p": 0.9}, sm_scale=d**-0.5)
    assert p.num_scores == s.num_scores
    timed["PrunePlan.run (one tensor, one launch)"] = lambda: p.run(scores)
    sel_indptr = torch.empty(q_rows + 1, dtype=torch.int32, device="cuda")
    sel_indices = torch.empty(q_rows * cand, dtype=torch.int32, device="cuda")
    timed["PrunePlan.run_into (three tensors, one launch)"] = lambda: p.run_into(scores, sel_indptr, sel_indices)
    try:
        import flashinfer

        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        w.plan(*dev_table, hq, hkv, d, PAGE, pos_encoding_mode="NONE", q_data_type=torch.float16,
               kv_data_type=torch.float16)
        timed["flashinfer BatchDecodeWithPagedKVCacheWrapper.run (peer)"] = lambda: w.run(q, (k, v), out=out)
        r["flashinfer"] = flashinfer.__version__
    except ImportError as e:
        r["flashinfer"] = f"not run: {e}"
    for name, fn in timed.items():
        med, best = host_us(fn, samples=samples)
        r[name] = {"median_us": med, "min_us": best}
        print(f"b{batch} ctx{context} {name}: {med:.2f} us (min {best:.2f})", flush=True)
    del k, v
    torch.cuda.empty_cache()
    kv_bytes = 2 * num_pages * PAGE * hkv * d * 2
    r["gpu_us"] = gpu_times({"default": a, "graph_launch=False": two, "fused_merge=True": fused}, shape, q, out,
                            kv_bytes)
    for name, g in r["gpu_us"].items():
        print(f"b{batch} ctx{context} GPU time of AttentionPlan.run, {name}: captured {g['graph_us']:.2f} us "
              f"({g['timing']}), eager {g['eager_us']:.2f} us", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    cases = [case(1, 4096, samples=40), case(32, 32768, samples=20)]
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": args.commit,
        "what": "host time of one eager call from Python (median of 40 samples (20 at batch 32) of 50 back-to-back "
                "calls, GPU synchronised between samples); target for AttentionPlan.run: under 10 us; gpu_us: "
                "GPU time of a run by benches/baselines/harness.py's rule",
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for c in cases:
        run = c["AttentionPlan.run"]["median_us"]
        g = c["gpu_us"]
        print(f"summary b{c['batch']} ctx{c['context']}: AttentionPlan.run {run:.2f} us "
              f"({'under' if run < TARGET_US else 'NOT under'} {TARGET_US:g}); "
              f"new q/out {c['AttentionPlan.run, new q and out every call']['median_us']:.2f}, "
              f"two launches {c['AttentionPlan.run, graph_launch=False (two launches)']['median_us']:.2f}, "
              f"one kernel {c['AttentionPlan.run, fused_merge=True (one kernel)']['median_us']:.2f}, "
              f"bare launch {c['torch._C._cuda_sleep(1) (a bare launch)']['median_us']:.2f}; "
              f"GPU eager graph/direct/fused {g['default']['eager_us']:.1f}/{g['graph_launch=False']['eager_us']:.1f}/"
              f"{g['fused_merge=True']['eager_us']:.1f} us, captured {g['default']['graph_us']:.1f}/"
              f"{g['graph_launch=False']['graph_us']:.1f}/{g['fused_merge=True']['graph_us']:.1f}")

if __name__ == "__main__":
    main()
