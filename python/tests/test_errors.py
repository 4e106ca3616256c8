"""Bad input raises dusk.InvalidArgument (a ValueError) naming the argument, before
anything runs: shapes, dtypes, devices, contiguity, index ranges, parameter values, outputs
that share memory or cannot be written."""

import numpy as np
import pytest

import dusk
import reference as ref

PAGE = 16


def raises_arg(arg, fn, *args, **kwargs):
    with pytest.raises(dusk.InvalidArgument) as e:
        fn(*args, **kwargs)
    assert e.value.arg == arg, (e.value.arg, str(e.value))
    assert isinstance(e.value, ValueError) and isinstance(e.value, dusk.DuskError)
    assert f"`{arg}`" in str(e.value)
    return e.value


class FakeCuda:
    """A tensor in (made-up) CUDA memory: `__cuda_array_interface__` only."""

    def __init__(self, shape, typestr="<f2"):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (0x7F0000000000, False),
            "strides": None, "version": 3,
        }


def quantize_args(shape=(2, PAGE, 2, 64), bits=4):
    k = np.ones(shape, np.float16)
    pshape, sshape = dusk.quantized_k_shapes(shape, bits)
    return k, np.zeros(pshape, np.uint8), np.zeros(sshape, np.float16), np.zeros(sshape, np.float16)


def test_quantize_k_checks_every_tensor():
    k, packed, scale, zero = quantize_args()
    raises_arg("k", dusk.quantize_k, [1.0, 2.0], packed, scale, zero)  # not a tensor
    raises_arg("k", dusk.quantize_k, k.astype(np.float32), packed, scale, zero)  # dtype
    raises_arg("k", dusk.quantize_k, k[:, :, :, ::2], packed, scale, zero)  # layout / shape
    raises_arg("packed", dusk.quantize_k, k, packed[..., :5], scale, zero)  # bits
    raises_arg("scale", dusk.quantize_k, k, packed, scale[:1], zero)  # shape
    raises_arg("zero", dusk.quantize_k, k, packed, scale, zero.astype(np.float32))
    raises_arg("head_dim", dusk.quantize_k, *quantize_args((1, PAGE, 1, 96)))
    raises_arg("page_size", dusk.quantize_k, *quantize_args((1, 12, 1, 64)))
    # A non-contiguous tensor of the right shape.
    wide = np.ones((2, PAGE, 2, 128), np.float16)
    e = raises_arg("k", dusk.quantize_k, wide[..., ::2], packed, scale, zero)
    assert "C-contiguous" in str(e)
    # A tensor on another device than the others.
    raises_arg("packed", dusk.quantize_k, k, FakeCuda(packed.shape, "|u1"), scale, zero)


def test_outputs_must_be_writable_and_their_own():
    k, packed, scale, zero = quantize_args()
    raises_arg("scale", dusk.quantize_k, k, packed, scale, scale)  # two outputs, one array
    ro = np.zeros_like(scale)
    ro.flags.writeable = False
    raises_arg("scale", dusk.quantize_k, k, packed, ro, zero)
    # Nothing was written by the failed calls.
    assert not packed.any() and not scale.any() and not zero.any()


def small_table():
    rng = np.random.default_rng(0)
    indptr, ids, last, num_pages = ref.random_table(rng, [20, 9], PAGE)
    return indptr, ids, last, num_pages


def spgemv_plan():
    indptr, ids, last, num_pages = small_table()
    cand_indptr = np.array([0, 20, 40, 49, 58], np.int32)
    cand_indices = np.concatenate([np.arange(20), np.arange(20), np.arange(9), np.arange(9)]).astype(np.int32)
    s = dusk.SpgemvPlan("cpu")
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, num_pages=num_pages)
    return s, (indptr, ids, last, cand_indptr, cand_indices), kw


def test_plans_check_metadata_ranges():
    s, (indptr, ids, last, ci, cx), kw = spgemv_plan()
    bad_ids = ids.copy()
    bad_ids[0] = kw["num_pages"]
    raises_arg("kv_page_indices", s.plan, indptr, bad_ids, last, ci, cx, **kw)
    bad_last = last.copy()
    bad_last[0] = PAGE + 1
    raises_arg("kv_last_page_len", s.plan, indptr, ids, bad_last, ci, cx, **kw)
    bad_cx = cx.copy()
    bad_cx[-1] = 9  # position 9 of a 9-token sequence
    raises_arg("cand_indices", s.plan, indptr, ids, last, ci, bad_cx, **kw)
    raises_arg("kv_indptr", s.plan, indptr.astype(np.int64), ids, last, ci, cx, **kw)
    raises_arg("kv_indptr", s.plan, [0, 2**40], ids, last, ci, cx, **kw)
    raises_arg("num_qo_heads", s.plan, indptr, ids, last, ci, cx, **{**kw, "num_qo_heads": 3})
    raises_arg("bits", s.plan, indptr, ids, last, ci, cx, bits=3, **kw)
    raises_arg("device", dusk.SpgemvPlan, "tpu")


def test_spgemv_run_checks_before_launching():
    s, meta, kw = spgemv_plan()
    with pytest.raises(dusk.DuskError, match="plan"):
        s.run(None, None, None, None, None)
    s.plan(*meta, **kw)
    shape = (kw["num_pages"], PAGE, 2, 64)
    k, packed, scale, zero = quantize_args(shape)
    q = np.ones((2, 4, 64), np.float16)
    scores = np.full(s.num_scores, 7.0, np.float32)
    raises_arg("q", s.run, q[:1], packed, scale, zero, scores)
    raises_arg("scores", s.run, q, packed, scale, zero, scores[:-1])
    raises_arg("scores", s.run, q, packed, scale, zero, scores.astype(np.float64))
    raises_arg("packed", s.run, q, packed[:1], scale, zero, scores)
    raises_arg("q", s.run, FakeCuda(q.shape), packed, scale, zero, scores)
    assert (scores == 7.0).all()  # nothing ran
    s.run(q, packed, scale, zero, scores)
    assert not (scores == 7.0).all()


def prune_meta():
    cand_indptr = np.array([0, 10, 20], np.int32)
    cand_indices = np.concatenate([np.arange(10), np.arange(10)]).astype(np.int32)
    return cand_indptr, cand_indices


def test_prune_checks_policies_and_parameters():
    ci, cx = prune_meta()
    p = dusk.PrunePlan("cpu")
    raises_arg("policy", p.plan, ci, cx, policy="top_q", params={"p": 0.9})
    raises_arg("params", p.plan, ci, cx, policy="top_p", params={"p": 1.5})
    raises_arg("params", p.plan, ci, cx, policy="top_p", params={"p": 0.0})
    raises_arg("params", p.plan, ci, cx, policy="top_p", params={"q": 0.9})
    raises_arg("params", p.plan, ci, cx, policy="top_p")
    raises_arg("params", p.plan, ci, cx, policy="top_k", params={"k": 2.5})
    raises_arg("params", p.plan, ci, cx, policy="top_k", params={"k": 0})
    raises_arg("params", p.plan, ci, cx, policy="top_p", params={"p": [0.9, 0.9, 0.9]})
    raises_arg("params", p.plan, ci, cx, policy="top_p_bounded", params=[0.9, 1])
    raises_arg("sm_scale", p.plan, ci, cx, params={"p": 0.9}, sm_scale=float("nan"))
    raises_arg("group", p.plan, ci, cx, params={"p": 0.9}, group=0)
    raises_arg("cand_indices", p.plan, ci, cx[::-1].copy(), params={"p": 0.9})
    p.plan(ci, cx, policy="top_p", params={"p": 0.9})
    raises_arg("params", p.set_params, {"p": 2.0})
    raises_arg("scores", p.run, np.zeros(5, np.float32))
    raises_arg("scores", p.run, np.zeros((4, 5), np.float32))


def test_attention_checks_modes_lists_and_outputs():
    indptr, ids, last, num_pages = small_table()
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=PAGE, num_pages=num_pages)
    a = dusk.AttentionPlan("cpu")
    raises_arg("mode", a.plan, indptr, ids, last, mode="sparse", **kw)
    raises_arg("sel_indptr", a.plan, indptr, ids, last, mode="group", **kw)
    lists = (np.array([0, 3, 6, 8, 9], np.int32), np.array([0, 1, 19, 2, 3, 4, 0, 8, 5], np.int32))
    raises_arg("max_tokens", a.plan, indptr, ids, last, mode="group", sel_indptr=lists[0], sel_indices=lists[1], device_lists=True, **kw)
    bad = lists[1].copy()
    bad[-1] = 9  # past the 9-token sequence
    raises_arg("sel_indices", a.plan, indptr, ids, last, mode="group", sel_indptr=lists[0], sel_indices=bad, **kw)
    raises_arg("dtype", a.plan, indptr, ids, last, dtype="float32", **kw)
    a.plan(indptr, ids, last, **kw)
    q = np.ones((2, 4, 64), np.float16)
    k = np.ones((num_pages, PAGE, 2, 64), np.float16)
    out = np.full_like(q, 3)
    raises_arg("out", a.run, q, k, k, q)  # out is q
    raises_arg("k_cache", a.run, q, k[:-1], k, out)
    raises_arg("v_cache", a.run, q, k, k.astype(np.float32), out)
    raises_arg("lse", a.run, q, k, k, out, np.zeros((2, 3), np.float32))
    e = raises_arg("q", a.run, q.reshape((1,) * 7 + q.shape), k, k, out)  # rank 10
    assert "at most 8 dimensions" in str(e)
    assert (out == 3).all()
    a.run(q, k, k, out)
    np.testing.assert_allclose(out.astype(np.float32), 1.0, atol=1e-3)


def test_converters_check_tables():
    bt = np.zeros((4, 8), np.int32)
    outs = (np.zeros(4, np.int32), np.zeros(24, np.int32), np.zeros(3, np.int32))
    lens = np.array([1, 2, 3], np.int32)
    raises_arg("seq_lens", dusk.vllm_to_csr, bt, lens.astype(np.int64), *outs, page_size=16, num_pages=10)
    raises_arg("block_table", dusk.vllm_to_csr, bt.astype(np.int64), lens, *outs, page_size=16, num_pages=10)
    raises_arg("block_table", dusk.vllm_to_csr, bt.T, lens, *outs, page_size=16, num_pages=10)
    raises_arg("kv_page_indices", dusk.vllm_to_csr, bt, lens, outs[0], outs[1][:10], outs[2], page_size=16, num_pages=10)
    raises_arg("kv_indptr", dusk.vllm_to_csr, bt, lens, outs[1][:4], outs[1], outs[2], page_size=16, num_pages=10)
    raises_arg("page_size", dusk.vllm_to_csr, bt, lens, *outs, page_size=12, num_pages=10)
    raises_arg("req_pool_indices", dusk.sglang_to_csr, bt, lens[:2], lens, *outs, num_pages=10)


def test_devices():
    raises_arg("device", dusk.AttentionPlan, "cuda:x")
    try:
        dusk.AttentionPlan("cuda")
    except dusk.DeviceError as e:
        assert "GPU" in str(e)  # no GPU here: a clear error, not a crash
