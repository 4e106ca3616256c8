"""PyTorch peer of spgemv_quant: the same scores from the f16 K cache, by gathering each
row's candidate keys and a batched matmul with the row's query heads.

Timed by harness.py, the rule dusk's side follows too: the K cache comes in
`rotation_sets(bytes one call reads)` copies (the candidate keys gathered; at these shapes
one copy is already beyond twice the L2) and the calls, cycling through them, are captured
in a CUDA graph (the gather's allocation comes from the graph's private pool) and replayed
between two events, GPU time per call, the median of the replays; queued between two events
where capture fails. Writes one JSON object with each case's time (`peer_us`), how it was
timed (`peer_timing`: "graph" or "queued") and its spread, and the device-to-device copy
bandwidth measured in the same process by the same rule.

    python3 benches/baselines/spgemv_torch.py --out peer.json
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, PAGE = 128, 16


def case(batch, q_heads, kv_heads, context, quarter, gen):
    pages_per_seq = context // PAGE
    num_pages = batch * pages_per_seq
    group = q_heads // kv_heads
    tokens_per_row = (pages_per_seq // 4 if quarter else pages_per_seq) * PAGE
    # What one call reads: the candidate keys (f16) it gathers.
    read_bytes = batch * kv_heads * tokens_per_row * HEAD_DIM * 2
    sets = harness.rotation_sets(read_bytes)
    ks = [torch.randn(num_pages, PAGE, kv_heads, HEAD_DIM, dtype=torch.float16, device="cuda", generator=gen)
          for _ in range(sets)]
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
    assert rows.shape[1] == tokens_per_row
    qg = q.view(batch * kv_heads, group, HEAD_DIM)

    def run(k_flat):
        keys = k_flat[rows]  # [rows, n, d] gather
        return torch.bmm(qg, keys.transpose(1, 2))  # [rows, group, n]

    m = harness.measure([lambda k=k: run(k.view(-1, HEAD_DIM)) for k in ks])
    del ks
    torch.cuda.empty_cache()
    c = {"batch": batch, "num_q_heads": q_heads, "num_kv_heads": kv_heads, "context": context,
         "candidates": "quarter_pages" if quarter else "all", "tokens_per_row": rows.shape[1],
         "read_bytes": read_bytes, "rotation_sets": sets}
    return harness.put(c, "peer", m)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    copy, copy_m = harness.measure_copy()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "l2_bytes": harness.l2_bytes(), "copy_gbps": copy, "copy_timing": copy_m.timing,
              "cases": []}
    for kv_heads in (8, 32):
        for quarter in (False, True):
            c = case(32, 32, kv_heads, 32768, quarter, gen)
            result["cases"].append(c)
            print(json.dumps(c), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
