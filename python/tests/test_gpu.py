"""The package on a CUDA GPU with PyTorch: the kernels from the built-in bundle (no LLVM),
torch tensors in and out without copies, the caller's current stream, CUDA graph capture
and replay, and the host time of a run. Skipped where torch or a GPU is missing (CI)."""

import time

import numpy as np
import pytest

import dusk
import reference as ref

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

DEV = "cuda"
PAGE = 16


@pytest.fixture
def gen():
    return torch.Generator(device="cpu").manual_seed(7)


def table(seq_lens, spare=3):
    rng = np.random.default_rng(3)
    indptr, ids, last, num_pages = ref.random_table(rng, seq_lens, PAGE)
    return indptr, ids, last, num_pages + spare


def test_kernels_come_from_the_bundle():
    assert not dusk.JIT
    a = dusk.AttentionPlan(DEV)
    indptr, ids, last, num_pages = table([300] * 4)
    a.plan(indptr, ids, last, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=PAGE, num_pages=num_pages)
    kernels = dict(dusk.loaded_kernels(DEV))
    assert kernels and set(kernels.values()) == {"bundle"}, kernels


def test_pointers_are_the_callers():
    x = torch.zeros(1000, dtype=torch.float16, device=DEV)
    assert dusk.data_ptr(x) == x.data_ptr()
    assert dusk.data_ptr(x[10:]) == x[10:].data_ptr()


def test_quantize_and_spgemv_on_the_gpu(gen):
    seq_lens = [200, 77]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages = table(seq_lens)
    k = torch.randn((num_pages, PAGE, hkv, d), generator=gen).half()
    kg = k.to(DEV)
    pshape, sshape = dusk.quantized_k_shapes(k.shape)
    packed = torch.empty(pshape, dtype=torch.uint8, device=DEV)
    scale = torch.empty(sshape, dtype=torch.float16, device=DEV)
    zero = torch.empty(sshape, dtype=torch.float16, device=DEV)
    dusk.quantize_k(kg, packed, scale, zero)
    want_p, want_s, want_z = ref.quantize(k.numpy(), 4)
    np.testing.assert_array_equal(scale.cpu().numpy(), want_s)
    np.testing.assert_array_equal(zero.cpu().numpy(), want_z)
    for hq in (8, 2):  # tensor cores (group 4) and dp2a (MHA)
        cand_indptr, cand_indices = [0], []
        for n in seq_lens:
            for _ in range(hkv):
                cand_indices.extend(range(n))
                cand_indptr.append(len(cand_indices))
        s = dusk.SpgemvPlan(DEV)
        s.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages)
        q = torch.randn((len(seq_lens), hq, d), generator=gen).half()
        scores = torch.full((s.num_scores,), float("nan"), device=DEV)
        s.run(q.to(DEV), packed, scale, zero, scores)
        kd = ref.dequantize(packed.cpu().numpy(), scale.cpu().numpy(), zero.cpu().numpy(), 4)
        want = ref.spgemv(q.numpy(), kd, indptr, ids, PAGE, np.array(cand_indptr), np.array(cand_indices), hkv)
        got = scores.cpu().numpy()
        assert np.abs(got - want).max() / np.abs(want).max() < 2e-3


def test_prune_on_the_gpu_exports_torch_views(gen):
    lens = [300, 1, 0, 2000]
    cand_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cand_indices = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    scores = (torch.randn(len(cand_indices), generator=gen) * 3).to(DEV)
    p = dusk.PrunePlan(DEV)
    p.plan(cand_indptr, cand_indices, policy="top_p", params={"p": 0.9}, group=1, sm_scale=1.0)
    p.run(scores)
    sel = torch.from_dlpack(p.sel_indices)
    assert sel.is_cuda and sel.data_ptr() == p.sel_indices.data_ptr
    sp = torch.from_dlpack(p.sel_indptr).cpu().numpy()
    si = sel.cpu().numpy()
    sc = scores.cpu().numpy()
    for r in range(len(lens)):
        s, e = cand_indptr[r], cand_indptr[r + 1]
        ref.check_pruned(si[sp[r] : sp[r + 1]], cand_indices[s:e], [ref.softmax(sc[s:e])], "top_p", [{"p": 0.9}])


def attention_inputs(gen, seq_lens, hkv, hq, d):
    indptr, ids, last, num_pages = table(seq_lens)
    k = torch.randn((num_pages, PAGE, hkv, d), generator=gen).half()
    v = torch.randn((num_pages, PAGE, hkv, d), generator=gen).half()
    q = torch.randn((len(seq_lens), hq, d), generator=gen).half()
    return indptr, ids, last, num_pages, q, k, v


@pytest.mark.parametrize("graph_launch", [True, False])
def test_attention_dense_and_group_on_the_gpu(gen, graph_launch):
    seq_lens = [500, 37, 1000]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kg, vg = k.to(DEV), v.to(DEV)
    a = dusk.AttentionPlan(DEV)
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages,
           graph_launch=graph_launch)
    out = torch.full_like(q, float("nan"), device=DEV)
    lse = torch.full(q.shape[:2], float("nan"), device=DEV)
    a.run(q.to(DEV), kg, vg, out, lse)
    rows = lambda b, h: np.arange(ref.seq_len(indptr, last, PAGE, b))  # noqa: E731
    want, want_lse = ref.attention(q.numpy(), k.numpy(), v.numpy(), indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.cpu().double().numpy(), want, atol=2e-2)
    np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=1e-2)

    rng = np.random.default_rng(5)
    sel_indptr, sel_indices = [0], []
    for n in seq_lens:
        for _ in range(hkv):
            m = int(rng.integers(1, min(n, 256) + 1))
            sel_indices.extend(np.sort(rng.choice(n, m, replace=False)).tolist())
            sel_indptr.append(len(sel_indices))
    g = dusk.AttentionPlan(DEV)
    g.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages, mode="group", sel_indptr=sel_indptr, sel_indices=sel_indices, graph_launch=graph_launch)
    out.fill_(float("nan"))
    g.run(q.to(DEV), kg, vg, out, lse)
    group = hq // hkv
    rows = lambda b, h: sel_indices[sel_indptr[b * hkv + h // group] : sel_indptr[b * hkv + h // group + 1]]  # noqa: E731
    want, _ = ref.attention(q.numpy(), k.numpy(), v.numpy(), indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.cpu().double().numpy(), want, atol=2e-2)


def queued_dense_run(gen):
    """A dense run queued behind a long kernel on torch's stream: the plan, the shapes to
    plan others alike on pages shifted by `shift`, and the check of the run's output."""
    seq_lens = [900, 300, 1200]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kg, vg, qg = k.to(DEV), v.to(DEV), q.to(DEV)
    kwargs = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    a = dusk.AttentionPlan(DEV)
    a.plan(indptr, ids, last, **kwargs)
    out = torch.full_like(qg, float("nan"))
    torch.cuda._sleep(200_000_000)  # about 0.1 s of the GPU's clock
    a.run(qg, kg, vg, out)

    def plan_shifted(plan, shift):  # the same shapes, other pages: wrong output if read in their place
        plan.plan(indptr, np.roll(ids, shift).tolist(), last, **kwargs)

    def check():
        torch.cuda.synchronize()
        rows = lambda b, h: np.arange(ref.seq_len(indptr, last, PAGE, b))  # noqa: E731
        want, _ = ref.attention(q.numpy(), k.numpy(), v.numpy(), indptr, ids, last, PAGE, rows, d**-0.5)
        np.testing.assert_allclose(out.cpu().double().numpy(), want, atol=2e-2)

    return a, plan_shifted, check


def test_planning_again_leaves_the_runs_still_queued_right(gen):
    # A plan per step, as FlashInfer's wrappers are used: the run is still queued behind
    # a long kernel on torch's stream when the plan is made again (twice: the second new
    # plan's uploads may land in the memory the first one's replacement freed). The
    # replaced plan's buffers must outlive its queued run.
    a, plan_shifted, check = queued_dense_run(gen)
    for shift in (1, 2):
        plan_shifted(a, shift)
    check()


def test_dropping_a_plan_leaves_its_queued_run_right(gen):
    # A plan dropped right after its run, the run still queued behind a long kernel on
    # torch's stream, then new plans of the same shapes on other pages (their uploads may
    # land in the memory the dropped plan freed): the run must have read its own metadata.
    import gc

    a, plan_shifted, check = queued_dense_run(gen)
    del a
    gc.collect()
    others = [dusk.AttentionPlan(DEV) for _ in range(2)]
    for shift, b in zip((1, 2), others):
        plan_shifted(b, shift)
    check()


def test_graph_launches_take_each_runs_tensors(gen):
    # An eager run submits the split and the merge as one graph launch, recorded at the
    # first run; later runs with other tensors patch the graph's arguments. Each run equals
    # the same run launched kernel by kernel, also after a captured run (launched as it is)
    # and for the SpGEMV (its two kernels, with graph_launch=True).
    seq_lens = [700, 33, 1500]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    graph, direct = dusk.AttentionPlan(DEV), dusk.AttentionPlan(DEV)
    graph.plan(indptr, ids, last, **kw)
    direct.plan(indptr, ids, last, graph_launch=False, **kw)
    caches = [(k.to(DEV), v.to(DEV)), (torch.randn(k.shape, generator=gen).half().to(DEV),
                                       torch.randn(v.shape, generator=gen).half().to(DEV))]

    def inputs():
        qi = torch.randn(q.shape, generator=gen).half().to(DEV)
        outs = [torch.full_like(qi, float("nan")) for _ in range(2)]
        lses = [torch.full(q.shape[:2], float("nan"), device=DEV) for _ in range(2)]
        return qi, outs, lses

    def both(i, qi, outs, lses):
        kc, vc = caches[i % 2]
        graph.run(qi, kc, vc, outs[0], lses[0])
        direct.run(qi, kc, vc, outs[1], lses[1])

    for i in range(5):
        qi, outs, lses = inputs()
        both(i, qi, outs, lses)
        torch.cuda.synchronize()
        assert not outs[0].isnan().any()
        assert torch.equal(outs[0], outs[1]) and torch.equal(lses[0], lses[1]), i
    qi, outs, lses = inputs()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        both(0, qi, outs, lses)
    g.replay()
    torch.cuda.synchronize()
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1]) and torch.equal(lses[0], lses[1])
    qi, outs, lses = inputs()
    both(1, qi, outs, lses)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]) and torch.equal(lses[0], lses[1])

    pshape, sshape = dusk.quantized_k_shapes(k.shape)
    packed = torch.empty(pshape, dtype=torch.uint8, device=DEV)
    scale = torch.empty(sshape, dtype=torch.float16, device=DEV)
    zero = torch.empty(sshape, dtype=torch.float16, device=DEV)
    dusk.quantize_k(caches[0][0], packed, scale, zero)
    cand_indptr = np.arange(len(seq_lens) * hkv + 1, dtype=np.int32) * 30
    cand_indices = np.tile(np.arange(30, dtype=np.int32), len(seq_lens) * hkv)
    sg, sd = dusk.SpgemvPlan(DEV), dusk.SpgemvPlan(DEV)
    sg.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages, graph_launch=True)
    sd.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages)
    for _ in range(3):
        qi = torch.randn(q.shape, generator=gen).half().to(DEV)
        scores = [torch.full((sg.num_scores,), float("nan"), device=DEV) for _ in range(2)]
        sg.run(qi, packed, scale, zero, scores[0])
        sd.run(qi, packed, scale, zero, scores[1])
        torch.cuda.synchronize()
        assert not scores[0].isnan().any() and torch.equal(scores[0], scores[1])


def test_converters_on_the_gpu():
    rng = np.random.default_rng(2)
    block_table = rng.integers(0, 400, (6, 40)).astype(np.int32)
    seq_lens = np.array([0, 16, 17, 300, 639, 5], np.int32)
    outs = [torch.full((n,), -1, dtype=torch.int32, device=DEV) for n in (7, 6 * 40, 6)]
    dusk.vllm_to_csr(torch.from_numpy(block_table).to(DEV), torch.from_numpy(seq_lens).to(DEV), *outs, page_size=PAGE, num_pages=400)
    ip = [0]
    pages = []
    for b, n in enumerate(seq_lens):
        m = (n + PAGE - 1) // PAGE
        pages.extend(block_table[b, :m].tolist())
        ip.append(len(pages))
    assert outs[0].tolist() == ip
    assert outs[1][: ip[-1]].tolist() == pages
    req_to_token = torch.arange(4 * 64, dtype=torch.int32, device=DEV).reshape(4, 64)
    dusk.sglang_to_csr(req_to_token, torch.tensor([2, 0], dtype=torch.int32, device=DEV), torch.tensor([5, 64], dtype=torch.int32, device=DEV), outs[0][:3], outs[1][:128], outs[2][:2], num_pages=256)
    assert outs[0][:3].tolist() == [0, 5, 69]
    assert outs[1][:5].tolist() == [128, 129, 130, 131, 132]


def test_runs_go_on_the_current_stream(gen):
    # q is produced by a slow kernel on a side stream; dusk, called under that stream,
    # must read it after the kernel (same stream, no sync in between).
    seq_lens = [2000] * 8
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kg, vg = k.to(DEV), v.to(DEV)
    a = dusk.AttentionPlan(DEV)
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    qg = torch.zeros_like(q, device=DEV)
    out = torch.zeros_like(qg)
    qd = q.to(DEV)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # keeps the stream busy for tens of ms
        qg.copy_(qd)
        a.run(qg, kg, vg, out)
    side.synchronize()
    rows = lambda b, h: np.arange(ref.seq_len(indptr, last, PAGE, b))  # noqa: E731
    want, _ = ref.attention(q.numpy(), k.numpy(), v.numpy(), indptr, ids, last, PAGE, rows, d**-0.5)
    np.testing.assert_allclose(out.cpu().double().numpy(), want, atol=2e-2)


def test_a_captured_step_replays_like_eager_runs(gen):
    # A decode step of the bundle's shapes (GQA 8/2, head_dim 128): the SpGEMV, a top-p
    # search (the bundle's is for one query head a row: the same scores as rows per query
    # head) and group attention over lists the step reads from device tensors, captured once
    # in a CUDA graph and replayed with new q and new lists: equal to eager runs.
    seq_lens = [700, 300, 1200, 64]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kg, vg = k.to(DEV), v.to(DEV)
    pshape, sshape = dusk.quantized_k_shapes(k.shape)
    packed = torch.empty(pshape, dtype=torch.uint8, device=DEV)
    scale = torch.empty(sshape, dtype=torch.float16, device=DEV)
    zero = torch.empty(sshape, dtype=torch.float16, device=DEV)
    dusk.quantize_k(kg, packed, scale, zero)
    cand_indptr, cand_indices = [0], []
    for n in seq_lens:
        for _ in range(hkv):
            cand_indices.extend(range(n))
            cand_indptr.append(len(cand_indices))
    s = dusk.SpgemvPlan(DEV)
    s.plan(indptr, ids, last, cand_indptr, cand_indices, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages)
    p = dusk.PrunePlan(DEV)
    rows_q = [n for n in seq_lens for _ in range(hq)]
    p_indptr = np.concatenate([[0], np.cumsum(rows_q)]).astype(np.int32)
    p_indices = np.concatenate([np.arange(n) for n in rows_q]).astype(np.int32)
    p.plan(p_indptr, p_indices, policy="top_p", params={"p": 0.9}, group=1, sm_scale=d**-0.5)
    cap = 256
    rows = len(seq_lens) * hkv
    sel_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=DEV)
    sel_indices = torch.zeros(rows * cap, dtype=torch.int32, device=DEV)
    a = dusk.AttentionPlan(DEV)
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages, mode="group", sel_indptr=sel_indptr, sel_indices=sel_indices, device_lists=True, max_tokens=cap)
    qg = torch.empty_like(q, device=DEV)
    scores = torch.empty(s.num_scores, device=DEV)
    out = torch.empty_like(qg)

    def step():
        s.run(qg, packed, scale, zero, scores)
        p.run(scores)
        a.run(qg, kg, vg, out)

    rng = np.random.default_rng(9)

    def inputs():
        lists = [np.sort(rng.choice(n, min(n, int(rng.integers(1, cap + 1))), replace=False)) for n in seq_lens for _ in range(hkv)]
        ip = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int32)
        return torch.randn(q.shape, generator=gen).half().to(DEV), torch.from_numpy(ip).to(DEV), torch.from_numpy(np.concatenate(lists).astype(np.int32)).to(DEV)

    def load(x):
        qg.copy_(x[0])
        sel_indptr.copy_(x[1])
        sel_indices[: len(x[2])].copy_(x[2])

    def kept():
        # The kept lists: entries past sel_indptr[-1] are whatever an earlier run left.
        ip = torch.from_dlpack(p.sel_indptr).clone()
        return ip, torch.from_dlpack(p.sel_indices)[: int(ip[-1])].clone()

    steps = [inputs() for _ in range(3)]
    eager = []
    for x in steps:
        load(x)
        step()
        eager.append((out.clone(), kept(), scores.clone()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up on a side stream, as torch's graph docs do
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for x, (want_out, want_sel, want_scores) in zip(steps, eager):
        load(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(scores, want_scores)
        got = kept()
        assert torch.equal(got[0], want_sel[0]) and torch.equal(got[1], want_sel[1])
        assert torch.equal(out, want_out)


def test_a_captured_step_converts_the_table_and_attends(gen):
    # An engine's decode step: vLLM's block table and lengths, changed between replays, are
    # converted on the device and read there by device-table plans (two launches, and the
    # merge inside the split), all in one captured graph: equal to eager runs, which equal
    # the reference.
    hkv, hq, d, batch, max_pages, num_pages = 2, 8, 128, 4, 40, 200
    k = torch.randn((num_pages, PAGE, hkv, d), generator=gen).half().to(DEV)
    v = torch.randn((num_pages, PAGE, hkv, d), generator=gen).half().to(DEV)
    i32 = dict(dtype=torch.int32, device=DEV)
    block_table = torch.zeros((batch, max_pages), **i32)
    seq_lens = torch.zeros(batch, **i32)
    table = (torch.zeros(batch + 1, **i32), torch.zeros(batch * max_pages, **i32), torch.zeros(batch, **i32))
    plans = []
    for fused in (False, True):
        a = dusk.AttentionPlan(DEV)
        a.plan(*table, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages,
               device_table=True, max_tokens=max_pages * PAGE, fused_merge=fused)
        plans.append(a)
    q = torch.empty((batch, hq, d), dtype=torch.float16, device=DEV)
    outs = [torch.empty_like(q) for _ in plans]

    def step():
        dusk.vllm_to_csr(block_table, seq_lens, *table, page_size=PAGE, num_pages=num_pages)
        for a, o in zip(plans, outs):
            a.run(q, k, v, o)

    rng = np.random.default_rng(4)

    def inputs():
        lens = rng.integers(0, max_pages * PAGE + 1, batch).astype(np.int32)
        ids = np.stack([rng.permutation(num_pages)[:max_pages] for _ in range(batch)]).astype(np.int32)
        return torch.from_numpy(ids).to(DEV), torch.from_numpy(lens).to(DEV), torch.randn(q.shape, generator=gen).half().to(DEV)

    def load(x):
        block_table.copy_(x[0])
        seq_lens.copy_(x[1])
        q.copy_(x[2])

    steps = [inputs() for _ in range(3)]
    eager = []
    for x in steps:
        load(x)
        step()
        eager.append([o.clone() for o in outs])
        lens = x[1].cpu().numpy()
        ip, ids, last = (t.cpu().numpy() for t in table)
        want, _ = ref.attention(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), ip, ids, last, PAGE,
                                lambda b, h: np.arange(lens[b]), d**-0.5)
        for o in outs:
            np.testing.assert_allclose(o.cpu().double().numpy(), want, atol=2e-2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for x, want in zip(steps, eager):
        load(x)
        graph.replay()
        torch.cuda.synchronize()
        for o, w in zip(outs, want):
            assert torch.equal(o, w)


def test_host_time_of_a_run(gen):
    seq_lens = [4096] * 32
    hkv, hq, d = 8, 32, 128
    indptr, ids, last, num_pages = table(seq_lens, spare=0)
    k = torch.zeros((num_pages, PAGE, hkv, d), dtype=torch.float16, device=DEV)
    q = torch.zeros((32, hq, d), dtype=torch.float16, device=DEV)
    out = torch.empty_like(q)
    a = dusk.AttentionPlan(DEV)
    a.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, num_pages=num_pages)
    stream = torch.cuda.current_stream().cuda_stream
    for kw in ({}, {"stream": stream}):
        for _ in range(50):
            a.run(q, k, k, out, **kw)
        torch.cuda.synchronize()
        n = 500
        t0 = time.perf_counter()
        for _ in range(n):
            a.run(q, k, k, out, **kw)
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"\nhost time of AttentionPlan.run ({'stream given' if kw else 'current stream looked up'}): {host:.1f} us a call")
    cand = [0] + [4096 * (i + 1) for i in range(32 * hkv)]
    idx = np.tile(np.arange(4096, dtype=np.int32), 32 * hkv)
    p = dusk.PrunePlan(DEV)
    p.plan(cand, idx, policy="top_p", params={"p": 0.9})
    scores = torch.randn(len(idx), device=DEV)
    for _ in range(50):
        p.run(scores)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        p.run(scores)
    print(f"host time of PrunePlan.run: {(time.perf_counter() - t0) / 500 * 1e6:.1f} us a call")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        dusk.data_ptr(q)
    print(f"reading one torch tensor (dusk.data_ptr): {(time.perf_counter() - t0) / 2000 * 1e6:.2f} us")
    t0 = time.perf_counter()
    for _ in range(2000):
        q.__dlpack__(stream=stream or 1)
    print(f"torch's __dlpack__ alone: {(time.perf_counter() - t0) / 2000 * 1e6:.2f} us")


def test_a_captured_pipeline_step_replays_like_eager_steps(gen):
    # Quest (N/4) + top-p 0.95 + group attention at the bundle's shapes (GQA 8/2, head_dim
    # 128): every kernel from the bundle; each step appends a token to every sequence
    # (cache, INT4 copy, Quest's pages: one launch) and attends. Eager steps against
    # NumPy's attention over the lists they kept, then the same steps replayed from one
    # captured CUDA graph, from the same starting state: equal bit for bit.
    seq_lens = [2001, 700, 1500, 257]
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    kg, vg = k.to(DEV), v.to(DEV)
    k0, v0 = kg.clone(), vg.clone()
    p = dusk.PipelinePlan(DEV, select="quest", budget=0.25, prune=[("top_p", {"p": 0.95})])
    p.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages)
    kernels = dict(dusk.loaded_kernels(DEV))
    assert set(kernels.values()) == {"bundle"}, kernels
    assert any(n.startswith("quest_score") for n in kernels)
    qg = torch.empty_like(q, device=DEV)
    kn = torch.empty((len(seq_lens), hkv, d), dtype=torch.float16, device=DEV)
    vn = torch.empty_like(kn)
    out = torch.empty_like(qg)

    def step():
        p.append(kn, vn, kg, vg)
        p.step(qg, kg, vg, out)

    steps = [tuple(torch.randn(x.shape, generator=gen).half().to(DEV) for x in (qg, kn, vn)) for _ in range(3)]

    def load(x):
        for dst, src in zip((qg, kn, vn), x):
            dst.copy_(src)

    def restart():
        kg.copy_(k0)
        vg.copy_(v0)
        p.prepare(kg)

    restart()
    eager = []
    for x in steps:
        load(x)
        out.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        ip = torch.from_dlpack(p.sel_indptr).cpu().numpy().copy()
        kept = torch.from_dlpack(p.sel_indices).cpu().numpy()[: ip[-1]].copy()
        assert p.budgets() == list(np.diff(ip))
        group = hq // hkv
        want, _ = ref.attention(
            x[0].cpu().numpy(), kg.cpu().numpy(), vg.cpu().numpy(), indptr, ids, last, PAGE,
            lambda b, h: kept[ip[b * hkv + h // group] : ip[b * hkv + h // group + 1]], d**-0.5)
        np.testing.assert_allclose(out.float().cpu().numpy(), want, atol=2e-3, rtol=2e-2)
        eager.append((out.clone(), ip, kept, kg.clone()))
    restart()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        p.step(qg, kg, vg, out)  # warm up on a side stream, as torch's graph docs do
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    restart()
    for x, (want_out, want_ip, want_kept, want_k) in zip(steps, eager):
        load(x)
        graph.replay()
        torch.cuda.synchronize()
        ip = torch.from_dlpack(p.sel_indptr).cpu().numpy()
        np.testing.assert_array_equal(ip, want_ip)
        np.testing.assert_array_equal(torch.from_dlpack(p.sel_indices).cpu().numpy()[: ip[-1]], want_kept)
        assert torch.equal(kg, want_k)
        assert torch.equal(out, want_out)


@pytest.mark.parametrize("select", ["ds", "sparq"])
def test_token_selector_pipelines_from_the_bundle_equal_the_interpreter(gen, select):
    # Double Sparsity (16 labels, N/4) + top-p and SparQ (r = 16, N/8, its mix) at the
    # bundle's shapes: every GPU kernel from the bundle. The same decode step (prepare,
    # replan to one more token a sequence, append, step) on the GPU and through the CPU
    # interpreter: the same selection and budgets, outputs within rounding.
    seq_lens = [2001, 700, 1500, 257]  # each last page has room for the next token
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    samples = torch.randn((16, hq, d), generator=gen).half().numpy()
    keys = torch.randn((16, hkv, d), generator=gen).half().numpy()
    decl = {
        "ds": dict(select="ds", calibration=dusk.calibrate_ds(samples, keys, r=16), budget=0.25,
                   prune=[("top_p", {"p": 0.95})]),
        "sparq": dict(select="sparq", budget=0.125, recent=64),
    }[select]
    k_new = torch.randn((len(seq_lens), hkv, d), generator=gen).half()
    v_new = torch.randn_like(k_new)
    grown = np.asarray(last) + 1
    got = {}
    for dev in ("cpu", DEV):
        kc, vc = k.clone().to(dev), v.clone().to(dev)
        p = dusk.PipelinePlan(dev, **decl)
        p.plan(indptr, ids, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages)
        if dev == DEV:
            kernels = dict(dusk.loaded_kernels(DEV))
            assert set(kernels.values()) == {"bundle"}, kernels
        p.prepare(kc, vc)
        p.replan(indptr, ids, grown)
        p.append(k_new.to(dev), v_new.to(dev), kc, vc)
        out = torch.full_like(q, float("nan")).to(dev)
        qd = q.to(dev)  # before the sleep: a copy from the host would wait for it
        if dev == DEV:
            # The step queued behind a long kernel on torch's stream: anything of it that
            # went to dusk's own stream instead (SparQ's lists, copied for attention) would
            # run first and read stale data.
            torch.cuda._sleep(100_000_000)
        p.step(qd, kc, vc, out)
        if dev == DEV:
            torch.cuda.synchronize()
        sel = torch.from_dlpack(p.selection).cpu().numpy()[: p.candidate_indptr[-1]].copy()
        got[dev] = (sel, p.budgets(), out.float().cpu().numpy(), kc.cpu())
    (sel_c, bud_c, out_c, k_c), (sel_g, bud_g, out_g, k_g) = got["cpu"], got[DEV]
    assert torch.equal(k_c, k_g)
    np.testing.assert_array_equal(sel_g, sel_c)
    assert bud_g == bud_c
    np.testing.assert_allclose(out_g, out_c, atol=2e-3, rtol=2e-2)


def test_a_device_table_pipeline_replays_a_decode_loop_whose_lengths_grow(gen):
    # Quest (N/4) + top-p on a page table in device tensors the plan borrows
    # (device_table=True): three steps, each writing the grown table into the same tensors
    # (a sequence taking a new page), then append and step; eagerly, then from one CUDA graph
    # captured once and replayed each step from the same start: equal bit for bit.
    seq_lens = [2001, 700, 1500, 256]  # the last sequence's page is full: a new page at once
    hkv, hq, d = 2, 8, 128
    indptr, ids, last, num_pages, q, k, v = attention_inputs(gen, seq_lens, hkv, hq, d)
    spare0 = [x for x in range(num_pages) if x not in set(ids.tolist())]
    cap = len(ids) + 4
    t_indptr = torch.tensor(indptr, dtype=torch.int32, device=DEV)
    t_ids = torch.zeros(cap, dtype=torch.int32, device=DEV)
    t_last = torch.tensor(last, dtype=torch.int32, device=DEV)
    p = dusk.PipelinePlan(DEV, select="quest", budget=0.25, prune=[("top_p", {"p": 0.95})])

    def write_table(ip, ix, la):
        t_indptr.copy_(torch.from_numpy(ip))
        t_ids[: len(ix)].copy_(torch.from_numpy(ix))
        t_last.copy_(torch.from_numpy(la))

    write_table(indptr, ids, last)
    p.plan(t_indptr, t_ids, t_last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, num_pages=num_pages,
           device_table=True, max_tokens=2048 + 64)
    assert set(dict(dusk.loaded_kernels(DEV)).values()) == {"bundle"}
    tables = []
    ip, ix, la, spare = indptr.copy(), np.zeros(cap, np.int32), last.copy(), list(spare0)
    ix[: len(ids)] = ids
    for _ in range(3):
        ref.grow_table(ip, ix, la, spare, PAGE)
        tables.append((ip.copy(), ix[: ip[-1]].copy(), la.copy()))
    kg, vg = k.to(DEV), v.to(DEV)
    k0, v0 = kg.clone(), vg.clone()
    qg = torch.empty_like(q, device=DEV)
    kn = torch.empty((len(seq_lens), hkv, d), dtype=torch.float16, device=DEV)
    vn = torch.empty_like(kn)
    out = torch.empty_like(qg)
    steps = [tuple(torch.randn(x.shape, generator=gen).half().to(DEV) for x in (qg, kn, vn)) for _ in tables]

    def restart():
        kg.copy_(k0)
        vg.copy_(v0)
        write_table(indptr, ids, last)
        p.prepare(kg)

    def load(i):
        write_table(*tables[i])
        for dst, src in zip((qg, kn, vn), steps[i]):
            dst.copy_(src)

    def step():
        p.append(kn, vn, kg, vg)
        p.step(qg, kg, vg, out)

    restart()
    eager = []
    for i in range(len(tables)):
        load(i)
        out.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        eager.append((out.clone(), p.budgets(), kg.clone()))
    restart()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    restart()
    for i, (want_out, want_budgets, want_k) in enumerate(eager):
        load(i)
        graph.replay()
        torch.cuda.synchronize()
        assert p.budgets() == want_budgets
        assert torch.equal(kg, want_k)
        assert torch.equal(out, want_out)
