"""Each op of the package on the CPU (dusk's interpreter), NumPy arrays through DLPack,
against plain NumPy references; and that the kernels read and write the caller's memory
(pointer identity, in-place updates seen by the next run)."""

import numpy as np
import pytest

import dusk
import reference as ref

PAGE = 16


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def quantized(rng, shape, bits=4):
    k = rng.standard_normal(shape).astype(np.float16)
    pshape, sshape = dusk.quantized_k_shapes(shape, bits)
    packed = np.full(pshape, 0xAB, np.uint8)
    scale = np.full(sshape, np.nan, np.float16)
    zero = np.full(sshape, np.nan, np.float16)
    dusk.quantize_k(k, packed, scale, zero)
    return k, packed, scale, zero


@pytest.mark.parametrize("bits,head_dim", [(4, 64), (8, 64), (4, 128)])
def test_quantize_k_matches_numpy(rng, bits, head_dim):
    shape = (3, PAGE, 2, head_dim)
    k, packed, scale, zero = quantized(rng, shape, bits)
    want_packed, want_scale, want_zero = ref.quantize(k, bits)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(zero, want_zero)
    # Codes are computed alike in f32; allow a code one step off where rounding ties.
    lo_hi = lambda p: np.stack([p & 0xF, p >> 4]) if bits == 4 else p  # noqa: E731
    diff = np.abs(lo_hi(packed).astype(int) - lo_hi(want_packed).astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    # Dequantized codes are within half a step of k.
    back = ref.dequantize(packed, scale, zero, bits)
    step = np.swapaxes(scale, 1, 2).astype(np.float64)[..., None]  # as back: [pages, slots, heads]
    assert np.all(np.abs(back - k) <= 0.5 * step + 1e-3)


def test_outputs_are_the_callers_memory(rng):
    shape = (2, PAGE, 2, 64)
    k = rng.standard_normal(shape).astype(np.float16)
    pshape, sshape = dusk.quantized_k_shapes(shape)
    packed = np.zeros(pshape, np.uint8)
    scale = np.zeros(sshape, np.float16)
    zero = np.zeros(sshape, np.float16)
    addresses = [a.ctypes.data for a in (k, packed, scale, zero)]
    # What dusk reads and writes is the arrays' own memory.
    assert [dusk.data_ptr(a) for a in (k, packed, scale, zero)] == addresses
    dusk.quantize_k(k, packed, scale, zero)
    assert [a.ctypes.data for a in (k, packed, scale, zero)] == addresses
    assert scale.any() and packed.any()
    # Views: a slice of a larger array is written in place, its neighbours untouched.
    big = np.full((4,) + pshape[1:], 7, np.uint8)
    dusk.quantize_k(k, big[1:3], scale, zero)
    np.testing.assert_array_equal(big[1:3], packed)
    assert (big[0] == 7).all() and (big[3] == 7).all()


def spgemv_case(rng, seq_lens, hkv, hq, head_dim, bits=4, frac=None):
    indptr, ids, last, num_pages = ref.random_table(rng, seq_lens, PAGE, num_pages=None)
    num_pages += 3
    shape = (num_pages, PAGE, hkv, head_dim)
    k, packed, scale, zero = quantized(rng, shape, bits)
    cand_indptr, cand_indices = [0], []
    for b, n in enumerate(seq_lens):
        for _ in range(hkv):
            pos = np.arange(n) if frac is None else np.sort(rng.choice(n, max(1, int(n * frac)), replace=False))
            cand_indices.extend(pos.tolist())
            cand_indptr.append(len(cand_indices))
    cand_indptr = np.array(cand_indptr, np.int32)
    cand_indices = np.array(cand_indices, np.int32)
    q = rng.standard_normal((len(seq_lens), hq, head_dim)).astype(np.float16)
    return dict(
        indptr=indptr, ids=ids, last=last, num_pages=num_pages, k=k, packed=packed,
        scale=scale, zero=zero, cand_indptr=cand_indptr, cand_indices=cand_indices, q=q,
        hkv=hkv, hq=hq, head_dim=head_dim, bits=bits,
    )


def run_spgemv(c):
    s = dusk.SpgemvPlan("cpu")
    s.plan(
        c["indptr"], c["ids"], c["last"], c["cand_indptr"], c["cand_indices"],
        num_qo_heads=c["hq"], num_kv_heads=c["hkv"], head_dim=c["head_dim"],
        num_pages=c["num_pages"], bits=c["bits"],
    )
    scores = np.full(s.num_scores, np.nan, np.float32)
    s.run(c["q"], c["packed"], c["scale"], c["zero"], scores)
    return s, scores


@pytest.mark.parametrize("hkv,hq,bits", [(2, 8, 4), (2, 2, 4), (1, 4, 8)])
def test_spgemv_matches_numpy(rng, hkv, hq, bits):
    c = spgemv_case(rng, [40, 17], hkv, hq, 64, bits, frac=0.6)
    _, scores = run_spgemv(c)
    kd = ref.dequantize(c["packed"], c["scale"], c["zero"], bits)
    want = ref.spgemv(c["q"], kd, c["indptr"], c["ids"], PAGE, c["cand_indptr"], c["cand_indices"], hkv)
    assert np.isfinite(scores).all()
    err = np.abs(scores - want).max() / np.abs(want).max()
    assert err < 2e-3, err


def test_plan_once_run_many(rng):
    # The plan is made once; runs with new contents in the same arrays see the new values.
    c = spgemv_case(rng, [33], 2, 8, 64)
    s, scores = run_spgemv(c)
    q = c["q"]
    q[:] = rng.standard_normal(q.shape).astype(np.float16)
    address = scores.ctypes.data
    s.run(q, c["packed"], c["scale"], c["zero"], scores)
    assert scores.ctypes.data == address
    kd = ref.dequantize(c["packed"], c["scale"], c["zero"], 4)
    want = ref.spgemv(q, kd, c["indptr"], c["ids"], PAGE, c["cand_indptr"], c["cand_indices"], 2)
    assert np.abs(scores - want).max() / np.abs(want).max() < 2e-3


def prune(cand_indptr, cand_indices, scores, policy, params, group, sm_scale):
    p = dusk.PrunePlan("cpu")
    p.plan(cand_indptr, cand_indices, policy=policy, params=params, group=group, sm_scale=sm_scale)
    p.run(scores)
    return p


def check_prune(p, cand_indptr, cand_indices, scores, policy, params_of, group, sm_scale):
    sel_indptr = np.from_dlpack(p.sel_indptr)
    sel_indices = np.from_dlpack(p.sel_indices)
    budgets = np.from_dlpack(p.budgets)
    rows = len(cand_indptr) - 1
    assert sel_indptr[0] == 0
    for r in range(rows):
        s, e = cand_indptr[r], cand_indptr[r + 1]
        n = e - s
        kept = sel_indices[sel_indptr[r] : sel_indptr[r + 1]]
        assert np.all(np.diff(kept) > 0)
        assert budgets[r] == len(kept)
        weights = [
            ref.softmax(scores[s * group + g * n : s * group + (g + 1) * n] * sm_scale)
            for g in range(group)
        ]
        ref.check_pruned(kept, cand_indices[s:e], weights, policy, [params_of(r * group + g) for g in range(group)])


@pytest.mark.parametrize(
    "policy,params",
    [
        ("top_p", {"p": 0.9}),
        ("top_k", {"k": 5}),
        ("ratio_to_max", {"ratio": 0.3}),
        ("top_p_bounded", {"p": 0.8, "min_k": 3, "max_k": 9}),
    ],
)
@pytest.mark.parametrize("group", [1, 4])
def test_prune_policies_match_the_oracle(rng, policy, params, group):
    lens = [30, 1, 0, 70]
    cand_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cand_indices = np.concatenate([np.sort(rng.choice(200, n, replace=False)) for n in lens]).astype(np.int32)
    scores = (rng.standard_normal(len(cand_indices) * group) * 3).astype(np.float32)
    p = prune(cand_indptr, cand_indices, scores, policy, params, group, 0.7)
    check_prune(p, cand_indptr, cand_indices, scores, policy, lambda _: params, group, 0.7)


def test_prune_per_row_parameters_and_set_params(rng):
    lens = [50, 40, 60]
    cand_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cand_indices = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    scores = (rng.standard_normal(len(cand_indices)) * 2).astype(np.float32)
    ps = np.array([0.5, 0.9, 0.99])
    p = prune(cand_indptr, cand_indices, scores, "top_p", {"p": ps}, 1, 1.0)
    check_prune(p, cand_indptr, cand_indices, scores, "top_p", lambda r: {"p": ps[r]}, 1, 1.0)
    ks = [3, 1, 7]
    p2 = prune(cand_indptr, cand_indices, scores, "top_k", [ks], 1, 1.0)
    check_prune(p2, cand_indptr, cand_indices, scores, "top_k", lambda r: {"k": ks[r]}, 1, 1.0)
    # New parameters, same plan: the next run uses them.
    p.set_params({"p": 0.3})
    p.run(scores)
    check_prune(p, cand_indptr, cand_indices, scores, "top_p", lambda r: {"p": 0.3}, 1, 1.0)


def test_prune_outputs_are_exported_in_place(rng):
    lens = [20, 20]
    cand_indptr = np.array([0, 20, 40], np.int32)
    cand_indices = np.concatenate([np.arange(20), np.arange(20)]).astype(np.int32)
    scores = rng.standard_normal(40).astype(np.float32)
    p = prune(cand_indptr, cand_indices, scores, "top_k", {"k": 3}, 1, 1.0)
    view = np.from_dlpack(p.sel_indices)
    assert view.ctypes.data == p.sel_indices.data_ptr
    assert p.sel_indices.shape == (40,) and p.sel_indices.dtype == "int32"
    assert p.sel_indices.device == "cpu"
    first = view[:6].copy()
    # A second run over other scores rewrites the same memory: the old view sees it.
    scores[:] = -scores
    p.run(scores)
    assert np.from_dlpack(p.sel_indices).ctypes.data == view.ctypes.data
    assert not np.array_equal(view[:6], first)
    check_prune(p, cand_indptr, cand_indices, scores, "top_k", lambda _: {"k": 3}, 1, 1.0)
    # The view keeps the plan's memory alive after the plan is gone.
    budgets = np.from_dlpack(p.budgets)
    del p
    assert list(budgets) == [3, 3]
    # Versioned and legacy capsules both come out.
    kept = dusk.PrunePlan("cpu")
    kept.plan(cand_indptr, cand_indices, policy="top_k", params={"k": 2})
    kept.run(scores)
    capsule = kept.sel_indptr.__dlpack__()
    assert "dltensor" in repr(capsule)
    assert kept.sel_indptr.__dlpack_device__() == (1, 0)


def test_prune_flags_rows_with_nan(rng):
    cand_indptr = np.array([0, 8, 16], np.int32)
    cand_indices = np.concatenate([np.arange(8), np.arange(8)]).astype(np.int32)
    scores = rng.standard_normal(16).astype(np.float32)
    scores[3] = np.nan
    p = prune(cand_indptr, cand_indices, scores, "top_p", {"p": 0.5}, 1, 1.0)
    assert list(np.from_dlpack(p.flags)) == [1, 0]
    # A flagged row keeps every candidate.
    assert np.from_dlpack(p.budgets)[0] == 8


def attention_case(rng, seq_lens, hkv, hq, head_dim, dtype=np.float16):
    indptr, ids, last, num_pages = ref.random_table(rng, seq_lens, PAGE)
    num_pages += 2
    k = rng.standard_normal((num_pages, PAGE, hkv, head_dim)).astype(dtype)
    v = rng.standard_normal((num_pages, PAGE, hkv, head_dim)).astype(dtype)
    q = rng.standard_normal((len(seq_lens), hq, head_dim)).astype(dtype)
    return indptr, ids, last, num_pages, q, k, v


def random_lists(rng, seq_lens, per_seq, budget):
    indptr, indices = [0], []
    for n in seq_lens:
        for _ in range(per_seq):
            m = int(rng.integers(0, min(n, budget) + 1))
            indices.extend(np.sort(rng.choice(n, m, replace=False)).tolist())
            indptr.append(len(indices))
    return np.array(indptr, np.int32), np.array(indices, np.int32)


@pytest.mark.parametrize("fused_merge", [False, True])
@pytest.mark.parametrize("hkv,hq", [(2, 8), (2, 2)])
def test_dense_attention_matches_numpy(rng, hkv, hq, fused_merge):
    seq_lens = [37, 80, 5]
    d = 64
    indptr, ids, last, num_pages, q, k, v = attention_case(rng, seq_lens, hkv, hq, d)
    a = dusk.AttentionPlan("cpu")
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages, fused_merge=fused_merge)
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    a.run(q, k, v, out, lse)
    rows = lambda b, h: np.arange(ref.seq_len(indptr, last, PAGE, b))  # noqa: E731
    want, want_lse = ref.attention(q, k, v, indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)
    np.testing.assert_allclose(lse, want_lse, atol=1e-2)
    # lse is optional.
    out2 = np.zeros_like(out)
    a.run(q, k, v, out2)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("mode", ["head", "group"])
def test_list_attention_matches_numpy(rng, mode):
    seq_lens = [50, 23]
    hkv, hq, d = 2, 4, 64
    group = hq // hkv
    indptr, ids, last, num_pages, q, k, v = attention_case(rng, seq_lens, hkv, hq, d)
    per_seq = hq if mode == "head" else hkv
    sel_indptr, sel_indices = random_lists(rng, seq_lens, per_seq, 40)
    a = dusk.AttentionPlan("cpu")
    a.plan(
        indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE,
        num_pages=num_pages, mode=mode, sel_indptr=sel_indptr, sel_indices=sel_indices,
    )
    out = np.zeros(q.shape, np.float16)
    lse = np.zeros(q.shape[:2], np.float32)
    a.run(q, k, v, out, lse)

    def rows(b, h):
        r = b * hq + h if mode == "head" else b * hkv + h // group
        return sel_indices[sel_indptr[r] : sel_indptr[r + 1]]

    want, want_lse = ref.attention(q, k, v, indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)
    np.testing.assert_allclose(lse, want_lse, atol=1e-2)


def test_device_lists_are_read_at_each_run(rng):
    # Lists bound with device_lists=True are the caller's memory: the kernels read what
    # they hold at each run (what the pruner writes on the GPU, step after step).
    seq_lens = [40, 40]
    hkv, hq, d = 2, 4, 64
    indptr, ids, last, num_pages, q, k, v = attention_case(rng, seq_lens, hkv, hq, d)
    rows = len(seq_lens) * hkv
    cap = 16
    sel_indptr = np.zeros(rows + 1, np.int32)
    sel_indices = np.zeros(rows * cap, np.int32)
    a = dusk.AttentionPlan("cpu")
    a.plan(
        indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE,
        num_pages=num_pages, mode="group", sel_indptr=sel_indptr, sel_indices=sel_indices,
        device_lists=True, max_tokens=cap,
    )
    out = np.zeros(q.shape, np.float16)
    for step in range(2):
        lists = [np.sort(rng.choice(40, cap - step * 5, replace=False)) for _ in range(rows)]
        sel_indptr[:] = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
        sel_indices[: sel_indptr[-1]] = np.concatenate(lists)
        a.run(q, k, v, out)
        want, _ = ref.attention(
            q, k, v, indptr, ids, last, PAGE,
            lambda b, h: lists[b * hkv + h // (hq // hkv)], d**-0.5,
        )
        np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)


def test_pipeline_spgemv_prune_attention(rng):
    # Twilight's step on the CPU: estimate, prune with top-p, attend over the kept tokens,
    # the pruner's exported lists bound to the attention plan without a copy.
    seq_lens = [64, 48]
    hkv, hq, d = 2, 8, 64
    group = hq // hkv
    c = spgemv_case(rng, seq_lens, hkv, hq, d)
    s, scores = run_spgemv(c)
    p = prune(c["cand_indptr"], c["cand_indices"], scores, "top_p", {"p": 0.9}, group, d**-0.5)
    v = rng.standard_normal(c["k"].shape).astype(np.float16)
    a = dusk.AttentionPlan("cpu")
    a.plan(
        c["indptr"], c["ids"], c["last"], num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
        page_size=PAGE, num_pages=c["num_pages"], mode="group", sel_indptr=p.sel_indptr,
        sel_indices=p.sel_indices, device_lists=True, max_tokens=max(seq_lens),
    )
    out = np.zeros(c["q"].shape, np.float16)
    a.run(c["q"], c["k"], v, out)
    sp, si = np.from_dlpack(p.sel_indptr), np.from_dlpack(p.sel_indices)
    want, _ = ref.attention(
        c["q"], c["k"], v, c["indptr"], c["ids"], c["last"], PAGE,
        lambda b, h: si[sp[b * hkv + h // group] : sp[b * hkv + h // group + 1]], d**-0.5,
    )
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)


def vllm_reference(block_table, seq_lens, page_size, num_pages):
    indptr, pages, last = [0], [], []
    max_pages = block_table.shape[1]
    for b, n in enumerate(seq_lens):
        n = max(int(n), 0)
        whole = (n + page_size - 1) // page_size
        m = min(whole, max_pages)
        pages.extend(np.clip(block_table[b, :m], 0, num_pages - 1).tolist())
        indptr.append(len(pages))
        last.append(0 if m == 0 else (n - (m - 1) * page_size if m == whole else page_size))
    return np.array(indptr), np.array(pages), np.array(last)


def test_vllm_block_table_to_csr(rng):
    batch, max_blocks, page_size, num_pages = 5, 12, 16, 300
    # vLLM keeps a persistent table for its largest batch; a step uses its first rows.
    persistent = rng.integers(0, num_pages, (8, max_blocks + 4)).astype(np.int32)
    block_table = persistent[:batch, :max_blocks]  # rows spaced apart: a strided view
    seq_lens = np.array([0, 16, 17, 191, max_blocks * 16 + 30], np.int32)
    kv_indptr = np.full(batch + 1, -1, np.int32)
    kv_page_indices = np.full(batch * max_blocks, -1, np.int32)
    kv_last_page_len = np.full(batch, -1, np.int32)
    dusk.vllm_to_csr(
        block_table, seq_lens, kv_indptr, kv_page_indices, kv_last_page_len,
        page_size=page_size, num_pages=num_pages,
    )
    ip, pages, last = vllm_reference(block_table, seq_lens, page_size, num_pages)
    np.testing.assert_array_equal(kv_indptr, ip)
    np.testing.assert_array_equal(kv_page_indices[: ip[-1]], pages)
    assert (kv_page_indices[ip[-1] :] == -1).all()
    np.testing.assert_array_equal(kv_last_page_len, last)


@pytest.mark.parametrize("page_size", [1, 16])
def test_sglang_req_to_token_to_csr(rng, page_size):
    pool_rows, max_context, num_pages = 6, 64, 500
    # Each pool row's tokens in pages of `page_size` consecutive slots.
    req_to_token = np.zeros((pool_rows, max_context), np.int32)
    for r in range(pool_rows):
        for j in range(max_context // page_size):
            page = rng.integers(0, num_pages)
            req_to_token[r, j * page_size : (j + 1) * page_size] = page * page_size + np.arange(page_size)
    req_pool_indices = np.array([3, 0, 5, 9], np.int32)  # 9: outside the pool
    seq_lens = np.array([40, 1, 64, 10], np.int32)
    batch = len(seq_lens)
    max_pages = max_context // page_size
    kv_indptr = np.zeros(batch + 1, np.int32)
    kv_page_indices = np.zeros(batch * max_pages, np.int32)
    kv_last_page_len = np.zeros(batch, np.int32)
    dusk.sglang_to_csr(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_page_indices,
        kv_last_page_len, page_size=page_size, num_pages=num_pages,
    )
    ip, pages, last = [0], [], []
    for b in range(batch):
        r = req_pool_indices[b]
        n = seq_lens[b] if 0 <= r < pool_rows else 0
        m = (n + page_size - 1) // page_size
        pages.extend((req_to_token[r, : m * page_size : page_size] // page_size).tolist() if m else [])
        ip.append(len(pages))
        last.append(0 if m == 0 else n - (m - 1) * page_size)
    np.testing.assert_array_equal(kv_indptr, ip)
    np.testing.assert_array_equal(kv_page_indices[: ip[-1]], pages)
    np.testing.assert_array_equal(kv_last_page_len, last)


def test_converted_table_drives_attention(rng):
    # vLLM's table -> CSR (on the device) -> an attention plan -> the same output as the
    # table given directly.
    seq_lens = np.array([20, 33], np.int32)
    hkv, hq, d, num_pages = 2, 4, 64, 12
    block_table = np.array([[3, 7, 0], [1, 11, 5]], np.int32)
    kv_indptr = np.zeros(3, np.int32)
    kv_page_indices = np.zeros(6, np.int32)
    kv_last_page_len = np.zeros(2, np.int32)
    dusk.vllm_to_csr(block_table, seq_lens, kv_indptr, kv_page_indices, kv_last_page_len, page_size=PAGE, num_pages=num_pages)
    q = rng.standard_normal((2, hq, d)).astype(np.float16)
    k = rng.standard_normal((num_pages, PAGE, hkv, d)).astype(np.float16)
    v = rng.standard_normal((num_pages, PAGE, hkv, d)).astype(np.float16)
    a = dusk.AttentionPlan("cpu")
    a.plan(kv_indptr, kv_page_indices[: kv_indptr[-1]], kv_last_page_len, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    out = np.zeros(q.shape, np.float16)
    a.run(q, k, v, out)
    want, _ = ref.attention(
        q, k, v, np.array([0, 2, 5]), np.array([3, 7, 1, 11, 5]), np.array([4, 1]), PAGE,
        lambda b, h: np.arange(seq_lens[b]), d**-0.5,
    )
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)


def test_device_page_table_is_read_at_each_run(rng):
    # device_table=True: the plan borrows kv_indptr / kv_page_indices / kv_last_page_len
    # and each run reads them as they are then. Step by step, vLLM's table is converted
    # into them (on the device, as a captured decode step would) and attention follows,
    # with no new plan: equal to the reference on each step's table.
    hkv, hq, d, num_pages, batch, max_pages = 2, 4, 64, 16, 2, 4
    k = rng.standard_normal((num_pages, PAGE, hkv, d)).astype(np.float16)
    v = rng.standard_normal((num_pages, PAGE, hkv, d)).astype(np.float16)
    kv_indptr = np.zeros(batch + 1, np.int32)
    kv_page_indices = np.zeros(batch * max_pages, np.int32)
    kv_last_page_len = np.zeros(batch, np.int32)
    a = dusk.AttentionPlan("cpu")
    a.plan(
        kv_indptr, kv_page_indices, kv_last_page_len, num_qo_heads=hq, num_kv_heads=hkv,
        head_dim=d, page_size=PAGE, num_pages=num_pages, device_table=True,
        max_tokens=max_pages * PAGE,
    )
    out = np.full((batch, hq, d), np.nan, np.float16)
    for seq_lens in ([20, 33], [64, 1], [0, 50]):
        block_table = np.stack([rng.permutation(num_pages)[:max_pages] for _ in range(batch)]).astype(np.int32)
        lens = np.array(seq_lens, np.int32)
        dusk.vllm_to_csr(block_table, lens, kv_indptr, kv_page_indices, kv_last_page_len, page_size=PAGE, num_pages=num_pages)
        q = rng.standard_normal((batch, hq, d)).astype(np.float16)
        a.run(q, k, v, out)
        want, _ = ref.attention(
            q, k, v, kv_indptr, kv_page_indices, kv_last_page_len, PAGE,
            lambda b, h: np.arange(seq_lens[b]), d**-0.5,
        )
        np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)
    # A table no converter wrote (offsets outside the table, page ids outside the cache,
    # last pages of no or too many tokens): a wrong answer, never an access outside the
    # buffers (the interpreter would raise DeviceError).
    kv_indptr[:] = [5, -3, 1 << 30]
    kv_page_indices[:] = [-1, num_pages, 1 << 30, 3, 2, 1, 0, -(1 << 30)]
    kv_last_page_len[:] = [0, 1000]
    a.run(q, k, v, out)
    kv_indptr[:] = [0, 3, 8]
    a.run(q, k, v, out)


def test_device_page_table_arguments_are_checked():
    t = (np.zeros(3, np.int32), np.zeros(8, np.int32), np.zeros(2, np.int32))
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=PAGE, num_pages=8, device_table=True)
    a = dusk.AttentionPlan("cpu")
    with pytest.raises(dusk.InvalidArgument) as e:
        a.plan(*t, **kw)
    assert e.value.arg == "max_tokens"
    with pytest.raises(dusk.InvalidArgument) as e:
        a.plan(np.zeros(3, np.int64), *t[1:], max_tokens=64, **kw)
    assert e.value.arg == "kv_indptr"
    with pytest.raises(dusk.InvalidArgument) as e:
        a.plan(*t, max_tokens=64, mode="group", sel_indptr=[0, 0, 0, 0, 0], sel_indices=[0], **kw)
    assert e.value.arg == "sel_indptr"
    with pytest.raises(dusk.InvalidArgument) as e:
        a.plan(t[0], t[1], np.zeros(3, np.int32), max_tokens=64, **kw)
    assert e.value.arg == "kv_last_page_len"


def test_prune_run_into_writes_the_attention_plans_lists(rng):
    # The pruner writes its kept lists straight into the tensors an attention plan reads
    # (device_lists=True): no copy between them, and the output equals attention over the
    # lists the plan's own outputs hold after run.
    seq_lens = [40, 25]
    hkv, hq, d = 2, 4, 64
    indptr, ids, last, num_pages, q, k, v = attention_case(rng, seq_lens, hkv, hq, d)
    cand_indptr = np.array([0, 40, 80, 105, 130], np.int32)
    cand_indices = np.concatenate([np.arange(n) for n in seq_lens for _ in range(hkv)]).astype(np.int32)
    scores = (rng.standard_normal(len(cand_indices)) * 3).astype(np.float32)
    p = dusk.PrunePlan("cpu")
    p.plan(cand_indptr, cand_indices, policy="top_p", params={"p": 0.9})
    sel_indptr = np.full(5, -1, np.int32)
    sel_indices = np.full(len(cand_indices), -1, np.int32)
    a = dusk.AttentionPlan("cpu")
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages,
           mode="group", sel_indptr=sel_indptr, sel_indices=sel_indices, device_lists=True, max_tokens=40)
    p.run_into(scores, sel_indptr, sel_indices)
    p.run(scores)
    want_ip = np.from_dlpack(p.sel_indptr)
    np.testing.assert_array_equal(sel_indptr, want_ip)
    np.testing.assert_array_equal(sel_indices[: want_ip[-1]], np.from_dlpack(p.sel_indices)[: want_ip[-1]])
    out = np.zeros(q.shape, np.float16)
    a.run(q, k, v, out)
    group = hq // hkv
    rows = lambda b, h: sel_indices[sel_indptr[b * hkv + h // group] : sel_indptr[b * hkv + h // group + 1]]  # noqa: E731
    want, _ = ref.attention(q, k, v, indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)
    with pytest.raises(dusk.InvalidArgument) as e:
        p.run_into(scores, sel_indptr[:4], sel_indices)
    assert e.value.arg == "sel_indptr"
    with pytest.raises(dusk.InvalidArgument) as e:
        p.run_into(scores, sel_indptr, sel_indices[:10])
    assert e.value.arg == "sel_indices"
    with pytest.raises(dusk.InvalidArgument) as e:
        p.run_into(scores, sel_indptr, sel_indptr)
    assert e.value.arg in ("sel_indptr", "sel_indices")


def test_bundle_and_kernels_report():
    info = dusk.bundle_info()
    assert info["arch"] == "sm_90a"
    assert any(n.startswith("attn_split_dense") for n in info["kernels"])
    kernels = dusk.loaded_kernels("cpu")
    assert kernels and all(src == "interpreter" for _, src in kernels)
