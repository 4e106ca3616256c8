"""PyTorch peer of dusk's Quest selection: the same computation in PyTorch ops. Per
(sequence, KV head), each page's score from Quest's f16 page minima and maxima of K,
`sum over the group's query heads g and dims d of max(q_gd * min_d, q_gd * max_d)` (folded
as `qpos . max + qneg . min`, qpos and qneg the group's summed positive and negative parts
of q, as dusk folds it); the last page of each sequence always kept; `torch.topk` of the
budget's pages; their token positions (page * 16 + slot) as the selection.

Timed by harness.py, the rule dusk's side follows too: the state comes in
`rotation_sets(bytes one call reads)` copies, the calls are captured in a CUDA graph and
replayed between two events (queued where capture fails). Writes one JSON object with each
case's time (`torch_us`), how it was timed (`torch_timing`) and its spread.

    python3 benches/baselines/quest_peers.py --out quest.json
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, PAGE = 128, 16


def case(batch, q_heads, kv_heads, context, gen):
    pages_per_seq = context // PAGE
    num_pages = batch * pages_per_seq
    group = q_heads // kv_heads
    keep = pages_per_seq // 4
    # What one call reads: the minima and maxima of every page of every sequence (f16).
    read_bytes = 2 * num_pages * kv_heads * HEAD_DIM * 2
    sets = harness.rotation_sets(read_bytes)
    states = []
    for _ in range(sets):
        a = torch.rand(num_pages, kv_heads, HEAD_DIM, device="cuda", generator=gen) * 6 - 3
        b = torch.rand(num_pages, kv_heads, HEAD_DIM, device="cuda", generator=gen) * 6 - 3
        states.append((torch.minimum(a, b).half(), torch.maximum(a, b).half()))
        del a, b
    q = (torch.rand(batch, q_heads, HEAD_DIM, device="cuda", generator=gen) * 4 - 2).half()
    page_ids = torch.randperm(num_pages, device="cuda", generator=gen).view(batch, pages_per_seq)
    qg = q.float().view(batch, kv_heads, group, HEAD_DIM)
    qpos = qg.clamp(min=0).sum(2)  # [batch, kv_heads, d]
    qneg = qg.clamp(max=0).sum(2)
    slots = torch.arange(PAGE, device="cuda")
    last = torch.full((batch, kv_heads, 1), pages_per_seq - 1, device="cuda")

    def select(lo, hi):
        mins = lo[page_ids].float()  # [batch, pages, kv_heads, d]
        maxs = hi[page_ids].float()
        scores = torch.einsum("bhd,bphd->bhp", qpos, maxs) + torch.einsum("bhd,bphd->bhp", qneg, mins)
        scores.scatter_(2, last, float("inf"))  # the last page always kept
        pages = torch.topk(scores, keep, dim=2).indices.sort(dim=2).values
        return (pages.unsqueeze(-1) * PAGE + slots).flatten(2)  # token positions

    out = select(*states[0])
    assert out.shape == (batch, kv_heads, keep * PAGE)
    m = harness.measure([lambda s=s: select(*s) for s in states])
    del states
    torch.cuda.empty_cache()
    entry = {"case": f"quest_b{batch}_h{q_heads}x{kv_heads}_ctx{context}_quarter", "read_bytes": read_bytes,
             "rotation_sets": sets}
    harness.put(entry, "torch", m)
    return entry


if __name__ == "__main__":
    harness.run_cases(case, seed=11)
