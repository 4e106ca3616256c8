"""Host time of one eager call from Python: how long `AttentionPlan.run` (and the other
calls of a decode step) keep the CPU, measured with host timers on the GPU machine, beside
the pieces it is made of and FlashInfer's `run` on the same shape.

A sample is `calls` back-to-back eager calls between two `time.perf_counter()` reads,
divided by `calls`; the GPU is synchronised before each sample (outside the timed span),
so the launch queue starts empty and never fills (`calls` is small against its depth: a
full queue would make the host wait for the GPU). The figure is the median of the samples.

    python3 python/benches/host_overhead.py --out host_overhead.json
"""
import argparse
import json
import statistics
import time

import torch

import dusk

PAGE = 16


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


def case(batch, context, samples, hq=32, hkv=8, d=128):
    pages = context // PAGE
    num_pages = batch * pages
    k = torch.zeros((num_pages, PAGE, hkv, d), dtype=torch.float16, device="cuda")
    v = torch.zeros_like(k)
    q = torch.zeros((batch, hq, d), dtype=torch.float16, device="cuda")
    out = torch.empty_like(q)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    ids = torch.arange(num_pages, dtype=torch.int32)
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    a = dusk.AttentionPlan("cuda")
    a.plan(indptr, ids, last, **kw)
    dev_table = [t.cuda() for t in (indptr, ids, last)]
    t = dusk.AttentionPlan("cuda")
    t.plan(*dev_table, device_table=True, max_tokens=context, **kw)
    f = dusk.AttentionPlan("cuda")
    f.plan(indptr, ids, last, fused_merge=True, **kw)
    ft = dusk.AttentionPlan("cuda")
    ft.plan(*dev_table, device_table=True, max_tokens=context, fused_merge=True, **kw)
    stream = torch.cuda.current_stream().cuda_stream
    r = {"batch": batch, "context": context, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}
    timed = {
        "AttentionPlan.run": lambda: a.run(q, k, v, out),
        "AttentionPlan.run(stream=int)": lambda: a.run(q, k, v, out, stream=stream),
        "AttentionPlan.run, device table": lambda: t.run(q, k, v, out),
        "AttentionPlan.run, fused_merge (one launch)": lambda: f.run(q, k, v, out),
        "AttentionPlan.run, fused_merge, device table": lambda: ft.run(q, k, v, out),
        "dusk.data_ptr(q) (one tensor read)": lambda: dusk.data_ptr(q),
        # What dusk asks of each torch tensor a run takes, asked from Python: the floor under
        # a tensor's share of a run.
        "torch's own reads of q (dtype, is_cuda, get_device, shape, stride, data_ptr)": lambda: (
            q.dtype, q.is_cuda, q.get_device(), q.shape, q.stride(), q.data_ptr()),
        "torch current stream lookup": lambda: torch._C._cuda_getCurrentRawStream(0),
        "torch out.zero_() (one launch through torch)": lambda: out.zero_(),
    }
    scores = torch.randn(batch * hkv * 64, device="cuda")
    p = dusk.PrunePlan("cuda")
    n = batch * hkv
    p.plan(torch.arange(n + 1, dtype=torch.int32) * 64, torch.arange(64, dtype=torch.int32).repeat(n),
           policy="top_p", params={"p": 0.9})
    timed["PrunePlan.run (one tensor, one launch)"] = lambda: p.run(scores)
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
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": args.commit,
        "what": "host time of one eager call from Python (median of 40 samples (8 at batch 32) of 50 back-to-back "
                "calls, GPU synchronised between samples); target for AttentionPlan.run: under 10 us",
        "cases": [case(1, 4096, samples=40), case(32, 32768, samples=8)],
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
