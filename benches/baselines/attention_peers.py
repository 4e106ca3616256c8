"""Peers of dusk's paged decode attention, timed on the same shapes as
`gpu-check attention`: FlashInfer 0.5.3 `BatchDecodeWithPagedKVCacheWrapper` (CUDA-core and
tensor-core decode; the faster is the peer), for dense and page-sparse (a random quarter of
each sequence's pages), and PyTorch SDPA with the flash backend (dense, contiguous K/V).

Timed by harness.py, the rule dusk's side follows too: the KV cache comes in
`rotation_sets(bytes one call reads)` copies (together more than twice the L2) and the
calls, cycling through them, are captured in a CUDA graph and replayed between two events
(GPU time per call, the median of the replays); a peer that cannot be captured is timed as
the same calls queued between two events. FlashInfer's `plan` (host work, once per page
table) is outside the timed calls; `run` writes into a preallocated output. Each figure
comes with how it was timed (`*_timing`: "graph" or "queued") and its spread
(`*_spread_us`: min, p10, p50, p90, max). Also measures the device-to-device copy bandwidth
in the same process, by the same rule.

    python3 benches/baselines/attention_peers.py --out peers.json
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, PAGE = 128, 16


def flashinfer_case(flashinfer, batch, hq, hkv, context, quarter, gen):
    pages_per_seq = context // PAGE
    keep = pages_per_seq // 4 if quarter else pages_per_seq
    num_pages = batch * pages_per_seq
    # What one call reads: K and V of the pages it attends to (f16).
    kv_bytes = 2 * batch * keep * PAGE * hkv * HEAD_DIM * 2
    copies = harness.rotation_sets(kv_bytes)
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
    o = torch.empty_like(q)
    variants = {}
    for tc in (False, True):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, hq, hkv, HEAD_DIM, PAGE, pos_encoding_mode="NONE",
               q_data_type=torch.float16, kv_data_type=torch.float16)
        fns = [lambda c=c: w.run(q, c, out=o) for c in caches]
        variants["tensor_cores" if tc else "cuda_cores"] = harness.measure(fns)
        del w, ws, fns
    del caches
    torch.cuda.empty_cache()
    return variants, kv_bytes, copies


def sdpa_case(batch, hq, hkv, context, gen):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    kv_bytes = 2 * batch * context * hkv * HEAD_DIM * 2
    kvs = [
        (torch.randn(batch, hkv, context, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen),
         torch.randn(batch, hkv, context, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen))
        for _ in range(harness.rotation_sets(kv_bytes))
    ]
    q = torch.randn(batch, hq, 1, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
    note = "enable_gqa"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv) for k, v in kvs]
            m = harness.measure(fns)
    except RuntimeError as e:
        # Flash without GQA support: K and V repeated per query head beforehand (not timed);
        # the kernel then reads group-times the bytes (and rotates over as many sets as that
        # needs: fewer, as rotation_sets falls with the bytes).
        note = f"repeat_interleave ({str(e).splitlines()[0][:80]})"
        g = hq // hkv
        sets = harness.rotation_sets(kv_bytes * g)
        kvs = [(k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) for k, v in kvs[:sets]]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v) for k, v in kvs]
            m = harness.measure(fns)
    del kvs
    torch.cuda.empty_cache()
    return m, note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-sdpa", action="store_true")
    args = ap.parse_args()
    import flashinfer

    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    copy, copy_m = harness.measure_copy()
    result = {"torch": torch.__version__, "flashinfer": flashinfer.__version__,
              "device": torch.cuda.get_device_name(), "l2_bytes": harness.l2_bytes(),
              "copy_gbps": copy, "copy_timing": copy_m.timing, "cases": []}
    shapes = [(b, hq, hkv, ctx, False) for b in (1, 32, 64) for ctx in (8192, 32768) for hq, hkv in ((32, 8), (32, 32))]
    shapes += [(32, 32, 8, 32768, True), (32, 32, 32, 32768, True)]
    for batch, hq, hkv, ctx, quarter in shapes:
        name = f"{'quarter' if quarter else 'dense'}_b{batch}_h{hq}x{hkv}_ctx{ctx}"
        fi, kv_bytes, copies = flashinfer_case(flashinfer, batch, hq, hkv, ctx, quarter, gen)
        best = min(fi, key=lambda v: fi[v].median_us)
        entry = {"case": name, "kv_bytes": kv_bytes, "rotation_sets": copies,
                 "flashinfer_variant": best}
        harness.put(entry, "flashinfer", fi[best])
        entry["flashinfer_variants_us"] = {v: m.median_us for v, m in fi.items()}
        entry["flashinfer_variants_timing"] = {v: m.timing for v, m in fi.items()}
        if not quarter and not args.no_sdpa:
            m, entry["sdpa_note"] = sdpa_case(batch, hq, hkv, ctx, gen)
            harness.put(entry, "sdpa_flash", m)
        print(json.dumps(entry), flush=True)
        result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
