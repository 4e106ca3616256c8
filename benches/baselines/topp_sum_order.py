"""Why the Triton peer's old fused CSR kernel did not match its mask version
(`triton_csr_budgets_match_mask: false` in the results before this script's commit), shown
on the CPU, no GPU needed:

    python3 benches/baselines/topp_sum_order.py layouts        # needs triton (compiles for sm_90)
    python3 benches/baselines/topp_sum_order.py sums 32768 1   # numpy only; n, focus[, rows]

1. `layouts`: compiles the mask kernel (`topp_peers.topp_search`) and the old fused CSR
   kernel (kept below as it was) for sm_90, n divisible by 16 as at run time, and prints the
   register layouts Triton chose. The mask kernel's contiguous int8 store makes the whole
   row 16 elements a thread; the CSR kernel's scattered int32 store leaves the load's 4.
   The search's float sums (z and each step's mass) are reduced over those layouts, so the
   two kernels add the same weights in another order.
2. `sums`: the search in numpy fp32 with Triton's reduction order emulated for 16 and for 4
   elements a thread (in-thread sums in register order, then lane and warp butterflies),
   on the script's logits. Rows where `mass / z >= p` lands on the other side of p at the
   cutoff keep one position more or less: e.g. 4 of 2048 rows at n = 32768, focus 1; the
   same order twice never differs. The GPU runs had such rows in most cases of 2048 rows.

The fix (topp_peers.py): the CSR version runs the very same compiled search kernel as the
mask version, then compacts the mask into CSR, so both keep the same positions by
construction; the script checks it and exits 1 otherwise.
"""
import sys

import numpy as np


def tsum(x, spt, warps=8):
    """fp32 sum of each row of `x` (rows x BLOCK) in the order of a Triton reduction over a
    blocked layout of `spt` contiguous elements a thread, 32 lanes, `warps` warps."""
    rows, block = x.shape
    threads = 32 * warps
    reps = block // (spt * threads)
    v = x.reshape(rows, reps, threads, spt).transpose(0, 2, 1, 3).reshape(rows, threads, reps * spt)
    acc = v[:, :, 0].copy()
    for j in range(1, reps * spt):
        acc = (acc + v[:, :, j]).astype(np.float32)
    acc = acc.reshape(rows, warps, 32)
    lane = np.arange(32)
    for off in (16, 8, 4, 2, 1):
        acc = (acc + acc[:, :, lane ^ off]).astype(np.float32)
    w = acc[:, :, 0]
    wl = np.arange(warps)
    off = warps // 2
    while off:
        w = (w + w[:, wl ^ off]).astype(np.float32)
        off //= 2
    return w[:, 0]


def search(s, p, c, spt):
    """topp_search's threshold search in numpy fp32, its sums in `tsum`'s order; returns
    each row's kept count."""
    f = np.float32
    e = np.exp2((s - s.max(axis=1, keepdims=True)) * f(c)).astype(np.float32)
    z = tsum(e, spt)
    rows = s.shape[0]
    lo = np.zeros(rows, np.float32)
    hi = np.ones(rows, np.float32)
    for _ in range(64):
        act = lo < hi
        if not act.any():
            break
        lof = np.maximum(lo, hi * f(5.421011e-20))
        mid = (np.sqrt(lof) * np.sqrt(hi)).astype(np.float32)
        mid = np.minimum(np.where(mid > lo, mid, hi), hi)
        ge = e >= mid[:, None]
        mass = tsum(np.where(ge, e, f(0)), spt)
        up = np.where(ge, e, np.inf).min(axis=1).astype(np.float32)
        down = np.where(ge, f(-1), e).max(axis=1).astype(np.float32)
        ok = (mass / z).astype(np.float32) >= f(p)
        lo = np.where(act & ok, up, lo)
        hi = np.where(act & ~ok, np.maximum(down, lo), hi)
    return (e >= lo[:, None]).sum(axis=1)


def sums(n, focus, rows=2048):
    rng = np.random.default_rng(1)
    s = rng.standard_normal((rows, n), dtype=np.float32) * 2.0
    s = ((s + (rng.random((rows, n)) < 0.01) * 6.0) * focus).astype(np.float32)
    c = (1.0 / 128 ** 0.5) * 1.4426950408889634
    k16, k4, k4b = search(s, 0.9, c, 16), search(s, 0.9, c, 4), search(s, 0.9, c, 4)
    d = np.nonzero(k16 != k4)[0]
    print(f"n={n} focus={focus}: rows whose kept count differs between 16 and 4 elements a "
          f"thread: {len(d)} of {rows}; between two runs of the same order: {int((k4 != k4b).sum())}; "
          f"(row, kept, kept): {[(int(r), int(k16[r]), int(k4[r])) for r in d[:5]]}")


def layouts():
    import os
    import re

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import topp_peers

    @triton.jit
    def old_topp_search_csr(s_ptr, p_ptr, staged_ptr, budget_ptr, n, scale_log2e, BLOCK: tl.constexpr):
        # The old fused CSR kernel: the same search, then ranks by a prefix sum into staging.
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
        keep = (es >= lo).to(tl.int32)
        rank = tl.cumsum(keep, 0)
        tl.store(staged_ptr + base + rank - 1, offs, mask=keep > 0)
        tl.store(budget_ptr + tl.program_id(0), tl.sum(keep, 0))

    def compile_layouts(fn, sig, block):
        attrs = {(i,): [["tt.divisibility", 16]] for i, v in enumerate(sig.values()) if v[0] == "*" or v == "i32"}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": block}, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        ir = k.asm["ttgir"]
        reduced = set(re.findall(r"tt\.reduce.*?\(tensor<\d+xf32, (#blocked\d*)>\)", ir, re.S))
        defs = dict(re.findall(r"(#blocked\d*) = #ttg\.blocked<\{sizePerThread = \[(\d+)\]", ir))
        return sorted(int(defs[b]) for b in reduced)

    for block in (4096, 8192, 32768):
        mask = compile_layouts(topp_peers.topp_search, {"s_ptr": "*fp32", "p_ptr": "*fp32", "keep_ptr": "*i8", "n": "i32",
                                                         "scale_log2e": "fp32", "BLOCK": "constexpr"}, block)
        csr = compile_layouts(old_topp_search_csr, {"s_ptr": "*fp32", "p_ptr": "*fp32", "staged_ptr": "*i32",
                                                    "budget_ptr": "*i32", "n": "i32", "scale_log2e": "fp32",
                                                    "BLOCK": "constexpr"}, block)
        print(f"BLOCK {block}: float sums reduced over {mask} elements a thread in the mask kernel, "
              f"{csr} in the old CSR kernel")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "layouts":
        layouts()
    elif len(sys.argv) > 3 and sys.argv[1] == "sums":
        sums(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 2048)
    else:
        sys.exit(__doc__)
