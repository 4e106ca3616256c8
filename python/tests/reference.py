"""Plain NumPy versions of dusk's kernels: the oracles of the tests."""

import numpy as np


def random_table(rng, seq_lens, page_size, num_pages=None):
    """A CSR page table for sequences of `seq_lens` tokens over shuffled page ids."""
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    total = sum(pages)
    num_pages = num_pages or max(total, 1)
    ids = rng.permutation(num_pages)[:total].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array(
        [0 if p == 0 else n - (p - 1) * page_size for n, p in zip(seq_lens, pages)], np.int32
    )
    return indptr, ids, last, num_pages


def grow_table(indptr, ids, last, spare, page_size):
    """One more token a sequence, in place (`ids` with room past `indptr[-1]`): a page from
    `spare` where the last is full, inserted after the sequence's others."""
    for b in range(len(last)):
        if last[b] == page_size:
            at, used = indptr[b + 1], indptr[-1]
            ids[at + 1 : used + 1] = ids[at:used].copy()
            ids[at] = spare.pop()
            indptr[b + 1 :] += 1
            last[b] = 0
        last[b] += 1


def seq_len(indptr, last, page_size, b):
    pages = int(indptr[b + 1] - indptr[b])
    return 0 if pages == 0 else (pages - 1) * page_size + int(last[b])


def token_rows(cache, indptr, page_ids, page_size, b, positions, head):
    """Rows `cache[page, slot, head]` of sequence `b`'s tokens at `positions`."""
    positions = np.asarray(positions, np.int64)
    pages = page_ids[indptr[b] + positions // page_size]
    return cache[pages, positions % page_size, head]


def quantize(k, bits):
    """(packed, scale, zero) as quantize_k writes them (f32 arithmetic, f16 scale/zero),
    head-major: `[pages, kv_heads, page_size, ...]` from K's `[pages, page_size, kv_heads, d]`."""
    k = np.ascontiguousarray(np.swapaxes(k, 1, 2))
    levels = (1 << bits) - 1
    x = k.astype(np.float32)
    hi = x.max(axis=-1)
    lo = x.min(axis=-1)
    scale = ((hi - lo) / np.float32(levels)).astype(np.float16)
    zero = lo.astype(np.float16)
    step = scale.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(step > 0, np.float32(1) / np.where(step > 0, step, 1), 0).astype(np.float32)
    codes = (x - zero.astype(np.float32)[..., None]) * inv[..., None] + np.float32(0.5)
    codes = np.clip(codes, 0, levels).astype(np.uint8)
    if bits == 4:
        packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    else:
        packed = codes
    return packed.astype(np.uint8), scale, zero


def dequantize(packed, scale, zero, bits):
    """K as `[pages, page_size, kv_heads, d]` (f64) from the head-major copy."""
    if bits == 4:
        lo = packed & 0xF
        hi = packed >> 4
        codes = np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    else:
        codes = packed
    kd = codes.astype(np.float64) * scale.astype(np.float64)[..., None] + zero.astype(
        np.float64
    )[..., None]
    return np.swapaxes(kd, 1, 2)


def spgemv(q, kd, indptr, page_ids, page_size, cand_indptr, cand_indices, num_kv_heads):
    """Scores in spgemv_quant's layout: row r's block at cand_indptr[r] * group, one run
    of its candidates per query head of the group."""
    batch, hq, _ = q.shape
    group = hq // num_kv_heads
    out = np.zeros(len(cand_indices) * group)
    for r in range(len(cand_indptr) - 1):
        b, h = divmod(r, num_kv_heads)
        s, e = cand_indptr[r], cand_indptr[r + 1]
        rows = token_rows(kd, indptr, page_ids, page_size, b, cand_indices[s:e], h)
        for g in range(group):
            out[s * group + g * (e - s) : s * group + (g + 1) * (e - s)] = rows @ q[
                b, h * group + g
            ].astype(np.float64)
    return out


def softmax(x):
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return x
    e = np.exp(x - x.max())
    return e / e.sum()


def kept_count(w, policy, params):
    """How many of the heaviest weights `policy` keeps, and whether a neighbouring count
    is as right (the cut within rounding of the target)."""
    order = np.sort(w)[::-1]
    cum = np.cumsum(order)
    n = len(w)
    if n == 0:
        return 0, set()
    if policy == "top_p":
        p = params["p"]
        c = int(np.searchsorted(cum, p - 1e-12) + 1)
        c = min(c, n)
        near = {c - 1, c + 1} if (abs(cum[c - 1] - p) < 1e-4 or (c >= 2 and abs(cum[c - 2] - p) < 1e-4)) else set()
        return c, near
    if policy == "top_k":
        return min(int(params["k"]), n), set()
    if policy == "ratio_to_max":
        c = int((w >= params["ratio"] * w.max()).sum())
        return c, {c - 1, c + 1}
    if policy == "top_p_bounded":
        p, lo, hi = params["p"], int(params["min_k"]), int(params["max_k"])
        cp = min(int(np.searchsorted(cum, p - 1e-12) + 1), n)
        c = min(max(cp, lo), hi, n)
        near = {c - 1, c + 1} if abs(cum[cp - 1] - p) < 1e-4 else set()
        return c, near
    raise ValueError(policy)


def check_pruned(kept, positions, weights_by_head, policy, params_by_head):
    """`kept` (ascending positions) must be the union over the group's heads of each
    head's heaviest `kept_count` candidates (or a neighbouring count where the cut is
    within rounding)."""
    kept = set(int(x) for x in kept)
    positions = np.asarray(positions)
    want = set()
    loose = False
    for w, params in zip(weights_by_head, params_by_head):
        c, near = kept_count(w, policy, params)
        top = np.argsort(-w, kind="stable")
        want |= set(int(x) for x in positions[top[:c]])
        loose |= bool(near)
    if loose:
        # The count may differ by one at the cut: the kept set is still made of the
        # heaviest candidates of the heads.
        assert len(kept ^ want) <= len(weights_by_head), (sorted(kept), sorted(want))
    else:
        assert kept == want, (sorted(kept), sorted(want))


def attention(q, k, v, indptr, page_ids, last, page_size, rows, sm_scale):
    """out, lse for each query row (b, h) over the positions `rows(b, h)`."""
    batch, hq, d = q.shape
    hkv = k.shape[2]
    group = hq // hkv
    out = np.zeros((batch, hq, d))
    lse = np.zeros((batch, hq))
    for b in range(batch):
        for h in range(hq):
            pos = rows(b, h)
            if len(pos) == 0:
                lse[b, h] = -np.inf
                continue
            kr = token_rows(k, indptr, page_ids, page_size, b, pos, h // group).astype(np.float64)
            vr = token_rows(v, indptr, page_ids, page_size, b, pos, h // group).astype(np.float64)
            s = kr @ q[b, h].astype(np.float64) * sm_scale
            m = s.max()
            e = np.exp(s - m)
            out[b, h] = e @ vr / e.sum()
            lse[b, h] = m + np.log(e.sum())
    return out, lse


def quest_page_scores(q, k, indptr, page_ids, last, page_size, b, h):
    """Quest's score of each page of sequence `b` for KV head `h` (f64): the group's
    `sum_g sum_d max(q_gd * min_d, q_gd * max_d)` over the page's valid tokens' min and max."""
    hkv = k.shape[2]
    group = q.shape[1] // hkv
    pages = int(indptr[b + 1] - indptr[b])
    qg = q[b, h * group : (h + 1) * group].astype(np.float64)
    out = np.zeros(pages)
    for j in range(pages):
        n = page_size if j + 1 < pages else int(last[b])
        rows = k[page_ids[indptr[b] + j], :n, h].astype(np.float64)
        lo, hi = rows.min(axis=0), rows.max(axis=0)
        out[j] = np.maximum(qg * lo, qg * hi).sum()
    return out


def quest_budget_pages(n, budget, page_size, sink=False):
    """Pages Quest keeps of a sequence of `n` tokens: `budget` tokens (an int) or a
    fraction of them (a float), rounded up to pages; at least the always-kept ones."""
    pages = -(-n // page_size)
    tokens = budget if isinstance(budget, int) else int(np.ceil(budget * n))
    keep = -(-tokens // page_size)
    return min(max(keep, 2 if sink and pages > 1 else 1), pages)
