"""Peers of dusk's attention operator (select, estimate, prune, attend: Twilight's Figures 7
and 10) at 32k tokens, batch 32 and 64, GQA 32/8 and MHA 32/32, head_dim 128, pages of 16:

- `flashinfer`: FlashInfer 0.5.3's dense paged decode (`BatchDecodeWithPagedKVCacheWrapper`
  over every page, "NHD" as dusk's cache), CUDA-core and tensor-core decode, the faster kept.
- `flashinfer-pages` (JSON prefix `flashinfer_pages`): the same decode over exactly the
  pages our selector picked, which differ per KV head. Each (sequence, KV head) is a row of
  its own with one KV head, over the cache in FlashInfer's "HND" layout `[pages, kv_heads,
  16, 128]` viewed as `[pages * kv_heads, 1, 16, 128]`, where (page p, head h) is page
  `p * kv_heads + h` of a one-head cache: each row reads its own pages and no others (never
  the union of a sequence's heads' pages, which would read more than the selection; DESIGN.md
  section 10). The query `[batch, 32, 128]` is `[batch * kv_heads, group, 128]` as it lies.

The pages come from files our benchmark writes (`--pages FILE...`, the format of
`pages_file.py` / benches/src/pages_file.rs), each used for the case of its shape. A case
without one gets a quarter of each sequence's pages at random per (sequence, KV head) (the
last page always, as Quest keeps it; seeded by `--seed`), and says so in its output
(`pages_source`).

Timed by harness.py, the rule dusk's side follows: each case's cache comes in
`rotation_sets(bytes one call reads)` copies (more than twice the L2 together), the calls
cycling through them are captured in a CUDA graph and replayed between two events. Both
peers read the same random cache (NHD for the dense decode, HND for the rows: the same
bytes). FlashInfer's `plan` (host work, once per page table) stays outside the timed calls;
`run` writes into a preallocated output. Before timing, both peers are checked against a
PyTorch f32 reference on small cases (`check` in the output; a mismatch stops the script).

    python3 benches/baselines/pipeline_peers.py --out peers.json [--pages b32.pages ...]
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pages_file  # noqa: E402

HEAD_DIM, PAGE = 128, 16
SHAPES = [(b, hq, hkv, 32768) for b in (32, 64) for hq, hkv in ((32, 8), (32, 32))]
VARIANTS = {"cuda_cores": False, "tensor_cores": True}


def case_name(batch, hq, hkv, ctx):
    return f"pipeline_b{batch}_h{hq}x{hkv}_ctx{ctx}"


def random_pages(batch, hkv, ctx, cpu_gen):
    """A quarter of each sequence's pages per (sequence, KV head): the last page and
    `keep - 1` others at random; rows `b * hkv + h`, ascending. (indptr, pages) as lists."""
    n = math.ceil(ctx / PAGE)
    keep = max(n // 4, 1)
    rows = batch * hkv
    others = torch.rand(rows, n - 1, generator=cpu_gen).argsort(dim=1)[:, :keep - 1]
    last = torch.full((rows, 1), n - 1, dtype=torch.long)
    pages = torch.cat([others, last], dim=1).sort(dim=1).values
    return [r * keep for r in range(rows + 1)], pages.reshape(-1).tolist()


class Layout:
    """A batch of `batch` sequences of `ctx` tokens on randomly numbered physical pages, and
    the metadata of both peers over it (page ids drawn with the CPU generator)."""

    def __init__(self, batch, hq, hkv, ctx, indptr, pages, cpu_gen):
        self.batch, self.hq, self.hkv, self.ctx = batch, hq, hkv, ctx
        self.pages_per_seq = math.ceil(ctx / PAGE)
        self.num_pages = batch * self.pages_per_seq
        self.last_len = ctx - (self.pages_per_seq - 1) * PAGE
        dev = "cuda"
        page_ids = torch.randperm(self.num_pages, generator=cpu_gen).view(batch, self.pages_per_seq)
        self.page_ids = page_ids
        # Dense: every page of each sequence.
        self.dense_indptr = (torch.arange(batch + 1) * self.pages_per_seq).int().to(dev)
        self.dense_indices = page_ids.reshape(-1).int().to(dev)
        self.dense_last = torch.full((batch,), self.last_len, dtype=torch.int32, device=dev)
        # Rows (sequence, KV head) over the one-head view: page p of head h is p * hkv + h.
        counts = torch.tensor([b - a for a, b in zip(indptr, indptr[1:])])
        if int(counts.min()) < 1:
            raise ValueError("every (sequence, KV head) row needs at least one page")
        rows = torch.arange(batch * hkv).repeat_interleave(counts)
        logical = torch.tensor(pages, dtype=torch.long)
        self.row_pages = logical
        self.row_of = rows
        self.rows_indptr = torch.tensor(indptr, dtype=torch.int32, device=dev)
        self.rows_indices = (page_ids[rows // hkv, logical] * hkv + rows % hkv).int().to(dev)
        ends = torch.tensor(indptr[1:]) - 1
        row_last = logical[ends] == self.pages_per_seq - 1
        rows_last = torch.full(row_last.shape, PAGE, dtype=torch.int32)
        rows_last[row_last] = self.last_len
        self.rows_last = rows_last.to(dev)
        # Tokens each row attends: its pages, the sequence's last one partial.
        self.rows_tokens = int(counts.sum()) * PAGE - int(row_last.sum()) * (PAGE - self.last_len)

    def dense_bytes(self):
        """K and V bytes the dense decode reads."""
        return 2 * self.batch * self.ctx * self.hkv * HEAD_DIM * 2

    def pages_bytes(self):
        """K and V bytes the rows read (one KV head each)."""
        return 2 * self.rows_tokens * HEAD_DIM * 2

    def cache(self, cuda_gen):
        """One random K and V, `[num_pages, 16 * hkv * 128]` f16 each."""
        shape = (self.num_pages, PAGE * self.hkv * HEAD_DIM)
        return tuple(torch.randn(shape, dtype=torch.float16, device="cuda", generator=cuda_gen) for _ in range(2))

    def nhd(self, kv):
        return tuple(t.view(self.num_pages, PAGE, self.hkv, HEAD_DIM) for t in kv)

    def one_head(self, kv):
        """The cache as FlashInfer's HND with one KV head: (page p, head h) is page p * hkv + h."""
        return tuple(t.view(self.num_pages * self.hkv, 1, PAGE, HEAD_DIM) for t in kv)


def wrappers(flashinfer, layout, dense):
    """The two planned wrappers (CUDA-core and tensor-core decode) of one peer."""
    out = {}
    for name, tc in VARIANTS.items():
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        if dense:
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
            w.plan(layout.dense_indptr, layout.dense_indices, layout.dense_last, layout.hq, layout.hkv,
                   HEAD_DIM, PAGE, pos_encoding_mode="NONE", q_data_type=torch.float16,
                   kv_data_type=torch.float16)
        else:
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
            w.plan(layout.rows_indptr, layout.rows_indices, layout.rows_last, layout.hq // layout.hkv, 1,
                   HEAD_DIM, PAGE, pos_encoding_mode="NONE", q_data_type=torch.float16,
                   kv_data_type=torch.float16)
        out[name] = (w, ws)
    return out


def run_dense(w, layout, q, kv, o):
    return w.run(q, layout.nhd(kv), out=o)


def run_rows(w, layout, q, kv, o):
    rows = layout.batch * layout.hkv
    g = layout.hq // layout.hkv
    return w.run(q.view(rows, g, HEAD_DIM), layout.one_head(kv), out=o.view(rows, g, HEAD_DIM))


def reference(layout, q, kv, dense):
    """f32 attention of every query head over every token of its sequence (`dense`, reading
    the cache as NHD) or over its row's pages (reading it as HND, as the rows do):
    `[batch, hq, 128]`."""
    if dense:
        k, v = (t.float() for t in layout.nhd(kv))  # [pages, 16, hkv, 128]
    else:
        k, v = (t.float().view(layout.num_pages, layout.hkv, PAGE, HEAD_DIM) for t in kv)
    g = layout.hq // layout.hkv
    out = torch.empty(layout.batch, layout.hq, HEAD_DIM, device="cuda")
    for r in range(layout.batch * layout.hkv):
        b, h = divmod(r, layout.hkv)
        logical = torch.arange(layout.pages_per_seq) if dense else layout.row_pages[layout.row_of == r]
        phys = layout.page_ids[b, logical].cuda()
        # The pages' tokens in order, [pages * 16, 128].
        keys, vals = ((t[phys, :, h] if dense else t[phys, h]).reshape(-1, HEAD_DIM) for t in (k, v))
        pos = (logical.cuda()[:, None] * PAGE + torch.arange(PAGE, device="cuda")).reshape(-1)
        keep = pos < layout.ctx
        keys, vals = keys[keep], vals[keep]
        qs = q[b, h * g:(h + 1) * g].float()
        w = torch.softmax(qs @ keys.T / math.sqrt(HEAD_DIM), dim=-1)
        out[b, h * g:(h + 1) * g] = w @ vals
    return out


def check(flashinfer, cpu_gen, cuda_gen):
    """Both peers against the f32 reference on small cases with a partial last page (GQA and
    MHA); raises on a mismatch. Returns what was measured."""
    results = []
    for batch, hq, hkv, ctx in ((3, 8, 2, 200), (2, 4, 4, 77)):
        indptr, pages = random_pages(batch, hkv, ctx, cpu_gen)
        layout = Layout(batch, hq, hkv, ctx, indptr, pages, cpu_gen)
        kv = layout.cache(cuda_gen)
        q = torch.randn(batch, hq, HEAD_DIM, dtype=torch.float16, device="cuda", generator=cuda_gen)
        for peer, dense in (("flashinfer", True), ("flashinfer_pages", False)):
            want = reference(layout, q, kv, dense)
            for variant, (w, _) in wrappers(flashinfer, layout, dense).items():
                o = torch.full_like(q, float("nan"))
                (run_dense if dense else run_rows)(w, layout, q, kv, o)
                err = (o.float() - want).abs().max().item()
                entry = {"shape": [batch, hq, hkv, ctx], "peer": peer, "variant": variant, "max_abs_error": err}
                print(json.dumps(entry), flush=True)
                results.append(entry)
                if not err < 2e-3:
                    raise SystemExit(f"check failed: {entry}")
    return results


def pages_for(files, batch, hq, hkv, ctx, cpu_gen, seed):
    """(indptr, pages, source) for a case: the matching file's, else random."""
    for path, sel in files.items():
        if (sel["batch"], sel["num_q_heads"], sel["num_kv_heads"], sel["page_size"]) == (batch, hq, hkv, PAGE) \
                and all(n == ctx for n in sel["seq_lens"]):
            return sel["indptr"], sel["pages"], f"file {path}"
    indptr, pages = random_pages(batch, hkv, ctx, cpu_gen)
    print(f"{case_name(batch, hq, hkv, ctx)}: no pages file of this shape; a random quarter of each "
          f"sequence's pages per (sequence, KV head), the last page always (seed {seed})", flush=True)
    return indptr, pages, f"random: a quarter of the pages per (sequence, KV head), the last always, seed {seed}"


def time_peer(flashinfer, layout, caches, sets, dense):
    """Each variant's Measured, over the first `sets` caches."""
    q = torch.randn(layout.batch, layout.hq, HEAD_DIM, dtype=torch.float16, device="cuda")
    o = torch.empty_like(q)
    run = run_dense if dense else run_rows
    out = {}
    for variant, (w, _) in wrappers(flashinfer, layout, dense).items():
        out[variant] = harness.measure([lambda c=c, w=w: run(w, layout, q, c, o) for c in caches[:sets]])
    return out


def case(flashinfer, batch, hq, hkv, ctx, files, cpu_gen, cuda_gen, seed):
    indptr, pages, source = pages_for(files, batch, hq, hkv, ctx, cpu_gen, seed)
    layout = Layout(batch, hq, hkv, ctx, indptr, pages, cpu_gen)
    sets_dense = harness.rotation_sets(layout.dense_bytes())
    sets_pages = harness.rotation_sets(layout.pages_bytes())
    caches = [layout.cache(cuda_gen) for _ in range(max(sets_dense, sets_pages))]
    entry = {"case": case_name(batch, hq, hkv, ctx),
             "shape": {"batch": batch, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": HEAD_DIM,
                       "page_size": PAGE, "context": ctx},
             "pages_source": source, "pages_per_row_mean": len(pages) / (batch * hkv),
             "kv_bytes_dense": layout.dense_bytes(), "kv_bytes_pages": layout.pages_bytes(),
             "rotation_sets_dense": sets_dense, "rotation_sets_pages": sets_pages}
    for prefix, dense, sets in (("flashinfer", True, sets_dense), ("flashinfer_pages", False, sets_pages)):
        ms = time_peer(flashinfer, layout, caches, sets, dense)
        best = min(ms, key=lambda v: ms[v].median_us)
        entry[f"{prefix}_variant"] = best
        harness.put(entry, prefix, ms[best])
        entry[f"{prefix}_variants_us"] = {v: m.median_us for v, m in ms.items()}
        entry[f"{prefix}_variants_timing"] = {v: m.timing for v, m in ms.items()}
    del caches
    torch.cuda.empty_cache()
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", nargs="*", default=[], help="pages files our benchmark wrote")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = ap.parse_args()
    import flashinfer

    files = {p: pages_file.read(p) for p in args.pages}
    # The CPU generator draws the page choices and ids, the CUDA one the data.
    cpu_gen = torch.Generator().manual_seed(args.seed)
    cuda_gen = torch.Generator(device="cuda").manual_seed(args.seed)
    result = {"torch": torch.__version__, "flashinfer": flashinfer.__version__,
              "device": torch.cuda.get_device_name(), "l2_bytes": harness.l2_bytes()}
    result["check"] = check(flashinfer, cpu_gen, cuda_gen)
    copy, copy_m = harness.measure_copy()
    result.update({"copy_gbps": copy, "copy_timing": copy_m.timing, "cases": []})
    for batch, hq, hkv, ctx in SHAPES:
        if args.only not in case_name(batch, hq, hkv, ctx):
            continue
        entry = case(flashinfer, batch, hq, hkv, ctx, files, cpu_gen, cuda_gen, args.seed)
        print(json.dumps(entry), flush=True)
        result["cases"].append(entry)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
