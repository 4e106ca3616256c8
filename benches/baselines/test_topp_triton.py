"""CPU check of topp_peers.py's Triton peer under Triton's interpreter (no GPU needed):

    TRITON_INTERPRET=1 python3 benches/baselines/test_topp_triton.py

needs torch (CPU) and triton. On small random rows, with ties, rows of many lengths (powers
of two and not, one tile and several) and several p: the CSR output equals the mask
version's kept positions (`check_csr`, which the script runs on the GPU before timing), the
compaction kernels are right on any mask (several tiles a row, several tiles of earlier
rows), `check_csr` stops on a wrong CSR output, and the mask is the top-p set (against a
float64 sort, away from near ties).
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import topp_peers as tp  # noqa: E402

SCALE = 1.0 / (128 ** 0.5)
torch.manual_seed(0)
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def rows_of(rows, n, kind):
    s = torch.randn(rows, n) * 2.0
    if kind == "ties":  # few distinct values: large tie groups at the cutoff
        s = torch.round(s)
    elif kind == "flat":
        s = torch.zeros(rows, n)
    elif kind == "focused":
        s = (s + (torch.rand(rows, n) < 0.02) * 6.0) * 12.0
    return s.float().contiguous()


def ref_keep(s, p):
    """float64 top-p: the smallest >= set of weights holding p of the mass, ties kept together,
    and each row's distance from a near tie (how far the mass at the cutoff is from p)."""
    e = torch.exp2((s.double() - s.double().max(1, keepdim=True).values) * SCALE * tp.LOG2E)
    z = e.sum(1, keepdim=True)
    srt = e.sort(1, descending=True).values
    cs = srt.cumsum(1) / z
    k = (cs < p[:, None].double()).sum(1).clamp(max=s.shape[1] - 1)
    t = srt.gather(1, k[:, None])
    margin = (cs - p[:, None].double()).abs().min(1).values
    return e >= t, margin


checked = 0
for n in [1, 2, 3, 7, 16, 100, 128, 1000, 4096, 5000]:
    for kind in ["randn", "ties", "flat", "focused"]:
        rows = 6 if n <= 1000 else 2
        s = rows_of(rows, n, kind)
        p = torch.tensor([0.9, 0.5, 0.99, 1.0, 0.1, 0.85])[:rows].float()
        mask = tp.check_csr(s, p, SCALE)  # raises CsrMismatch (exit 1) on a mismatch
        checked += rows
        want, margin = ref_keep(s, p)
        clear = margin > 1e-5
        expect(torch.equal(mask.bool()[clear], want[clear]),
               f"mask is the top-p set (n {n}, {kind}): {(mask.bool() != want).any(1).tolist()}")

# The compaction kernels alone, on random masks, with small tiles: several tiles in a row
# and several tiles of earlier rows' counts.
for rows, n, tile, rtile in [(9, 37, 8, 4), (5, 64, 16, 2), (3, 1, 1, 1), (17, 20, 32, 4)]:
    keep = (torch.rand(rows, n) < 0.4).to(torch.int8)
    keep[0] = 0  # an empty row
    budget = torch.full((rows,), -1, dtype=torch.int32)
    indptr = torch.full((rows + 1,), -1, dtype=torch.int32)
    sel = torch.full((rows * n,), -1, dtype=torch.int32)
    tp.count_kept[(rows,)](keep, budget, n, TILE=tile)
    tp.pack_kept[(rows,)](keep, budget, indptr, sel, n, TILE=tile, RTILE=rtile)
    counts = keep.sum(1, dtype=torch.int32)
    want_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).int()])
    expect(torch.equal(budget, counts), f"count_kept rows {rows} n {n} tile {tile}")
    expect(torch.equal(indptr, want_indptr), f"indptr rows {rows} n {n} tile {tile}")
    total = int(want_indptr[-1])
    expect(torch.equal(sel[:total], keep.nonzero()[:, 1].int()), f"sel rows {rows} n {n} tile {tile}")

# check_csr stops the script when the CSR output is wrong.
real = tp.triton_csr


def off_by_one(s, p, keep, budget, indptr, sel, scale):
    real(s, p, keep, budget, indptr, sel, scale)
    budget[1] += 1


tp.triton_csr = off_by_one
try:
    tp.check_csr(rows_of(4, 50, "randn"), torch.full((4,), 0.9), SCALE)
    expect(False, "check_csr stops on a wrong budget")
except SystemExit as e:
    expect(isinstance(e, tp.CsrMismatch) and "budgets differ" in str(e), f"check_csr message: {e}")
finally:
    tp.triton_csr = real

print(f"{checked} searched rows checked")
print(f"{0 if failures else 1} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
