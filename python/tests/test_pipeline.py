"""dusk.PipelinePlan on the CPU (dusk's interpreter), NumPy arrays through DLPack: each
stage of a step against a NumPy reference (Quest's pages, the INT4 estimate and the
top-p search over them, attention over what was kept), everything written poisoned first;
the append against a fresh prepare; a decode loop (replan, append, step) of Quest, Double
Sparsity and SparQ against fresh plans of the grown cache; Quest alone, Full + top-p; bad
input."""

import numpy as np
import pytest

import dusk
import reference as ref

PAGE = 16


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def case(rng, seq_lens, hkv=2, hq=8, d=64, spare=2):
    indptr, ids, last, num_pages = ref.random_table(rng, seq_lens, PAGE)
    num_pages += spare
    k = rng.standard_normal((num_pages, PAGE, hkv, d)).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    q = rng.standard_normal((len(seq_lens), hq, d)).astype(np.float16)
    return dict(indptr=indptr, ids=ids, last=last, num_pages=num_pages, k=k, v=v, q=q,
                hkv=hkv, hq=hq, d=d, lens=seq_lens)


def planned(c, **decl):
    p = dusk.PipelinePlan("cpu", **decl)
    p.plan(c["indptr"], c["ids"], c["last"], num_qo_heads=c["hq"], num_kv_heads=c["hkv"],
           head_dim=c["d"], num_pages=c["num_pages"])
    return p


def step(p, c):
    out = np.full_like(c["q"], np.nan)
    lse = np.full(c["q"].shape[:2], np.nan, np.float32)
    p.step(c["q"], c["k"], c["v"], out, lse)
    return out, lse


def rows(c):
    return [(b, h) for b in range(len(c["lens"])) for h in range(c["hkv"])]


def check_quest(p, c, budget):
    """Each row's selection is its sequence's last page and the best-scored others (a page
    may trade places with one scored within rounding of the cut)."""
    ip = p.candidate_indptr
    sel = np.from_dlpack(p.selection)
    for r, (b, h) in enumerate(rows(c)):
        n = c["lens"][b]
        got = sel[ip[r] : ip[r + 1]]
        assert np.all(np.diff(got) > 0) and got.min() >= 0 and got.max() < n
        pages = sorted(set(int(x) // PAGE for x in got))
        # Whole pages: every token of each selected page.
        assert len(got) == sum(min(PAGE, n - j * PAGE) for j in pages)
        keep = ref.quest_budget_pages(n, budget, PAGE)
        assert len(pages) == keep
        npages = -(-n // PAGE)
        assert npages - 1 in pages
        s = ref.quest_page_scores(c["q"], c["k"], c["indptr"], c["ids"], c["last"], PAGE, b, h)
        others = np.delete(np.arange(npages), npages - 1)
        if keep == npages:
            continue
        cut = np.sort(s[others])[::-1][keep - 2] if keep >= 2 else np.inf
        for j in others:
            if j in pages:
                assert s[j] >= cut - 1e-2 * max(1.0, abs(cut)), (r, j, s[j], cut)
            else:
                assert s[j] <= cut + 1e-2 * max(1.0, abs(cut)), (r, j, s[j], cut)


def check_pruned(p, c, top_p):
    """Attention's lists are, per row, the union over the group of each head's heaviest
    candidates holding `top_p` of its softmax over the INT4 estimate of Quest's selection."""
    packed, scale, zero = ref.quantize(c["k"], 4)
    kd = ref.dequantize(packed, scale, zero, 4)
    cand_ip = np.asarray(p.candidate_indptr)
    cand = np.from_dlpack(p.selection)[: cand_ip[-1]] if p.selection is not None else None
    if cand is None:  # Full: every token
        cand = np.concatenate([np.arange(c["lens"][b]) for b, _ in rows(c)]).astype(np.int32)
    scores = ref.spgemv(c["q"], kd, c["indptr"], c["ids"], PAGE, cand_ip, cand, c["hkv"])
    group = c["hq"] // c["hkv"]
    ip = np.from_dlpack(p.sel_indptr)
    kept = np.from_dlpack(p.sel_indices)
    budgets = p.budgets()
    for r in range(len(rows(c))):
        s, e = cand_ip[r], cand_ip[r + 1]
        block = scores[s * group : e * group].reshape(group, e - s)
        weights = [ref.softmax(x * c["d"] ** -0.5) for x in block]
        row = kept[ip[r] : ip[r + 1]]
        assert budgets[r] == len(row)
        ref.check_pruned(row, cand[s:e], weights, "top_p", [{"p": top_p}] * group)
    return ip, kept


def check_attention(c, out, lse, ip, kept):
    group = c["hq"] // c["hkv"]
    hkv = c["hkv"]
    want, want_lse = ref.attention(
        c["q"], c["k"], c["v"], c["indptr"], c["ids"], c["last"], PAGE,
        lambda b, h: kept[ip[b * hkv + h // group] : ip[b * hkv + h // group + 1]], c["d"] ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=1e-3, rtol=5e-3)
    np.testing.assert_allclose(lse, want_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("hkv,hq", [(2, 8), (2, 2)])
def test_quest_top_p_matches_numpy_stage_by_stage(rng, hkv, hq):
    c = case(rng, [700, 333, 1024], hkv=hkv, hq=hq)
    p = planned(c, select="quest", budget=0.25, prune=[("top_p", {"p": 0.9})])
    assert not p.is_dense and p.device == "cpu"
    p.prepare(c["k"])
    out, lse = step(p, c)
    check_quest(p, c, 0.25)
    ip, kept = check_pruned(p, c, 0.9)
    check_attention(c, out, lse, ip, kept)


def test_quest_alone_attends_to_its_pages(rng):
    c = case(rng, [500, 260])
    p = planned(c, select="quest", budget=128)
    p.prepare(c["k"])
    out, lse = step(p, c)
    check_quest(p, c, 128)
    ip = np.from_dlpack(p.sel_indptr)
    kept = np.from_dlpack(p.sel_indices)
    sel = np.from_dlpack(p.selection)
    np.testing.assert_array_equal(ip, p.candidate_indptr)
    np.testing.assert_array_equal(kept[: ip[-1]], sel[: ip[-1]])
    assert p.budgets() == list(np.diff(ip))
    check_attention(c, out, lse, ip, kept)


def test_full_top_p_prunes_every_token(rng):
    c = case(rng, [300, 90])
    p = planned(c, select="full", prune=[("top_p", {"p": 0.8})])
    assert p.selection is None
    p.prepare(c["k"])
    out, lse = step(p, c)
    ip, kept = check_pruned(p, c, 0.8)
    check_attention(c, out, lse, ip, kept)


def test_full_dense_is_dense_attention(rng):
    c = case(rng, [300, 90])
    p = planned(c, select="full", attend="dense")
    assert p.is_dense and p.sel_indptr is None
    out, lse = step(p, c)
    every = np.concatenate([[0], np.cumsum([n for n in c["lens"] for _ in range(c["hkv"])])])
    kept = np.concatenate([np.arange(n) for n in c["lens"] for _ in range(c["hkv"])])
    check_attention(c, out, lse, every, kept)
    assert p.budgets() == [n for n in c["lens"] for _ in range(c["hkv"])]


def test_append_updates_the_state_as_a_fresh_prepare(rng):
    # Each sequence's new token opens a page (slot 0), so Quest's min and max of that page
    # are the token's alone: the appended state equals one prepared from the final cache.
    c = case(rng, [16 * 20 + 1, 16 * 9 + 1, 16 * 33 + 1])
    decl = dict(select="quest", budget=0.25, prune=[("top_p", {"p": 0.9})])
    p = planned(c, **decl)
    p.prepare(c["k"])  # the cache before the step: the new tokens' slots hold stale values
    k_new = rng.standard_normal((3, c["hkv"], c["d"])).astype(np.float16)
    v_new = rng.standard_normal(k_new.shape).astype(np.float16)
    p.append(k_new, v_new, c["k"], c["v"])
    for b, n in enumerate(c["lens"]):
        page = c["ids"][c["indptr"][b + 1] - 1]
        np.testing.assert_array_equal(c["k"][page, (n - 1) % PAGE], k_new[b])
        np.testing.assert_array_equal(c["v"][page, (n - 1) % PAGE], v_new[b])
    out, lse = step(p, c)
    fresh = planned(c, **decl)
    fresh.prepare(c["k"])
    out2, lse2 = step(fresh, c)
    np.testing.assert_array_equal(np.from_dlpack(p.selection), np.from_dlpack(fresh.selection))
    assert p.budgets() == fresh.budgets()
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    check_quest(p, c, 0.25)


def selectors(c, rng):
    """Each selector's declaration for case `c` (Double Sparsity calibrated on sample
    queries and keys drawn like the case's)."""
    samples = 16
    q = rng.standard_normal((samples, c["hq"], c["d"])).astype(np.float16)
    k = rng.standard_normal((samples, c["hkv"], c["d"])).astype(np.float16)
    cal = dusk.calibrate_ds(q, k, r=8)
    top_p = [("top_p", {"p": 0.9})]
    return {
        "quest": dict(select="quest", budget=0.25, prune=top_p),
        "ds": dict(select="ds", calibration=cal, budget=0.25, sink=2, prune=top_p),
        "sparq": dict(select="sparq", r=8, budget=48, block_size=32),
    }


@pytest.mark.parametrize("select", ["quest", "ds", "sparq"])
def test_a_decode_loop_equals_fresh_plans_of_the_grown_cache(rng, select):
    # Three steps: `replan` to one more token a sequence, `append` its K and V (the cache,
    # the INT4 copy and the selector's state in one launch), `step`; each against a plan
    # made and prepared afresh on the grown cache. The last pages have room for the steps;
    # 16 * 7 + 14 -> 16 * 8 + 1 crosses into a new page of SparQ's runs (its copy's blocks
    # of 32 and runs of 16 close).
    c = case(rng, [16 * 12 + 5, 16 * 7 + 13, 16 * 20 + 1])
    c["last"][1] = 13  # 16 * 7 + 13: the next steps close a run of 16 at 16 * 8 (a new page)
    decl = selectors(c, rng)[select]
    p = planned(c, **decl)
    p.prepare(c["k"], c["v"])
    spare = [x for x in range(c["num_pages"]) if x not in set(c["ids"])]
    indptr, last = c["indptr"].copy(), c["last"].copy()
    ids = np.zeros(len(c["ids"]) + 3, np.int32)
    ids[: len(c["ids"])] = c["ids"]
    for _ in range(3):
        ref.grow_table(indptr, ids, last, spare, PAGE)
        c = dict(c, indptr=indptr.copy(), ids=ids[: indptr[-1]].copy(), last=last.copy(),
                 lens=[n + 1 for n in c["lens"]])
        p.replan(c["indptr"], c["ids"], c["last"])
        k_new = rng.standard_normal((len(c["lens"]), c["hkv"], c["d"])).astype(np.float16)
        v_new = rng.standard_normal(k_new.shape).astype(np.float16)
        p.append(k_new, v_new, c["k"], c["v"])
        out, lse = step(p, c)
        fresh = planned(c, **decl)
        fresh.prepare(c["k"], c["v"])
        want, want_lse = step(fresh, c)
        got_sel, want_sel = np.from_dlpack(p.selection).copy(), np.from_dlpack(fresh.selection).copy()
        n = p.candidate_indptr[-1]
        np.testing.assert_array_equal(got_sel[:n], want_sel[:n])
        assert p.budgets() == fresh.budgets()
        # SparQ's sums of V are added in another order than a fresh prepare's.
        np.testing.assert_allclose(out, want, atol=1e-3, rtol=1e-3)
        np.testing.assert_allclose(lse, want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("select", ["quest", "ds", "sparq", "full"])
def test_a_device_table_plan_follows_the_table_it_borrows(rng, select):
    # The table in int32 arrays the plan borrows (capacity for new pages), grown in place
    # each step; the device-table plan's append and step against a host-table plan
    # replanned to the same table. Sequence 1 fills its page and takes a new one.
    c = case(rng, [16 * 5 + 3, 16 * 9 + 15, 16 * 2 + 8], spare=4)
    top_p = [("top_p", {"p": 0.9})]
    decl = {
        "quest": lambda: dict(selectors(c, rng)["quest"], prune=top_p),
        "ds": lambda: dict(selectors(c, rng)["ds"], prune=top_p),
        # Its copy paged as the cache: the table on the device is its block table.
        "sparq": lambda: dict(selectors(c, rng)["sparq"], block_size=None),
        "full": lambda: dict(select="full", prune=top_p),
    }[select]()
    n = len(c["ids"])
    spare = [x for x in range(c["num_pages"]) if x not in set(c["ids"])]
    indptr, last = c["indptr"].copy(), c["last"].copy()
    ids = np.zeros(n + 4, np.int32)
    ids[:n] = c["ids"]
    dev = dusk.PipelinePlan("cpu", **decl)
    dev.plan(indptr, ids, last, num_qo_heads=c["hq"], num_kv_heads=c["hkv"], head_dim=c["d"],
             num_pages=c["num_pages"], device_table=True, max_tokens=16 * 12)
    kd, vd = c["k"].copy(), c["v"].copy()
    dev.prepare(kd, vd)
    host = planned(c, **decl)
    host.prepare(c["k"], c["v"])
    for _ in range(3):
        ref.grow_table(indptr, ids, last, spare, PAGE)
        c = dict(c, indptr=indptr.copy(), ids=ids[: indptr[-1]].copy(), last=last.copy())
        k_new = rng.standard_normal((3, c["hkv"], c["d"])).astype(np.float16)
        v_new = rng.standard_normal(k_new.shape).astype(np.float16)
        dev.append(k_new, v_new, kd, vd)
        host.replan(c["indptr"], c["ids"], c["last"])
        host.append(k_new, v_new, c["k"], c["v"])
        np.testing.assert_array_equal(kd, c["k"])
        np.testing.assert_array_equal(vd, c["v"])
        out, lse = step(dev, dict(c, k=kd, v=vd))
        want, want_lse = step(host, c)
        assert dev.budgets() == host.budgets()
        np.testing.assert_allclose(out, want, atol=1e-3, rtol=1e-3)
        np.testing.assert_allclose(lse, want_lse, atol=1e-5, rtol=1e-5)
    with pytest.raises(dusk.DuskError, match="device_table=True"):
        dev.replan(c["indptr"], c["ids"], c["last"])
    raises_arg("max_tokens", dev.plan, indptr, ids, last, num_qo_heads=c["hq"],
               num_kv_heads=c["hkv"], head_dim=c["d"], num_pages=c["num_pages"], device_table=True)


def test_replan_refuses_while_a_view_is_alive(rng):
    c = case(rng, [100, 50])
    p = planned(c, select="quest", budget=0.5)
    p.prepare(c["k"])
    view = p.selection
    with pytest.raises(dusk.DuskError, match="del them first"):
        p.replan(c["indptr"], c["ids"], c["last"])
    del view
    p.replan(c["indptr"], c["ids"], c["last"])
    step(p, c)


def test_short_sequences_attend_densely(rng):
    c = case(rng, [600, 40])
    p = planned(c, select="quest", budget=64, prune=[("top_p", {"p": 0.9})])
    p.prepare(c["k"])
    out, lse = step(p, c)
    budgets = p.budgets()
    assert budgets[2:] == [40, 40]  # no longer than the budget: every token
    ip = np.from_dlpack(p.sel_indptr)
    kept = np.from_dlpack(p.sel_indices)
    check_attention(c, out, lse, ip, kept)


def raises_arg(arg, fn, *args, **kwargs):
    with pytest.raises(dusk.InvalidArgument) as e:
        fn(*args, **kwargs)
    assert e.value.arg == arg, (e.value.arg, str(e.value))
    return e.value


def test_declarations_are_checked():
    raises_arg("select", dusk.PipelinePlan, "cpu", select="sparse")
    raises_arg("budget", dusk.PipelinePlan, "cpu", select="quest")
    raises_arg("budget", dusk.PipelinePlan, "cpu", select="quest", budget=1.5)
    raises_arg("budget", dusk.PipelinePlan, "cpu", select="quest", budget=0)
    raises_arg("budget", dusk.PipelinePlan, "cpu", select="full", budget=0.5)
    raises_arg("policy", dusk.PipelinePlan, "cpu", budget=0.5, prune=[("top_q", {"p": 0.9})])
    raises_arg("params", dusk.PipelinePlan, "cpu", budget=0.5, prune=[("top_p", {"q": 0.9})])
    raises_arg("params", dusk.PipelinePlan, "cpu", budget=0.5, prune=[("top_p", {"p": 1.5})])
    raises_arg("prune", dusk.PipelinePlan, "cpu", budget=0.5, prune="top_p")
    raises_arg("attend", dusk.PipelinePlan, "cpu", budget=0.5, attend="paged")
    raises_arg("attend", dusk.PipelinePlan, "cpu", budget=0.5, attend="dense")
    raises_arg("bits", dusk.PipelinePlan, "cpu", budget=0.5, bits=3)
    raises_arg("device", dusk.PipelinePlan, "tpu", budget=0.5)
    raises_arg("calibration", dusk.PipelinePlan, "cpu", select="ds", budget=0.5)
    raises_arg("calibration", dusk.PipelinePlan, "cpu", select="ds", budget=0.5, calibration='{"format": 1}')
    raises_arg("calibration", dusk.PipelinePlan, "cpu", select="ds", budget=0.5, calibration="/no/such/file.json")
    raises_arg("calibration", dusk.PipelinePlan, "cpu", budget=0.5, calibration="{}")
    raises_arg("r", dusk.PipelinePlan, "cpu", budget=0.5, r=16)
    raises_arg("sparq_mix", dusk.PipelinePlan, "cpu", select="sparq", budget=0.5, prune=[("top_p", {"p": 0.9})])
    raises_arg("sparq_mix", dusk.PipelinePlan, "cpu", budget=0.5, sparq_mix=True)
    raises_arg("recent", dusk.PipelinePlan, "cpu", budget=0.5, recent=8)
    raises_arg("sink", dusk.PipelinePlan, "cpu", budget=0.5, sink=2)
    raises_arg("sink", dusk.PipelinePlan, "cpu", select="sparq", budget=0.5, sink=True)
    q = np.zeros((4, 8, 64), np.float16)
    k = np.zeros((4, 2, 64), np.float16)
    raises_arg("q", dusk.calibrate_ds, q[0], k)
    raises_arg("q", dusk.calibrate_ds, q.astype(np.float64), k)
    raises_arg("k", dusk.calibrate_ds, q, k[:3])
    raises_arg("q", dusk.calibrate_ds, q[:, :7], k)
    raises_arg("r", dusk.calibrate_ds, q, k, r=65)


def test_plans_and_steps_check_their_arguments(rng):
    c = case(rng, [100, 50])
    p = dusk.PipelinePlan("cpu", budget=0.5, attend="head_varlen")
    with pytest.raises(dusk.DuskError):
        p.step(c["q"], c["k"], c["v"], np.empty_like(c["q"]))  # before plan
    raises_arg("attend", p.plan, c["indptr"], c["ids"], c["last"], num_qo_heads=8,
               num_kv_heads=2, head_dim=64, num_pages=c["num_pages"])
    bad = dict(c, hq=7)
    raises_arg("num_qo_heads", planned, bad, budget=0.5)
    p = planned(c, budget=0.5, prune=[("top_p", {"p": 0.9})])
    out = np.empty_like(c["q"])
    raises_arg("q", p.step, c["q"][:1], c["k"], c["v"], out)
    raises_arg("q", p.step, c["q"].astype(np.float32), c["k"], c["v"], out)
    raises_arg("k_cache", p.step, c["q"], c["k"][:-1], c["v"], out)
    raises_arg("v_cache", p.step, c["q"], c["k"], c["v"][..., :32], out)
    raises_arg("out", p.step, c["q"], c["k"], c["v"], c["q"])  # shares q's memory
    ro = np.empty_like(c["q"])
    ro.flags.writeable = False
    raises_arg("out", p.step, c["q"], c["k"], c["v"], ro)
    raises_arg("lse", p.step, c["q"], c["k"], c["v"], out, np.empty((2, 8), np.float64))
    raises_arg("k_cache", p.prepare, c["k"][:, :8])
    raises_arg("v_cache", p.prepare, c["k"], c["v"][:, :8])
    raises_arg("r", planned, c, select="sparq", budget=32, r=0)  # checked against head_dim
    raises_arg("r", planned, c, select="sparq", budget=32, r=65)
    raises_arg("block_size", planned, c, select="sparq", budget=32, block_size=48)
    sq = planned(c, select="sparq", budget=32)
    raises_arg("v_cache", sq.prepare, c["k"])  # SparQ's state reads V
    k_new = np.zeros((2, 2, 64), np.float16)
    raises_arg("k_new", p.append, k_new[:1], k_new, c["k"], c["v"])
    raises_arg("v_new", p.append, k_new, k_new.astype(np.float32), c["k"], c["v"])
    raises_arg("k_cache", p.append, k_new, k_new, c["k"], c["k"])  # the same cache twice
    # A table whose last page is shared by two sequences cannot take an append.
    shared = dusk.PipelinePlan("cpu", budget=0.5)
    raises_arg("kv_page_indices", shared.plan, [0, 2, 4], [0, 1, 2, 1], [16, 16],
               num_qo_heads=8, num_kv_heads=2, head_dim=64, num_pages=3)


@pytest.mark.parametrize("obj", [dusk.PipelinePlan, dusk.calibrate_ds])
def test_docstring_examples_run(obj):
    block = obj.__doc__.split("```python\n")[1].split("```")[0]
    exec(block, {})
