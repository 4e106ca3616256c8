"""Renders BENCHMARKS.md from the committed results in benches/results/*.json.

    python3 benches/report.py > BENCHMARKS.md
"""
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

HEADER = """# Benchmarks

Every figure below comes from one run on the GPU machine: our kernel, its peer and a
device-to-device copy (the bandwidth yardstick) measured in the same command. Times are
medians of CUDA-event timings after warm-up; inputs are larger than L2.

Reproduce (build here, run on the GPU machine with the binaries carried in `.device/`):

```sh
../shared/tools/device-stage --release -p dusk-bench --bin gpu-check
../shared/tools/device-wheels          # FlashInfer, for the top-p peer
# on the GPU machine, from the repository root (FlashInfer installed from .device/whl):
python3 benches/baselines/spgemv_torch.py --out /tmp/peer.json && \\
  .device/gpu-check spgemv --peer /tmp/peer.json --out benches/results/spgemv.json --commit <sha> --date <date>
python3 benches/baselines/topp_peers.py --out /tmp/topp.json && \\
  .device/gpu-check threshold --peer /tmp/topp.json --out benches/results/threshold_search.json --commit <sha> --date <date>
python3 benches/baselines/topp_peers.py --focus 12 --out /tmp/topp12.json && \\
  .device/gpu-check threshold --focus 12 --peer /tmp/topp12.json --out benches/results/threshold_search_focus.json --commit <sha> --date <date>
python3 benches/baselines/attention_peers.py --out /tmp/attn.json && \\
  .device/gpu-check attention --peers /tmp/attn.json --out benches/results/varlen_attention.json --commit <sha> --date <date>
python3 benches/report.py > BENCHMARKS.md
```

Each subcommand with `--check-only` runs just the correctness checks; under
`compute-sanitizer --tool memcheck` and `--tool racecheck` they report no errors.
`benches/NOTES.md` keeps the two numbers, each version's figures and what limits it.
"""


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    print(HEADER)
    # GPU results; compile times live in results/compile/ and are rendered last.
    for path in sorted(glob.glob(os.path.join(HERE, "results", "*.json"))):
        r = json.load(open(path))
        name = os.path.splitext(os.path.basename(path))[0]
        print(f"## {name}\n")
        print(f"Device: {r.get('device')}, driver {r.get('driver')}, commit `{r.get('commit')}`, "
              f"{r.get('date')}. Device copy bandwidth in this run: {r.get('copy_gbps', 0):.0f} GB/s.\n")
        if r.get("selection"):
            print(r["selection"] + "\n")
        print("| case | ours (us) | peer | peer (us) | speedup | GB/s | of copy BW |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for c in r["cases"]:
            print(f"| {c['case']} | {c['ours_us']:.1f} | {c['peer']} | {fmt(c.get('peer_us'), '.1f')} | "
                  f"{fmt(c.get('speedup_vs_peer'), '.2f')}x | {c['gbps']:.0f} | {100 * c['frac_of_copy_bw']:.1f}% |")
        if r.get("command"):
            where = f" (run in the GPU machine's `{r['run_in']}`)" if r.get("run_in") else ""
            print(f"\nCommand{where}: `{r['command']}`")
        tuned = [c for c in r["cases"] if c.get("peer") == "default-config"]
        if tuned:
            print("\nTuned config (ours) against the default (peer), both checked against the reference "
                  "first; every config tried, same run:\n")
            for c in tuned:
                tried = ", ".join(
                    f"{t['label']}: " + (f"{t['us']:.1f} us" if t["status"] == "ok" else t["status"])
                    for t in c["trials"])
                print(f"- {c['case']}: tuned `{c['tuned_config']}`; {tried}")
        extra = [c for c in r["cases"] if c.get("other_tilings_us")]
        if extra:
            print("\nOther tilings, same run (spgemv: tokens per program x warps / programs per SM asked of "
                  "ptxas; attention: tokens a step x warps, bytes per thread and row, tiles prefetched, "
                  "programs per SM asked of ptxas, `mma` on the tensor cores, chunk tokens; the default's "
                  "two passes where it was timed twice):\n")
            for c in extra:
                tilings = ", ".join(f"{t['tiling']}: {t['us']:.1f} us" for t in c["other_tilings_us"])
                passes = c.get("default_passes_us")
                if passes:
                    tilings = (f"default ({c.get('tuning')}) passes {' / '.join(f'{p:.1f}' for p in passes)} us; "
                               + tilings)
                print(f"- {c['case']}: {tilings}")
        print()
    compile_times()
    dusk_compile()


def dusk_compile():
    path = os.path.join(HERE, "results", "compile", "dusk_compile.json")
    if not os.path.exists(path):
        return
    r = json.load(open(path))
    print("## dusk compile\n")
    print(f"`dusk compile` writing a bundle ({r['target']}) on the {r['machine']}, {r['date']}: "
          "first with an empty compile cache (`DUSK_CACHE_DIR=$(mktemp -d)`), then again (warm cache).\n")
    print("| bundle | command | cold (s) | warm (s) |")
    print("|---|---|---:|---:|")
    for x in r["runs"]:
        print(f"| {x['what']} | `{x['command']}` | {x['cold_s']:.2f} | {x['warm_s']:.2f} |")
    print()


def compile_times():
    runs = {}
    for name in ("cold", "warm"):
        path = os.path.join(HERE, "results", "compile", f"{name}.json")
        if os.path.exists(path):
            runs[name] = {k["kernel"]: k for k in json.load(open(path))["kernels"]}
    if not runs:
        return
    print("## Compile times\n")
    print("Source to PTX on the development machine (2 cores, no GPU), release build, target sm_90a:")
    print("building the IR, then `compile_cached` on an empty disk cache (LLVM runs) and again in a")
    print("second process (read from disk). Reproduce:\n")
    print("```sh\nexport DUSK_CACHE_DIR=$(mktemp -d)")
    print("cargo run --release -p dusk-bench --bin compile-times -- --out benches/results/compile/cold.json")
    print("cargo run --release -p dusk-bench --bin compile-times -- --out benches/results/compile/warm.json\n```\n")
    print("| kernel | build IR (ms) | LLVM to PTX (ms) | from disk cache (ms) |")
    print("|---|---:|---:|---:|")
    cold, warm = runs.get("cold", {}), runs.get("warm", {})
    for name, c in cold.items():
        w = warm.get(name, {})
        print(f"| {name} | {c['build_ir_ms']:.2f} | {c['to_ptx_ms']:.1f} | {fmt(w.get('to_ptx_ms'), '.2f')} |")
    print()


if __name__ == "__main__":
    main()
