"""PyTorch peer of dusk's Double Sparsity selection: the same computation in PyTorch ops.
Per (sequence, KV head), each token's score on its labels (f16 `[num_pages, num_kv_heads,
page_size, r]`, the label cache dusk keeps): the query's labelled channels summed over the
group's query heads (a gather of r channels per KV head), the sequence's labels gathered
through its pages, a batched matmul (f16 in, f32 accumulation, f16 scores, as the DS
authors' code scores); the first 4 and last 64 tokens always kept; `torch.topk` of the
budget's tokens (a quarter), sorted: the token positions of the selection. Also times the
scoring alone (gather and matmul), beside dusk's score kernel.

Timed by harness.py, the rule dusk's side follows too: the labels come in
`rotation_sets(bytes one call reads)` copies, the calls are captured in a CUDA graph and
replayed between two events (queued where capture fails). Writes one JSON object with each
case's times (`torch_us`: the selection; `torch_score_us`: the scoring), how they were
timed (`*_timing`) and their spread.

    python3 benches/baselines/ds_peers.py --out ds.json
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, PAGE, R = 128, 16, 16
SINK, RECENT = 4, 64


def case(batch, q_heads, kv_heads, context, gen):
    pages_per_seq = context // PAGE
    num_pages = batch * pages_per_seq
    group = q_heads // kv_heads
    keep = context // 4
    # What one call reads: the labels of every token of every sequence (f16).
    read_bytes = num_pages * kv_heads * PAGE * R * 2
    sets = harness.rotation_sets(read_bytes)
    label_sets = [(torch.rand(num_pages, kv_heads, PAGE, R, device="cuda", generator=gen) * 4 - 2).half()
                  for _ in range(sets)]
    q = (torch.rand(batch, q_heads, HEAD_DIM, device="cuda", generator=gen) * 4 - 2).half()
    page_ids = torch.randperm(num_pages, device="cuda", generator=gen).view(batch, pages_per_seq)
    channels = torch.stack([torch.randperm(HEAD_DIM, device="cuda", generator=gen)[:R].sort().values
                            for _ in range(kv_heads)])  # [kv_heads, r]
    chan_idx = channels.view(1, kv_heads, 1, R).expand(batch, kv_heads, group, R)
    seq_pages = page_ids.view(batch, 1, pages_per_seq)
    heads = torch.arange(kv_heads, device="cuda").view(1, kv_heads, 1)

    def score(labels):
        # q's labelled channels, summed over the group: [batch, kv_heads, r, 1].
        qc = q.view(batch, kv_heads, group, HEAD_DIM).gather(3, chan_idx).float().sum(2)
        qc = qc.half().unsqueeze(-1)
        # Each (sequence, KV head)'s labels through its pages: [batch, kv_heads, context, r].
        lab = labels[seq_pages, heads].reshape(batch, kv_heads, context, R)
        return torch.matmul(lab, qc).squeeze(-1)  # [batch, kv_heads, context]

    def select(labels):
        s = score(labels)
        s[..., :SINK] = float("inf")
        s[..., context - RECENT:] = float("inf")
        # [batch, kv_heads, keep]: token positions in the sequence, ascending.
        return torch.topk(s, keep, dim=-1).indices.sort(dim=-1).values

    out = select(label_sets[0])
    assert out.shape == (batch, kv_heads, keep)
    m_score = harness.measure([lambda s=s: score(s) for s in label_sets])
    m = harness.measure([lambda s=s: select(s) for s in label_sets])
    del label_sets
    torch.cuda.empty_cache()
    entry = {"case": f"ds_b{batch}_h{q_heads}x{kv_heads}_ctx{context}_r{R}_quarter", "read_bytes": read_bytes,
             "rotation_sets": sets, "sink": SINK, "recent": RECENT}
    harness.put(entry, "torch", m)
    harness.put(entry, "torch_score", m_score)
    return entry


if __name__ == "__main__":
    harness.run_cases(case, seed=12)
