"""A Llama-architecture model from transformers decoding through dusk, beside the same model
on FlashInfer's decode and on PyTorch SDPA: time per output token (one decode step of the
whole batch), graph-captured alike, written as benches/results/python_decode.json (DESIGN.md
section 8).

The model is `LlamaForCausalLM` built from a config at Llama-3.1-8B's shapes (hidden 4096,
MLP 14336, 32 query heads, 8 KV heads, head_dim 128, vocabulary 128256; fewer layers, as
many as the KV cache leaves room for) with random weights, float16. Attention is swapped
through transformers' attention interface (`AttentionInterface.register`, then
`model.set_attn_implementation`): each registered function appends the step's K and V
(after RoPE) to a paged cache this script keeps (transformers' own caches are contiguous or
tied to its continuous-batching manager) and attends over it:

- `dusk`: `dusk.AttentionPlan` planned once with `device_table=True`; every step converts
  vLLM-style metadata (`block_table`, `seq_lens`) to the CSR page table on the device
  (`dusk.vllm_to_csr`, inside the captured step) and each layer's `run` reads it there;
- `dusk-fused-merge`: the same with `fused_merge=True` (one launch a run instead of two);
- `dusk-host-table`: the plan over the page table uploaded once (no conversion, no
  clamping): what the device table costs;
- `dusk-quest-twilight`: sparse attention, `dusk.PipelinePlan` (one a layer, over the
  host table): Quest keeps a quarter of each sequence's pages (N/4), top-p 0.95 over their
  INT4-estimated weights keeps the fewest tokens holding 95% of each query head's weight,
  group varlen attention reads the union over each GQA group. Its K/V append is the
  pipeline's own (`PipelinePlan.append`: the cache, the INT4 copy of K and Quest's page
  min and max for the new token, one launch) in place of the others' two index copies.
  The model's weights are random, so its attention is near uniform and the budgets the
  pruner finds say nothing of a trained model's: the side times the machinery at these
  budgets, and its logits are not expected to match the dense sides';
- `fi-decode-*`: FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` (NHD, planned once on the
  same table; CUDA-core and tensor-core decode both timed, the faster is the peer; no name
  with "flash" in it: transformers takes those for flash-attention kernels to fetch);
- `torch-sdpa`: `torch.nn.functional.scaled_dot_product_attention` (flash backend) over the same
  pages seen as a `[batch, kv_heads, context, head_dim]` view: each sequence's pages are
  consecutive in the cache, so all three read the same memory.

Every side runs the same model, the same K/V append and the same cache; only the attention
call differs. A step is timed by benches/baselines/harness.py's rule: captured in a CUDA
graph (20 steps a graph) and replayed, GPU time per step, the median of 15 replays (the
cache is about 35 GB, far beyond the L2). Before timing, one eager step of each side is
compared with SDPA's logits (the dense sides must match; the sparse side's difference is
reported), and a replay of the captured step of dusk and of dusk-quest-twilight with its
eager step.

    python3 python/benches/llama_decode.py --out benches/results/python_decode.json \\
        --commit COMMIT --date DATE
    python3 python/benches/llama_decode.py --tiny   # a small model on the CPU: the checks only
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import dusk

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benches", "baselines"))

PAGE = 16


def llama_config(args):
    from transformers import LlamaConfig

    if args.tiny:
        shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=64, vocab_size=1000)
    else:
        shape = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256)
    return LlamaConfig(num_hidden_layers=args.layers, max_position_embeddings=131072,
                       rope_theta=500000.0, tie_word_embeddings=False, **shape)


class PagedCache:
    """Per layer, K and V pages `[num_pages, PAGE, kv_heads, head_dim]`; sequence b owns
    pages `b * pages_per_seq ..` (consecutive, so SDPA can read the same memory as a
    `[batch, context, kv_heads, head_dim]` view), all `context` tokens long: the step
    appends token `context - 1` and attends to all `context`."""

    def __init__(self, cfg, batch, context, device, gen):
        self.batch, self.context = batch, context
        self.hkv, self.d = cfg.num_key_value_heads, cfg.head_dim
        self.hq = cfg.num_attention_heads
        self.pages_per_seq = context // PAGE
        self.num_pages = batch * self.pages_per_seq
        shape = (self.num_pages, PAGE, self.hkv, self.d)
        self.k = [torch.randn(shape, dtype=torch.float16, device=device, generator=gen) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.randn(shape, dtype=torch.float16, device=device, generator=gen) for _ in range(cfg.num_hidden_layers)]
        # vLLM's metadata, and the CSR table dusk converts it to on the device.
        ids = torch.arange(self.num_pages, dtype=torch.int32, device=device)
        self.block_table = ids.view(batch, self.pages_per_seq)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.kv_page_indices = torch.zeros(self.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.zeros(batch, dtype=torch.int32, device=device)
        self.convert()

    def convert(self):
        dusk.vllm_to_csr(self.block_table, self.seq_lens, self.kv_indptr, self.kv_page_indices,
                         self.kv_last_page_len, page_size=PAGE, num_pages=self.num_pages)

    def append(self, layer, key, value):
        """Writes the step's K and V (`[batch, kv_heads, 1, head_dim]`) at position
        `context - 1` of every sequence."""
        pos = self.context - 1
        self.k[layer].view(self.batch, self.context, self.hkv, self.d)[:, pos] = key[:, :, 0]
        self.v[layer].view(self.batch, self.context, self.hkv, self.d)[:, pos] = value[:, :, 0]

    def dense_view(self, layer):
        """K and V as `[batch, kv_heads, context, head_dim]` views of the same pages."""
        kv = [t.view(self.batch, self.context, self.hkv, self.d).transpose(1, 2) for t in (self.k[layer], self.v[layer])]
        return kv[0], kv[1]

    def kv_bytes(self):
        return 2 * len(self.k) * self.k[0].numel() * 2


def plan_dusk(cache, device, device_table, fused_merge=False):
    a = dusk.AttentionPlan(device)
    kw = dict(num_qo_heads=cache.hq, num_kv_heads=cache.hkv, head_dim=cache.d, page_size=PAGE,
              num_pages=cache.num_pages, fused_merge=fused_merge)
    if device_table:
        a.plan(cache.kv_indptr, cache.kv_page_indices, cache.kv_last_page_len, device_table=True,
               max_tokens=cache.context, **kw)
    else:
        a.plan(cache.kv_indptr.cpu(), cache.kv_page_indices.cpu(), cache.kv_last_page_len.cpu(), **kw)
    return a


def sdpa_backend(cache, tiny, scale):
    """The first SDPA backend that runs this decode (the flash kernel where it takes GQA and
    the cache's strided view)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    k, v = cache.dense_view(0)
    q = torch.zeros((cache.batch, cache.hq, 1, cache.d), dtype=k.dtype, device=k.device)
    tried = [SDPBackend.MATH] if tiny else [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    for backend in tried:
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
            return backend
        except RuntimeError as e:
            print(f"SDPA {backend}: {str(e).splitlines()[0][:120]}", flush=True)
    raise RuntimeError("no SDPA backend ran the decode")


def register(cache, sides, appends=None):
    """Registers one attention function per side; `sides[name]` is its attention over the
    cache: `(layer, q [batch, q_heads, head_dim]) -> out [batch, q_heads, head_dim]`;
    `appends[name]`, where given, replaces `cache.append` for that side."""
    from transformers import AttentionInterface

    appends = appends or {}

    def make(attend, append):
        def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            append(module.layer_idx, key, value)
            b, hq, _, d = query.shape
            out = attend(module.layer_idx, query.reshape(b, hq, d))
            return out.view(b, 1, hq, d), None

        return attention

    for name, attend in sides.items():
        AttentionInterface.register(name, make(attend, appends.get(name, cache.append)))


QUEST_TWILIGHT = dict(select="quest", budget=0.25, prune=[("top_p", {"p": 0.95})], attend="group_varlen")


def plan_pipelines(cache, device):
    """One `dusk.PipelinePlan` a layer (each keeps its layer's INT4 copy of K and Quest's
    page state), planned on the host table and prepared from the layer's cache (as after a
    prefill)."""
    plans = []
    for layer in range(len(cache.k)):
        p = dusk.PipelinePlan(device, **QUEST_TWILIGHT)
        p.plan(cache.kv_indptr.cpu(), cache.kv_page_indices.cpu(), cache.kv_last_page_len.cpu(),
               num_qo_heads=cache.hq, num_kv_heads=cache.hkv, head_dim=cache.d,
               num_pages=cache.num_pages, page_size=PAGE)
        p.prepare(cache.k[layer])
        plans.append(p)
    return plans


def pipeline_side(cache, plans):
    """The attention and the append of the sparse side."""

    def attend(layer, q):
        out = torch.empty_like(q)
        plans[layer].step(q, cache.k[layer], cache.v[layer], out)
        return out

    def append(layer, key, value):
        plans[layer].append(key[:, :, 0].contiguous(), value[:, :, 0].contiguous(),
                            cache.k[layer], cache.v[layer])

    return attend, append


def budget_summary(plans, context):
    """The tokens attention read per (sequence, KV head) in the last step, per layer and
    over all layers."""
    import numpy as np

    per_layer = [np.asarray(p.budgets()) for p in plans]
    every = np.concatenate(per_layer)

    def summary(x):
        return {"mean": float(x.mean()), "min": int(x.min()), "p50": float(np.median(x)),
                "max": int(x.max()), "mean_fraction_of_context": float(x.mean() / context)}

    return {"all_layers": summary(every), "per_layer": [summary(x) for x in per_layer],
            "quest_selection_tokens_per_row": int(np.diff(plans[0].candidate_indptr).max())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--commit", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--tiny", action="store_true", help="a small model on the CPU: the checks only")
    args = ap.parse_args()
    if args.tiny:
        args.layers, args.batch, args.context = 2, 3, 64
    device = "cpu" if args.tiny else "cuda"
    from transformers import LlamaForCausalLM

    cfg = llama_config(args)
    torch.set_default_dtype(torch.float16)
    gen = torch.Generator(device=device).manual_seed(7)
    torch.manual_seed(7)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    cache = PagedCache(cfg, args.batch, args.context, device, gen)
    scale = cfg.head_dim ** -0.5

    dense = plan_dusk(cache, device, device_table=True)
    fused = plan_dusk(cache, device, device_table=True, fused_merge=True)
    host = plan_dusk(cache, device, device_table=False)

    def dusk_side(plan):
        def attend(layer, q):
            out = torch.empty_like(q)
            plan.run(q, cache.k[layer], cache.v[layer], out)
            return out

        return attend

    backend = sdpa_backend(cache, args.tiny, scale)

    from torch.nn.attention import sdpa_kernel

    def sdpa(layer, q):
        k, v = cache.dense_view(layer)
        b, hq, d = q.shape
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.view(b, hq, 1, d), k, v, scale=scale, enable_gqa=True)
        return out.view(b, hq, d)

    plans = plan_pipelines(cache, device)
    quest_attend, quest_append = pipeline_side(cache, plans)
    sides = {"dusk": dusk_side(dense), "dusk-fused-merge": dusk_side(fused),
             "dusk-host-table": dusk_side(host), "dusk-quest-twilight": quest_attend,
             "torch-sdpa": sdpa}
    fi_versions = {}
    if not args.tiny:
        import flashinfer

        fi_versions["flashinfer"] = flashinfer.__version__
        for tc in (False, True):
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=device)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
            w.plan(cache.kv_indptr, cache.kv_page_indices, cache.kv_last_page_len, cache.hq, cache.hkv,
                   cache.d, PAGE, pos_encoding_mode="NONE", q_data_type=torch.float16,
                   kv_data_type=torch.float16)

            def fi(layer, q, w=w, ws=ws):
                out = torch.empty_like(q)
                w.run(q, (cache.k[layer], cache.v[layer]), out=out)
                return out

            sides["fi-decode-tensor-cores" if tc else "fi-decode-cuda-cores"] = fi
    register(cache, sides, {"dusk-quest-twilight": quest_append})

    ids = torch.randint(0, cfg.vocab_size, (args.batch, 1), device=device, generator=gen)
    positions = torch.full((args.batch, 1), args.context - 1, dtype=torch.long, device=device)

    def step_fn(name):
        def step():
            if name in ("dusk", "dusk-fused-merge"):
                cache.convert()  # the engine's table to CSR, on the device, every step
            return model(input_ids=ids, position_ids=positions, use_cache=False).logits

        return step

    # Every side's eager logits against SDPA's (the same weights, cache and token).
    logits = {}
    with torch.no_grad():
        for name in sides:
            model.set_attn_implementation(name)
            logits[name] = step_fn(name)().float()
    base = logits["torch-sdpa"]
    checks = {}
    for name, lg in logits.items():
        err = ((lg - base).abs().max() / base.abs().max()).item()
        checks[name] = err
        print(f"{name}: max |logits - torch-sdpa's| / max |torch-sdpa's| = {err:.2e}", flush=True)
        if name.startswith("dusk") and name != "dusk-quest-twilight":
            assert err < 2e-2, f"{name}: logits differ from SDPA's ({err:.2e})"
    budgets = budget_summary(plans, args.context)
    print(f"dusk-quest-twilight budgets (tokens per sequence and KV head): {budgets['all_layers']}", flush=True)
    if args.tiny:
        print("checks passed (CPU, tiny model; timing needs a GPU)")
        return

    result = run_timed(args, cfg, model, cache, sides, step_fn, logits, checks, fi_versions, backend, plans)
    result["quest_twilight"]["budgets"] = budgets
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(result["cases"], indent=1))


def replay_diff(model, step_fn, logits, name):
    """Max |logits| difference between a replay of `name`'s captured step and its eager
    step."""
    model.set_attn_implementation(name)
    step = step_fn(name)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    diff = (captured.float() - logits[name]).abs().max().item()
    print(f"{name}: captured step replayed, max |logits - eager's| = {diff:.3g}", flush=True)
    del graph, captured
    torch.cuda.empty_cache()
    return diff


def run_timed(args, cfg, model, cache, sides, step_fn, logits, checks, fi_versions, sdpa_backend_name, plans):
    import harness

    copy, copy_m = harness.measure_copy()
    measured = {}
    with torch.no_grad():
        # A replay of each dusk step's capture equals its eager step (the sparse side's
        # append rewrites the same token, so its state is the same at every step).
        replays = {n: replay_diff(model, step_fn, logits, n) for n in ("dusk", "dusk-quest-twilight")}
        # The sparse side's state upkeep: the append of one step (every layer, one launch
        # each), against preparing the INT4 copy and Quest's pages of the whole cache again.
        key = torch.randn((args.batch, cache.hkv, cache.d), dtype=torch.float16, device="cuda")
        upkeep = {
            "append_every_layer": harness.measure([lambda: [p.append(key, key, cache.k[i], cache.v[i]) for i, p in enumerate(plans)]]),
            # Queued, not captured: prepare uploads the table's page list each call.
            "prepare_every_layer": harness.measure([lambda: [p.prepare(cache.k[i]) for i, p in enumerate(plans)]], graph=False),
        }
        for n, m in upkeep.items():
            print(f"dusk-quest-twilight {n}: {m.median_us:.1f} us ({m.timing})", flush=True)
        # Back to the model's own token at every layer's appended position.
        model.set_attn_implementation("dusk-quest-twilight")
        step_fn("dusk-quest-twilight")()
        for name in sides:
            model.set_attn_implementation(name)
            m = harness.measure([step_fn(name)])
            measured[name] = m
            print(f"{name}: {m.median_us:.1f} us a step ({m.timing}; spread {m.spread_us()})", flush=True)
    params = sum(p.numel() for p in model.parameters())
    step_bytes = cache.kv_bytes() + 2 * params
    fi_best = min(("fi-decode-cuda-cores", "fi-decode-tensor-cores"), key=lambda n: measured[n].median_us)
    shape = {"batch": args.batch, "context": args.context, "layers": cfg.num_hidden_layers,
             "num_q_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_key_value_heads,
             "head_dim": cfg.head_dim, "page_size": PAGE, "hidden": cfg.hidden_size,
             "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size}
    cases = []
    sdpa_peer = "sdpa-flash" if "FLASH" in str(sdpa_backend_name) else "torch"
    for ours_name, suffix in (("dusk", ""), ("dusk-fused-merge", "_fused_merge"),
                              ("dusk-quest-twilight", "_quest_twilight")):
        ours = measured[ours_name]
        for peer, peer_name in ((fi_best, "flashinfer"), ("torch-sdpa", sdpa_peer)):
            p = measured[peer]
            gbps = step_bytes / (ours.median_us * 1e-6) / 1e9
            cases.append({
                "case": f"llama_decode_b{args.batch}_ctx{args.context}_l{cfg.num_hidden_layers}{suffix}_vs_{peer_name}",
                "shape": shape, "ours_us": ours.median_us, "peer": peer_name, "peer_us": p.median_us,
                "speedup_vs_peer": p.median_us / ours.median_us, "bytes": step_bytes, "gbps": gbps,
                "frac_of_copy_bw": gbps / copy, "timing": {"ours": ours.timing, "peer": p.timing},
                "ours_spread_us": ours.spread_us(), "peer_spread_us": p.spread_us(),
                "ours_variant": ours_name, "peer_variant": peer,
            })
            if ours_name == "dusk-quest-twilight":
                cases[-1]["bytes_note"] = ("the dense step's bytes (the whole KV cache and the weights) "
                                           "over the sparse step's time: an effective rate, not what it moved")
    import transformers

    return {
        "device": torch.cuda.get_device_name(), "driver": driver_version(),
        "commit": args.commit, "date": args.date,
        "command": "python3 python/benches/llama_decode.py --out benches/results/python_decode.json "
                   f"--commit {args.commit} --date {args.date}",
        "copy_gbps": copy, "copy_timing": copy_m.timing,
        "peer_versions": {"torch": torch.__version__, "transformers": transformers.__version__, **fi_versions},
        "model": "LlamaForCausalLM from LlamaConfig (Llama-3.1-8B's shapes, random weights, float16), "
                 f"{cfg.num_hidden_layers} layers, {params} parameters",
        "what_a_step_is": "one decode step of the whole batch (one new token per sequence; ours_us "
                          "is the time per output token of each sequence), the K/V append and "
                          "(dusk) the page-table conversion included; bytes: the KV cache read "
                          "plus every weight once",
        "all_sides_us": {n: m.median_us for n, m in measured.items()},
        "all_sides_timing": {n: m.timing for n, m in measured.items()},
        "logits_rel_err_vs_torch_sdpa": checks,
        "graph_replay_max_abs_diff_vs_eager": replays["dusk"],
        "graph_replay_max_abs_diff_vs_eager_by_side": replays,
        "quest_twilight": {
            "pipeline": {k: (list(map(list, v)) if k == "prune" else v) for k, v in QUEST_TWILIGHT.items()},
            "random_weights_note": "The model's weights are random: its attention is near uniform, so "
                                   "the tokens top-p keeps (the budgets below) say nothing of a trained "
                                   "model's, and the sparse side's logits are not expected to match the "
                                   "dense sides' (logits_rel_err_vs_torch_sdpa reports the difference). "
                                   "Its time is the machinery's at these budgets.",
            "append": "PipelinePlan.append (dusk's one-launch append: the cache's K and V, the INT4 copy "
                      "of K, Quest's page min and max) inside the captured step, in place of the dense "
                      "sides' two PyTorch index copies",
            "upkeep_us": {n: m.median_us for n, m in upkeep.items()},
            "upkeep_timing": {n: m.timing for n, m in upkeep.items()},
        },
        "sdpa_backend": str(sdpa_backend_name),
        "cases": cases,
    }


def driver_version():
    try:
        import ctypes

        v = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        return None


if __name__ == "__main__":
    main()
