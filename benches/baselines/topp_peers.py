"""Peers of dusk's fused top-p threshold search, timed in one process on the same shapes:

- flashinfer: `flashinfer.sampling.top_p_renorm_probs` (the kernel Twilight's top-p was
  forked from), on probabilities (its softmax is not timed);
- torch: softmax, sort, cumsum, mask (the sort-based oracle on the GPU);
- triton: the same job as dusk's (softmax in registers, binary search with bounds snapped to
  elements, one where/sum/min/max pass a step), with the same output: the kept positions,
  ascending, compacted into CSR. `triton_us` times the whole job: the search kernel writing
  a keep mask, a kernel counting each row's kept positions, and a kernel packing them (each
  row after the earlier rows' counts, a position's place its rank by a prefix sum over the
  mask); `triton_mask_us` times the search alone, for reference. Both run the very same
  compiled search, so they keep the same positions; before timing, the CSR output is
  checked against the mask version on every input set, and a mismatch stops the script
  (exit status 1, with a message). (A CSR version fused into the search kernel, as before,
  compiled its sums in another register layout than the mask kernel: the float sums came
  out in another order and near-tie rows kept one position more or less.)

Timed by harness.py, the rule dusk's side follows too: the scores (or probabilities) come
in `rotation_sets(rows x n x 4 bytes)` sets, together more than twice the L2, and each
peer's calls, cycling through them, are captured in a CUDA graph and replayed between two
events (GPU time per call, the median of the replays), or queued between two events where
capture fails. Writes JSON with each peer's time (`<peer>_us`), how it was timed
(`<peer>_timing`: "graph" or "queued") and its spread (`<peer>_spread_us`: min, p10, p50,
p90, max), and the device copy bandwidth measured by the same rule. `--focus F` multiplies
the logits (the rows `gpu-check threshold --focus F` times).

    python3 benches/baselines/topp_peers.py --out peers.json [--focus 12]
"""
import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def topp_search(s_ptr, p_ptr, keep_ptr, n, scale_log2e, BLOCK: tl.constexpr):
    """One row a program: the row's weights e = exp2((s - max) * scale_log2e) in registers,
    the threshold `lo` searched (the smallest weight whose >= set holds p of the mass), and
    the keep mask (e >= lo) written as int8."""
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
    tl.store(keep_ptr + base + offs, (es >= lo).to(tl.int8), mask=valid)


@triton.jit
def count_kept(keep_ptr, budget_ptr, n, TILE: tl.constexpr):
    """Each row's kept positions, counted from the search's mask."""
    row = tl.program_id(0)
    src = keep_ptr + row.to(tl.int64) * n
    acc = tl.zeros([TILE], tl.int32)
    for t0 in range(0, n, TILE):
        idx = t0 + tl.arange(0, TILE)
        acc += tl.load(src + idx, mask=idx < n, other=0).to(tl.int32)
    tl.store(budget_ptr + row, tl.sum(acc, 0))


@triton.jit
def pack_kept(keep_ptr, budget_ptr, indptr_ptr, sel_ptr, n, TILE: tl.constexpr, RTILE: tl.constexpr):
    """Row `row`'s kept positions, ascending, at `sel[indptr[row]..indptr[row + 1]]`: the row
    starts after the earlier rows' counts; a position's place in it is its rank among the
    row's kept positions (a prefix sum over the mask)."""
    row = tl.program_id(0)
    before = tl.zeros([], tl.int32)
    for r0 in range(0, row, RTILE):
        ridx = r0 + tl.arange(0, RTILE)
        before += tl.sum(tl.load(budget_ptr + ridx, mask=ridx < row, other=0), 0)
    src = keep_ptr + row.to(tl.int64) * n
    done = tl.zeros([], tl.int32)
    for t0 in range(0, n, TILE):
        idx = t0 + tl.arange(0, TILE)
        k = tl.load(src + idx, mask=idx < n, other=0).to(tl.int32)
        rank = tl.cumsum(k, 0)
        tl.store(sel_ptr + before + done + rank - 1, idx, mask=k > 0)
        done += tl.sum(k, 0)
    tl.store(indptr_ptr + row + 1, before + done)
    if row == 0:
        tl.store(indptr_ptr, 0)


def triton_mask(s, p, keep, scale):
    """The search alone: the keep mask (int8, rows x n)."""
    rows, n = s.shape
    topp_search[(rows,)](s, p, keep, n, scale * LOG2E, BLOCK=triton.next_power_of_2(n), num_warps=8)


def triton_csr(s, p, keep, budget, indptr, sel, scale):
    """The Triton peer's full job: the search (the very kernel `triton_mask` launches, so
    both keep the same positions), then the kept positions compacted into CSR (`indptr`,
    rows + 1; `sel`, ascending within a row)."""
    rows, n = s.shape
    triton_mask(s, p, keep, scale)
    tile = min(triton.next_power_of_2(n), 4096)
    count_kept[(rows,)](keep, budget, n, TILE=tile, num_warps=4)
    pack_kept[(rows,)](keep, budget, indptr, sel, n, TILE=tile, RTILE=1024, num_warps=4)


class CsrMismatch(SystemExit):
    pass


def check_csr(s, p, scale):
    """Runs the mask version and the CSR version on scores `s` and stops the script
    (exit status 1, with a message) unless the CSR output is exactly the mask's kept
    positions: the same count a row, the same positions, ascending, rows in order."""
    rows, n = s.shape
    dev = s.device
    mask = torch.zeros(rows, n, dtype=torch.int8, device=dev)
    triton_mask(s, p, mask, scale)
    keep = torch.full((rows, n), 7, dtype=torch.int8, device=dev)
    budget = torch.full((rows,), -1, dtype=torch.int32, device=dev)
    indptr = torch.full((rows + 1,), -1, dtype=torch.int32, device=dev)
    sel = torch.full((rows * n,), -1, dtype=torch.int32, device=dev)
    triton_csr(s, p, keep, budget, indptr, sel, scale)
    counts = mask.sum(dim=1, dtype=torch.int32)
    want_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
    want_indptr[1:] = counts.cumsum(0)
    want_sel = mask.nonzero()[:, 1].to(torch.int32)  # row-major: rows in order, ascending
    total = int(want_indptr[-1].item())
    problems = []
    if not torch.equal(keep, mask):
        problems.append(f"the CSR run's search kept other positions in {int((keep != mask).any(1).sum())} rows")
    if not torch.equal(budget, counts):
        bad = (budget != counts).nonzero()[:, 0]
        problems.append(f"budgets differ in {bad.numel()} rows (row {int(bad[0])}: {int(budget[bad[0]])} vs {int(counts[bad[0]])})")
    if not torch.equal(indptr, want_indptr):
        problems.append("indptr differs")
    if not torch.equal(sel[:total], want_sel):
        problems.append(f"positions differ at {int((sel[:total] != want_sel).sum())} of {total}")
    if problems:
        raise CsrMismatch(f"topp_peers.py: the Triton CSR output does not match its mask version "
                          f"(rows {rows}, n {n}): " + "; ".join(problems))
    return mask


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
    copy, copy_m = harness.measure_copy()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "l2_bytes": harness.l2_bytes(),
           "copy_gbps": copy, "copy_timing": copy_m.timing, "focus": args.focus, "cases": []}
    scale = 1.0 / (128 ** 0.5)
    try:
        import flashinfer
        import flashinfer.sampling as fis
        out["flashinfer"] = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        fis = None
        out["flashinfer_error"] = repr(e)
    for rows, n in [(2048, 8192), (2048, 32768), (2048, 4096)]:
        nsets = harness.rotation_sets(rows * n * 4)
        sets = [logits(rows, n, gen, args.focus) for _ in range(nsets)]
        probs = [torch.softmax(s * scale, dim=-1) for s in sets]
        p = torch.full((rows,), 0.9, device="cuda")
        case = {"rows": rows, "n": n, "p": 0.9, "rotation_sets": nsets}
        keep = torch.empty(rows, n, dtype=torch.int8, device="cuda")
        budget = torch.empty(rows, dtype=torch.int32, device="cuda")
        indptr = torch.empty(rows + 1, dtype=torch.int32, device="cuda")
        sel = torch.empty(rows * n, dtype=torch.int32, device="cuda")
        try:
            # The CSR version keeps what the mask version keeps, on every set (else exit 1).
            masks = [check_csr(s, p, scale) for s in sets]
            case["triton_csr_budgets_match_mask"] = True
            case["kept_fraction"] = sum(m.sum(dtype=torch.int64).item() for m in masks) / (nsets * rows * n)
            # The Triton kernel's sets against the sort-based ones, on the first input.
            ref = torch_topp(sets[0], 0.9, scale)
            case["triton_rows_equal_to_sort"] = int((masks[0].bool() == ref).all(dim=-1).sum().item())
            del masks, ref
            harness.put(case, "triton_mask", harness.measure(
                [lambda s=s: triton_mask(s, p, keep, scale) for s in sets]))
            harness.put(case, "triton", harness.measure(
                [lambda s=s: triton_csr(s, p, keep, budget, indptr, sel, scale) for s in sets]))
        except CsrMismatch:
            raise
        except Exception as e:  # noqa: BLE001
            case["triton_error"] = repr(e)[:300]
        harness.put(case, "torch", harness.measure([lambda s=s: torch_topp(s, 0.9, scale) for s in sets]))
        if fis is not None:
            try:
                harness.put(case, "flashinfer", harness.measure(
                    [lambda q=q: fis.top_p_renorm_probs(q, p) for q in probs]))
            except Exception as e:  # noqa: BLE001
                case["flashinfer_error"] = repr(e)[:300]
        print(json.dumps(case), flush=True)
        out["cases"].append(case)
        del sets, probs, keep, budget, indptr, sel
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
