"""PyTorch peer of dusk's cache append (one decode step's maintenance, `AppendPlan::run`):
the same computation in PyTorch ops. Each of `batch` sequences gets one new token (K and V,
`[batch, kv_heads, 128]` f16) at the last slot of its last page in the page table after the
append (`kv_page_indices[kv_indptr[b + 1] - 1]`, slot `kv_last_page_len[b] - 1`):

- K and V written into the paged cache (`[pages, 16, kv_heads, 128]`, index writes);
- K quantized to 4 bits as dusk's `quantize_k` does (per row: scale `(max - min) / 15` and
  zero `min` rounded to f16, codes `trunc((k - zero) / scale + 0.5)` clamped to 0..15, two
  a byte) into the head-major copy (`[pages, kv_heads, 16, 64]` codes, `[pages, kv_heads,
  16]` scale and zero);
- one selector's state: Quest's page min and max (`[pages, kv_heads, 128]` f16) folded
  with the token (a page's first token starts them afresh; cases `append_*`), or Double
  Sparsity's labels (16 channels of K per KV head, `[pages, kv_heads, 16, 16]` f16, a
  gather; `append_ds_*`), or SparQ's (`append_sparq_*`): the transposed copy
  (`[blocks, kv_heads, 128, 256]` f16, blocks of 256 tokens through a block table of their
  own, scattered as the pages) is written in runs of 16 tokens from each sequence's
  staging ring of two runs (`[batch, kv_heads, 32, 128]` f16, the token at position `p` in
  row `p % 32`): the token is staged, and slice `j = p % 16` of the run before its own
  (components `8j .. 8j + 8` of that run's 16 staged keys) goes into the copy; V is added
  to the f32 sums of V (`[batch, kv_heads, 128]`).

In rotation set `i` sequence `b` holds `32768 - (b + i) % 16` tokens, as in dusk's
benchmark (every slot of a page gets a new token, the first included, and every place of
a run of SparQ's copy); in the `append_sparq_finish_*` cases every sequence holds 32768,
so every token finishes a run (the step in which every row moved a whole run into the
copy when runs were copied whole; now each copies the last slice of the run before).
Timed by harness.py,
the rule dusk's side follows too: each rotation set is its own page table (a random
placement of the pages), lengths and new tokens, `rotation_sets(bytes one step reads)` of
them; the calls are captured in a CUDA graph and replayed between two events (queued where
capture fails). Writes one JSON object
with each case's time (`torch_us`), how it was timed (`torch_timing`) and its spread.

    python3 benches/baselines/append_peers.py --out append.json
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEAD_DIM, PAGE = 128, 16


LABELS, BLOCK, RUN = 16, 256, 16


def case(selector, batch, q_heads, kv_heads, context, gen, finish_runs=False):
    dev = "cuda"

    def lens_at(i):
        return [context if finish_runs else context - (b + i) % PAGE for b in range(batch)]

    # Every set's sequences take as many pages and blocks (32768 - 15 .. 32768 tokens).
    lens = lens_at(0)
    pages = [-(-n // PAGE) for n in lens]
    num_pages = sum(pages)
    blocks = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(blocks)
    assert all([-(-n // PAGE) for n in lens_at(i)] == pages for i in range(PAGE))
    assert all([-(-n // BLOCK) for n in lens_at(i)] == blocks for i in range(PAGE))
    k_cache = torch.zeros(num_pages, PAGE, kv_heads, HEAD_DIM, dtype=torch.half, device=dev)
    v_cache = torch.zeros_like(k_cache)
    packed = torch.zeros(num_pages, kv_heads, PAGE, HEAD_DIM // 2, dtype=torch.uint8, device=dev)
    scale = torch.zeros(num_pages, kv_heads, PAGE, dtype=torch.half, device=dev)
    zero = torch.zeros_like(scale)
    state = {}
    if selector == "quest":
        state["min"] = torch.zeros(num_pages, kv_heads, HEAD_DIM, dtype=torch.half, device=dev)
        state["max"] = torch.zeros_like(state["min"])
    elif selector == "ds":
        state["labels"] = torch.zeros(num_pages, kv_heads, PAGE, LABELS, dtype=torch.half, device=dev)
        # Every (128 / 16)-th channel, as dusk's benchmark.
        channels = torch.arange(LABELS, device=dev) * (HEAD_DIM // LABELS)
        state["channels"] = channels.view(1, 1, LABELS).expand(batch, kv_heads, LABELS)
    else:
        state["k_t"] = torch.zeros(num_blocks, kv_heads, HEAD_DIM, BLOCK, dtype=torch.half, device=dev)
        # Staged keys to copy (checked after the first step).
        state["k_open"] = torch.rand(batch, kv_heads, 2 * RUN, HEAD_DIM, device=dev, generator=gen).half()
        state["v_sum"] = torch.zeros(batch, kv_heads, HEAD_DIM, dtype=torch.float, device=dev)
    ends = torch.tensor(pages, device=dev).cumsum(0)
    blk_ends = torch.tensor(blocks, device=dev).cumsum(0)
    heads = torch.arange(kv_heads, device=dev)
    seqs = torch.arange(batch, device=dev)
    in_run = torch.arange(RUN, device=dev)
    width = HEAD_DIM // RUN
    in_slice = torch.arange(width, device=dev)
    # What one step reads (as dusk's AppendBench::read_bytes): the new K and V, the table's
    # entries it looks at, Quest's state of the pages whose new token is not their first,
    # DS's channels, SparQ's block table entries, sums of V and the staged keys of the
    # slices copied (every sequence here is past its first run).
    continued = sum(1 for n in lens if (n - 1) % PAGE != 0)
    copying = sum(1 for n in lens if n > RUN)
    assert copying == batch
    read_bytes = 2 * batch * kv_heads * HEAD_DIM * 2 + batch * 16
    read_bytes += {"quest": 2 * continued * kv_heads * HEAD_DIM * 2, "ds": kv_heads * LABELS * 4,
                   "sparq": batch * 16 + batch * kv_heads * HEAD_DIM * 4
                   + copying * kv_heads * HEAD_DIM * 2}[selector]
    sets = harness.rotation_sets(read_bytes)
    inputs = []
    for i in range(sets):
        page_ids = torch.randperm(num_pages, device=dev, generator=gen).int()
        blk_ids = torch.randperm(num_blocks, device=dev, generator=gen).int()
        k_new = (torch.rand(batch, kv_heads, HEAD_DIM, device=dev, generator=gen) * 6 - 3).half()
        v_new = (torch.rand(batch, kv_heads, HEAD_DIM, device=dev, generator=gen) * 6 - 3).half()
        # The set's token places, and SparQ's: each token's place in the ring, the slice it
        # copies, the previous run's block (counted back from the sequence's last) and its
        # first slot and ring row.
        n = lens_at(i)
        prev = [m - 1 - (m - 1) % RUN - RUN for m in n]
        where = {
            "slot": torch.tensor([(m - 1) % PAGE for m in n], device=dev),
            "ring": torch.tensor([(m - 1) % (2 * RUN) for m in n], device=dev),
            "slice": torch.tensor([(m - 1) % RUN for m in n], device=dev),
            "prev_back": torch.tensor([(m - 1) // BLOCK - p // BLOCK for m, p in zip(n, prev)], device=dev),
            "prev_slot": torch.tensor([p % BLOCK for p in prev], device=dev),
            "prev_ring": torch.tensor([p % (2 * RUN) for p in prev], device=dev),
        }
        inputs.append((page_ids, blk_ids, k_new, v_new, where))

    def step(page_ids, blk_ids, k_new, v_new, where):
        slot = where["slot"]
        first = (slot == 0).view(-1, 1, 1)
        last = page_ids[ends - 1].long()  # each sequence's last page
        k_cache[last, slot] = k_new
        v_cache[last, slot] = v_new
        x = k_new.float()
        hi, lo = x.amax(-1), x.amin(-1)
        scale16, zero16 = ((hi - lo) / 15).half(), lo.half()
        s = scale16.float()
        inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, 1.0), 0.0)
        codes = ((x - zero16.float().unsqueeze(-1)) * inv.unsqueeze(-1) + 0.5).clamp(0, 15).to(torch.uint8)
        packed[last, :, slot] = codes[..., 0::2] | (codes[..., 1::2] << 4)
        scale[last, :, slot] = scale16
        zero[last, :, slot] = zero16
        if selector == "quest":
            old_lo = torch.where(first, float("inf"), state["min"][last].float())
            old_hi = torch.where(first, float("-inf"), state["max"][last].float())
            state["min"][last] = torch.fmin(old_lo, x).half()
            state["max"][last] = torch.fmax(old_hi, x).half()
        elif selector == "ds":
            state["labels"][last, :, slot] = k_new.gather(-1, state["channels"])
        else:
            # The previous run's slice, [batch, kv_heads, 16 tokens, 8 components], from the
            # ring into the copy, then the token staged.
            b4, h4 = seqs.view(-1, 1, 1, 1), heads.view(1, -1, 1, 1)
            c0 = (where["slice"] * width).view(-1, 1, 1, 1)
            rows = (where["prev_ring"].view(-1, 1, 1, 1) + in_run.view(1, 1, -1, 1))
            sliced = state["k_open"][b4, h4, rows, c0 + in_slice.view(1, 1, 1, -1)]
            block = blk_ids[blk_ends - 1 - where["prev_back"]].long().view(-1, 1, 1, 1)
            at = where["prev_slot"].view(-1, 1, 1, 1) + in_run.view(1, 1, 1, -1)
            state["k_t"][block, h4, c0 + in_slice.view(1, 1, -1, 1), at] = sliced.transpose(-1, -2)
            state["k_open"][seqs.view(-1, 1), heads, where["ring"].view(-1, 1)] = k_new
            state["v_sum"] += v_new.float()
        return last

    last = step(*inputs[0])
    slot = inputs[0][4]["slot"]
    assert torch.equal(k_cache[last, slot], inputs[0][2]), "the new K rows are in place"
    if selector == "quest":
        assert bool((state["min"][last] <= state["max"][last]).all()), "Quest's min below its max"
    elif selector == "ds":
        assert torch.equal(state["labels"][last, :, slot], inputs[0][2][..., ::HEAD_DIM // LABELS]), "the labels"
    else:
        where, k_new = inputs[0][4], inputs[0][2]
        staged = state["k_open"][seqs.view(-1, 1), heads, where["ring"].view(-1, 1)]
        assert torch.equal(staged, k_new), "the staged K"
        block = inputs[0][1][blk_ends - 1 - where["prev_back"]].long()
        b, c = 0, int(where["slice"][0]) * width
        got = state["k_t"][block[b], :, c:c + width, int(where["prev_slot"][b]):][..., :RUN]
        ring = int(where["prev_ring"][b])
        want = state["k_open"][b, :, ring:ring + RUN, c:c + width].transpose(-1, -2)
        assert torch.equal(got, want), "the transposed slice"
    m = harness.measure([lambda s=s: step(*s) for s in inputs])
    del k_cache, v_cache, packed, scale, zero, state, inputs
    torch.cuda.empty_cache()
    prefix = "" if selector == "quest" else selector + ("_finish_" if finish_runs else "_")
    entry = {"case": f"append_{prefix}b{batch}_h{q_heads}x{kv_heads}_ctx{context}", "read_bytes": read_bytes,
             "rotation_sets": sets}
    harness.put(entry, "torch", m)
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(12)
    copy, copy_m = harness.measure_copy()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": harness.l2_bytes(),
              "copy_gbps": copy, "copy_timing": copy_m.timing, "cases": []}
    for selector, finish_runs in (("quest", False), ("ds", False), ("sparq", False), ("sparq", True)):
        for batch in (32, 64):
            for kv_heads in (8, 32):
                entry = case(selector, batch, 32, kv_heads, 32768, gen, finish_runs)
                print(json.dumps(entry), flush=True)
                result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
