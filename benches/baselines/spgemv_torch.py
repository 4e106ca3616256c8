"""PyTorch peer of spgemv_quant: the same scores from the f16 K cache, by gathering each
row's candidate keys and a batched matmul with the row's query heads.

Writes one JSON object with the median time of each case (CUDA events, warm-up, inputs
beyond L2) and the device-to-device copy bandwidth measured in the same process.

    python3 benches/baselines/spgemv_torch.py --out peer.json
"""
import argparse
import json

import torch

HEAD_DIM, PAGE = 128, 16


def median_ms(fn, iters=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def copy_gbps():
    n = 1 << 30  # 1 GiB each way, far beyond L2
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), iters=20)
    return 2 * n / (ms * 1e-3) / 1e9


def case(batch, q_heads, kv_heads, context, quarter, gen):
    pages_per_seq = context // PAGE
    num_pages = batch * pages_per_seq
    group = q_heads // kv_heads
    k = torch.randn(num_pages, PAGE, kv_heads, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
    q = torch.randn(batch, q_heads, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
    # Page table: a random permutation of the pages among sequences.
    page_ids = torch.randperm(num_pages, device="cuda", generator=gen).view(batch, pages_per_seq)
    if quarter:
        keep = pages_per_seq // 4
        chosen = torch.rand(batch, kv_heads, pages_per_seq, device="cuda", generator=gen).argsort(dim=-1)[..., :keep]
        chosen = chosen.sort(dim=-1).values  # [batch, kv_heads, keep] page numbers in the sequence
    else:
        chosen = torch.arange(pages_per_seq, device="cuda").expand(batch, kv_heads, pages_per_seq)
    phys = torch.gather(page_ids.unsqueeze(1).expand(batch, kv_heads, pages_per_seq), 2, chosen)
    slots = torch.arange(PAGE, device="cuda")
    heads = torch.arange(kv_heads, device="cuda").view(1, kv_heads, 1, 1)
    # Row index into k viewed as [num_pages * PAGE * kv_heads, HEAD_DIM].
    rows = ((phys.unsqueeze(-1) * PAGE + slots) * kv_heads + heads).reshape(batch * kv_heads, -1)
    k_flat = k.view(-1, HEAD_DIM)
    qg = q.view(batch * kv_heads, group, HEAD_DIM)

    def run():
        keys = k_flat[rows]  # [rows, n, d] gather
        return torch.bmm(qg, keys.transpose(1, 2))  # [rows, group, n]

    ms = median_ms(run)
    del k
    torch.cuda.empty_cache()
    return {"batch": batch, "num_q_heads": q_heads, "num_kv_heads": kv_heads, "context": context,
            "candidates": "quarter_pages" if quarter else "all", "peer_us": ms * 1e3,
            "tokens_per_row": rows.shape[1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    result = {"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps(), "cases": []}
    for kv_heads in (8, 32):
        for quarter in (False, True):
            c = case(32, 32, kv_heads, 32768, quarter, gen)
            result["cases"].append(c)
            print(json.dumps(c), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
