"""PyTorch peer of dusk's SparQ selection: the same computation with the operations of the
SparQ authors' reference code (graphcore-research/llm-inference-research,
`ann_attention.py`: `SparseQ` and `AnnAttention`), for decode with GQA. Per (sequence, KV
head): the top r components of |q| summed over the group (`topk`), those components of q
and those rows of K gathered (`gather`), the approximate logits (`matmul`) divided by each
head's temperature sqrt(d * |q[i1]|_1 / |q|_1), the logits summed over the group with the
last `window` positions set to the largest float (`masked_fill`), the top k positions
(`topk`), alpha = each head's `softmax` gathered at those positions and summed; the running
mean of V from its sum; the kept positions sorted, as dusk's token lists are.

K is read as the paper's Appendix E keeps it, d-major: one contiguous [head_dim, context]
copy per (sequence, KV head), so gathering r components reads r contiguous rows (dusk's
copy is d-major per page, its pages scattered: the peer's layout is the easier one).

Timed by harness.py, the rule dusk's side follows too: the calls are captured in a CUDA
graph and replayed between two events (queued where capture fails), the inputs in
`rotation_sets(bytes one call reads)` copies. Writes one JSON object with each case's time
(`torch_us`), how it was timed (`torch_timing`) and its spread.

    python3 benches/baselines/sparq_peers.py --out sparq.json
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, R = 128, 16


def sparq_select(q, k_t, v_sum, r, k, window):
    """SparQ's selection: q [b, hq, d] f16, k_t [b, hkv, d, n] f16 (d-major K), v_sum
    [b, hkv, d] f32. Returns the kept positions [b, hkv, k] (ascending), alpha
    [b, hkv, group] and the mean of V [b, hkv, d] (f16)."""
    b, hkv, d, n = k_t.shape
    group = q.shape[1] // hkv
    qg = q.view(b, hkv, group, d)
    # Step 1: the top r components of |q| summed over the group, one set per KV head.
    i1 = qg.abs().sum(dim=2, dtype=torch.float32).topk(r, dim=-1).indices  # [b, hkv, r]
    q_r = torch.gather(qg, 3, i1[:, :, None, :].expand(b, hkv, group, r))  # [b, hkv, g, r]
    k_r = torch.gather(k_t, 2, i1[..., None].expand(b, hkv, r, n))  # [b, hkv, r, n]
    scale = (q_r.abs().sum(-1, dtype=torch.float32) / qg.abs().sum(-1, dtype=torch.float32) * d).sqrt()
    logits = (q_r @ k_r).float() / scale[..., None]  # [b, hkv, g, n]
    # Step 2: the top k of the group's summed logits, the local window always kept.
    score = logits.sum(2)
    score[..., n - window:] = torch.finfo(score.dtype).max
    i2 = score.topk(k, dim=-1).indices  # [b, hkv, k]
    # Step 3: alpha, each head's approximate softmax mass on the kept positions.
    alpha = torch.gather(torch.softmax(logits, -1), -1, i2[:, :, None, :].expand(b, hkv, group, k)).sum(-1)
    v_mean = (v_sum / n).half()
    return i2.sort(dim=-1).values, alpha, v_mean


def case(batch, q_heads, kv_heads, context, gen):
    k = context // 8
    window = k // 4
    # What one call must read: r rows of the d-major K of every sequence and KV head.
    read_bytes = batch * kv_heads * R * context * 2
    sets = harness.rotation_sets(read_bytes)
    k_ts = []
    for _ in range(sets):
        k_ts.append(torch.randn(batch, kv_heads, HEAD_DIM, context, device="cuda", dtype=torch.float16,
                                generator=gen))
    q = (torch.randint(-128, 129, (batch, q_heads, HEAD_DIM), device="cuda", generator=gen) / 64).half()
    v_sum = torch.randn(batch, kv_heads, HEAD_DIM, device="cuda", generator=gen) * context / 8

    tokens, alpha, v_mean = sparq_select(q, k_ts[0], v_sum, R, k, window)
    assert tokens.shape == (batch, kv_heads, k) and alpha.shape == (batch, kv_heads, q_heads // kv_heads)
    assert bool((tokens[..., -window:] == torch.arange(context - window, context, device="cuda")).all())
    m = harness.measure([lambda kt=kt: sparq_select(q, kt, v_sum, R, k, window) for kt in k_ts])
    del k_ts
    torch.cuda.empty_cache()
    entry = {"case": f"sparq_b{batch}_h{q_heads}x{kv_heads}_ctx{context}_r{R}_k8th", "read_bytes": read_bytes,
             "rotation_sets": sets}
    harness.put(entry, "torch", m)
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(13)
    copy, copy_m = harness.measure_copy()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": harness.l2_bytes(),
              "copy_gbps": copy, "copy_timing": copy_m.timing, "cases": []}
    for batch in (32, 64):
        for kv_heads in (8, 32):
            try:
                entry = case(batch, 32, kv_heads, 32768, gen)
            except Exception as e:  # noqa: BLE001 -- one case failing leaves the others timed
                entry = {"case": f"sparq_b{batch}_h32x{kv_heads}_ctx32768_r{R}_k8th",
                         "error": f"{type(e).__name__}: {e}"[:300]}
                torch.cuda.empty_cache()
            print(json.dumps(entry), flush=True)
            result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
