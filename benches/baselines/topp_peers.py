"""Peers of dusk's fused top-p threshold search, timed in one process on the same shapes:

- flashinfer: `flashinfer.sampling.top_p_renorm_probs` (the kernel Twilight's top-p was
  forked from), on probabilities (its softmax is not timed);
- torch: softmax, sort, cumsum, mask (the sort-based oracle on the GPU);
- triton: the same job as dusk's (softmax in registers, binary search with bounds snapped to
  elements, one where/sum/min/max pass a step), with the same output: the kept positions,
  ascending, compacted into CSR (`triton_us`: the search kernel, which ranks kept positions
  by a prefix sum into a staging buffer, then a packing kernel); `triton_mask_us` times the
  search alone writing a keep mask instead, for reference.

Inputs rotate over two score sets of rows x n f32 (larger than L2 together). Writes JSON
with each peer's median time (CUDA events) and the device copy bandwidth. `--focus F`
multiplies the logits (the rows `gpu-check threshold --focus F` times).

    python3 benches/baselines/topp_peers.py --out peers.json [--focus 12]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def median_us(fn, iters=30, warmup=5):
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
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_gbps():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = median_us(lambda: b.copy_(a), iters=20)
    return 2 * n / (us * 1e-6) / 1e9


@triton.jit
def _search_row(s_ptr, p_ptr, n, scale_log2e, BLOCK: tl.constexpr):
    """One row's search: returns its offsets, their validity, the row's base, each
    candidate's e (-1 past the row) and the threshold `lo` the row keeps."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    valid = offs < n
    base = row.to(tl.int64) * n
    s = tl.load(s_ptr + base + offs, mask=valid, other=-float("inf"))
    m = tl.max(s, 0)
    e = tl.where(valid, tl.exp2((s - m) * scale_log2e), 0.0)
    z = tl.sum(e, 0)
    es = tl.where(valid, e, -1.0)
    p = tl.load(p_ptr + row)
    lo = tl.full([], 0.0, tl.float32)
    hi = tl.full([], 1.0, tl.float32)
    it = 0
    while (lo < hi) & (it < 64):
        lof = tl.maximum(lo, hi * 5.421011e-20)
        mid = tl.sqrt(lof) * tl.sqrt(hi)
        mid = tl.where(mid > lo, mid, hi)
        mid = tl.minimum(mid, hi)
        ge = es >= mid
        mass = tl.sum(tl.where(ge, es, 0.0), 0)
        up = tl.min(tl.where(ge, es, float("inf")), 0)
        down = tl.max(tl.where(ge, -1.0, es), 0)
        ok = mass / z >= p
        lo = tl.where(ok, up, lo)
        hi = tl.where(ok, hi, tl.maximum(down, lo))
        it += 1
    return offs, valid, base, es, lo


@triton.jit
def topp_search(s_ptr, p_ptr, keep_ptr, n, scale_log2e, BLOCK: tl.constexpr):
    offs, valid, base, es, lo = _search_row(s_ptr, p_ptr, n, scale_log2e, BLOCK)
    tl.store(keep_ptr + base + offs, (es >= lo).to(tl.int8), mask=valid)


@triton.jit
def topp_search_csr(s_ptr, p_ptr, staged_ptr, budget_ptr, n, scale_log2e, BLOCK: tl.constexpr):
    offs, valid, base, es, lo = _search_row(s_ptr, p_ptr, n, scale_log2e, BLOCK)
    keep = (es >= lo).to(tl.int32)
    rank = tl.cumsum(keep, 0)
    # Candidate positions are 0..n-1 here: the position is the offset.
    tl.store(staged_ptr + base + rank - 1, offs, mask=keep > 0)
    tl.store(budget_ptr + tl.program_id(0), tl.sum(keep, 0))


@triton.jit
def pack_csr(budget_ptr, staged_ptr, indptr_ptr, sel_ptr, n, TILE: tl.constexpr):
    row = tl.program_id(0)
    before = tl.zeros([], tl.int32)
    for t0 in range(0, row, TILE):
        idx = t0 + tl.arange(0, TILE)
        before += tl.sum(tl.load(budget_ptr + idx, mask=idx < row, other=0), 0)
    count = tl.load(budget_ptr + row)
    src = staged_ptr + row.to(tl.int64) * n
    for t0 in range(0, count, TILE):
        idx = t0 + tl.arange(0, TILE)
        ok = idx < count
        tl.store(sel_ptr + before + idx, tl.load(src + idx, mask=ok), mask=ok)
    tl.store(indptr_ptr + row + 1, before + count)


def torch_topp(s, p, scale):
    probs = torch.softmax(s * scale, dim=-1)
    sp, idx = torch.sort(probs, dim=-1, descending=True)
    cs = torch.cumsum(sp, dim=-1)
    keep_sorted = (cs - sp) < p
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(-1, idx, keep_sorted)
    return keep


def logits(rows, n, gen, focus):
    # Attention-like rows: a few heavy tokens over a diffuse background, times `focus`
    # (as `gpu-check threshold --focus`).
    s = torch.randn(rows, n, device="cuda", generator=gen) * 2.0
    spikes = torch.rand(rows, n, device="cuda", generator=gen) < 0.01
    return (s + spikes * 6.0) * focus


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--focus", type=float, default=1.0,
                    help="multiplies the logits: 1 diffuse rows (~86%% kept), 12 focused (~2%% at 32768)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    out = {"copy_gbps": copy_gbps(), "focus": args.focus, "cases": []}
    scale = 1.0 / (128 ** 0.5)
    try:
        import flashinfer.sampling as fis
    except Exception as e:  # noqa: BLE001
        fis = None
        out["flashinfer_error"] = repr(e)
    for rows, n in [(2048, 8192), (2048, 32768), (2048, 4096)]:
        sets = [logits(rows, n, gen, args.focus) for _ in range(2)]
        probs = [torch.softmax(s * scale, dim=-1) for s in sets]
        p = torch.full((rows,), 0.9, device="cuda")
        keep = torch.empty(rows, n, dtype=torch.int8, device="cuda")
        case = {"rows": rows, "n": n, "p": 0.9}
        k = [0]

        def rot(xs):
            k[0] ^= 1
            return xs[k[0]]

        block = triton.next_power_of_2(n)
        tri = lambda: topp_search[(rows,)](rot(sets), p, keep, n, scale * LOG2E, BLOCK=block, num_warps=8)
        staged = torch.empty(rows * n, dtype=torch.int32, device="cuda")
        budget = torch.empty(rows, dtype=torch.int32, device="cuda")
        indptr = torch.zeros(rows + 1, dtype=torch.int32, device="cuda")
        sel = torch.empty(rows * n, dtype=torch.int32, device="cuda")

        def tri_csr():
            topp_search_csr[(rows,)](rot(sets), p, staged, budget, n, scale * LOG2E, BLOCK=block, num_warps=8)
            pack_csr[(rows,)](budget, staged, indptr, sel, n, TILE=1024, num_warps=4)

        try:
            case["triton_mask_us"] = median_us(tri)
            case["triton_us"] = median_us(tri_csr)
            # The CSR version keeps what the mask version keeps, on one input.
            topp_search[(rows,)](sets[0], p, keep, n, scale * LOG2E, BLOCK=block, num_warps=8)
            topp_search_csr[(rows,)](sets[0], p, staged, budget, n, scale * LOG2E, BLOCK=block, num_warps=8)
            case["triton_csr_budgets_match_mask"] = bool((budget == keep.sum(dim=1, dtype=torch.int32)).all().item())
            # The Triton kernel's sets against the sort-based ones, on the last input.
            ref = torch_topp(sets[k[0]], 0.9, scale)
            case["triton_rows_equal_to_sort"] = int((keep.bool() == ref).all(dim=-1).sum().item())
        except Exception as e:  # noqa: BLE001
            case["triton_error"] = repr(e)[:300]
        case["torch_us"] = median_us(lambda: torch_topp(rot(sets), 0.9, scale))
        if fis is not None:
            try:
                case["flashinfer_us"] = median_us(lambda: fis.top_p_renorm_probs(rot(probs), p))
            except Exception as e:  # noqa: BLE001
                case["flashinfer_error"] = repr(e)
        print(case, flush=True)
        out["cases"].append(case)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
