"""Peers of dusk's paged decode attention, timed on the same shapes as
`gpu-check attention`: FlashInfer 0.5.3 `BatchDecodeWithPagedKVCacheWrapper` (CUDA-core and
tensor-core decode; the faster is the peer), for dense and page-sparse (a random quarter of
each sequence's pages), and PyTorch SDPA with the flash backend (dense, contiguous K/V).

Median of CUDA-event-timed runs after warm-up; when a case's KV is smaller than 256 MB,
several copies of the cache are rotated so that reads come from DRAM, not L2. Also measures
the device-to-device copy bandwidth in the same process.

    python3 benches/baselines/attention_peers.py --out peers.json
"""
import argparse
import json
import math

import torch

HEAD_DIM, PAGE = 128, 16
ROTATE_BYTES = 256 << 20


def median_us(fns, iters=30, warmup=5):
    """Median time of one call, cycling through `fns` (one per rotated input copy)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fns[i % len(fns)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_gbps():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = median_us([lambda: b.copy_(a)], iters=20)
    del a, b
    return 2 * n / (us * 1e-6) / 1e9


def copies_for(nbytes):
    return max(1, math.ceil(ROTATE_BYTES / max(nbytes, 1)))


def flashinfer_case(flashinfer, batch, hq, hkv, context, quarter, gen):
    pages_per_seq = context // PAGE
    keep = pages_per_seq // 4 if quarter else pages_per_seq
    num_pages = batch * pages_per_seq
    kv_bytes = 2 * batch * keep * PAGE * hkv * HEAD_DIM * 2
    copies = copies_for(kv_bytes)
    caches = [
        (torch.randn(num_pages, PAGE, hkv, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen),
         torch.randn(num_pages, PAGE, hkv, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen))
        for _ in range(copies)
    ]
    page_ids = torch.randperm(num_pages, device="cuda", generator=gen).view(batch, pages_per_seq)
    if quarter:
        chosen = torch.rand(batch, pages_per_seq, device="cuda", generator=gen).argsort(dim=-1)[:, :keep]
        chosen = chosen.sort(dim=-1).values
        page_ids = torch.gather(page_ids, 1, chosen)
    indices = page_ids.reshape(-1).int()
    indptr = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * keep
    last = torch.full((batch,), PAGE, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
    out = {}
    for tc in (False, True):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, hq, hkv, HEAD_DIM, PAGE, pos_encoding_mode="NONE",
               q_data_type=torch.float16, kv_data_type=torch.float16)
        fns = [lambda c=c: w.run(q, c) for c in caches]
        out["tensor_cores" if tc else "cuda_cores"] = median_us(fns)
        del w, ws
    del caches
    torch.cuda.empty_cache()
    return out, kv_bytes


def sdpa_case(batch, hq, hkv, context, gen):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    kv_bytes = 2 * batch * context * hkv * HEAD_DIM * 2
    copies = copies_for(kv_bytes)
    kvs = [
        (torch.randn(batch, hkv, context, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen),
         torch.randn(batch, hkv, context, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen))
        for _ in range(copies)
    ]
    q = torch.randn(batch, hq, 1, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
    note = "enable_gqa"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv) for k, v in kvs]
            us = median_us(fns)
    except RuntimeError as e:
        # Flash without GQA support: K and V repeated per query head beforehand (not timed);
        # the kernel then reads group-times the bytes.
        note = f"repeat_interleave ({str(e).splitlines()[0][:80]})"
        g = hq // hkv
        kvs = [(k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) for k, v in kvs[:1]]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v) for k, v in kvs]
            us = median_us(fns)
    del kvs
    torch.cuda.empty_cache()
    return us, note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-sdpa", action="store_true")
    args = ap.parse_args()
    import flashinfer

    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    result = {"torch": torch.__version__, "flashinfer": flashinfer.__version__,
              "device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps(), "cases": []}
    shapes = [(b, hq, hkv, ctx, False) for b in (1, 32, 64) for ctx in (8192, 32768) for hq, hkv in ((32, 8), (32, 32))]
    shapes += [(32, 32, 8, 32768, True), (32, 32, 32, 32768, True)]
    for batch, hq, hkv, ctx, quarter in shapes:
        name = f"{'quarter' if quarter else 'dense'}_b{batch}_h{hq}x{hkv}_ctx{ctx}"
        fi, kv_bytes = flashinfer_case(flashinfer, batch, hq, hkv, ctx, quarter, gen)
        entry = {"case": name, "flashinfer_us": min(fi.values()), "flashinfer_variants_us": fi,
                 "kv_bytes": kv_bytes}
        if not quarter and not args.no_sdpa:
            entry["sdpa_flash_us"], entry["sdpa_note"] = sdpa_case(batch, hq, hkv, ctx, gen)
        print(json.dumps(entry), flush=True)
        result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
