#!/usr/bin/env bash
# Every kernel family measured on the GPU machine with the harness, ours and the peers in
# the same command (DESIGN.md section 6): each peer script (benches/baselines/, timed by
# harness.py) runs first, then `gpu-check <family>` reads its figures and writes the
# results (DESIGN.md section 8). Run from the repository root with `.device/` carried:
#   .device/gpu-check     ../shared/tools/device-stage --release -p dusk-bench --bin gpu-check
#   .device/whl/*.whl     ../shared/tools/device-wheels (FlashInfer 0.5.3)
#   .device/*-c, .device/libdusk_capi.so   for the `c` step: the C examples, built as
#                         examples/c/README.md says, with -o .device/<example>-c
#
#   OUT=$OUT bash benches/device_bench.sh COMMIT DATE STEP...
#
# STEP: `attention`, `spgemv`, `threshold` (p = 0.9 on diffuse rows), `focus` (the same on
# rows as focused as Twilight's, logits x 12), `selectors` (Quest, Double Sparsity, SparQ, the cache append),
# `pipeline` (the attention operator, Twilight's Figures 7 and 10: select, estimate, prune and
# attend on the synthetic batch beside FlashInfer's dense decode and FlashInfer decoding our
# Quest's pages; the seed in PIPELINE_SEED, default 1), `sanitize` (memcheck and racecheck over
# every family's checks), `c` (the C examples through the committed bundle). Extra gpu-check options for a family go in GPU_CHECK_<FAMILY>
# (e.g. GPU_CHECK_ATTENTION='--only dense_b1_ --sweep l2_prefetch=true').
# Writes into $OUT (at most 8 files come back): varlen_attention.json, spgemv.json,
# threshold_search.json, threshold_search_focus.json, selectors.json, pipeline.json, bench.log (every step's output),
# sanitize.log and c_examples.txt; prints a short summary last.
set -u
commit=${1:?commit} date=${2:?date}
shift 2
# What made the results: recorded in each results file (`run_by`).
export DUSK_BENCH_COMMAND="OUT=\$OUT bash benches/device_bench.sh $commit $date $*"
out=${OUT:?OUT names the folder whose files come back}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site MAX_JOBS=16 PYTHONUNBUFFERED=1
gc=.device/gpu-check
log="$out/bench.log"
peers=/tmp/dusk-peers
mkdir -p "$peers"
stamp=(--commit "$commit" --date "$date")

run_family() { # family, peer script, results file, extra peer args, extra gpu-check args
  local family=$1 script=$2 results=$3 peer_args=$4 extra=$5
  echo "== $family: peers ($script $peer_args)" >>"$log"
  # shellcheck disable=SC2086
  python3 "benches/baselines/$script" $peer_args --out "$peers/$family.json" >>"$log" 2>&1 ||
    echo "$family: the peer script failed (see bench.log)"
  echo "== $family: gpu-check $extra" >>"$log"
  # shellcheck disable=SC2086
  $gc "${family%%-*}" --peers "$peers/$family.json" --out "$out/$results" "${stamp[@]}" $extra >>"$log" 2>&1 ||
    echo "$family: gpu-check failed (see bench.log)"
}

for step in "$@"; do
  case $step in
    attention) run_family attention attention_peers.py varlen_attention.json "" "${GPU_CHECK_ATTENTION:-}" ;;
    spgemv) run_family spgemv spgemv_torch.py spgemv.json "" "${GPU_CHECK_SPGEMV:-}" ;;
    threshold) run_family threshold topp_peers.py threshold_search.json "" "--no-sweep ${GPU_CHECK_THRESHOLD:-}" ;;
    selectors)
      # The selection's share of a decode step needs FlashInfer's dense decode of the same
      # shapes: the attention peers' file, made here unless the attention step made it.
      [ -s "$peers/attention.json" ] ||
        python3 benches/baselines/attention_peers.py --no-sdpa --out "$peers/attention.json" >>"$log" 2>&1
      # Double Sparsity's and the cache append's PyTorch peers (their files beside the
      # Quest peers' file; their cases, ds_* and append_*, join the selectors' results).
      python3 benches/baselines/ds_peers.py --out "$peers/ds.json" >>"$log" 2>&1 ||
        echo "selectors: the DS peer script failed (see bench.log)"
      python3 benches/baselines/append_peers.py --out "$peers/append.json" >>"$log" 2>&1 ||
        echo "selectors: append_peers.py failed (see bench.log)"
      # SparQ's peer (its own script; gpu-check reads it beside Quest's).
      echo "== selectors: peers (sparq_peers.py)" >>"$log"
      python3 benches/baselines/sparq_peers.py --out "$peers/sparq.json" >>"$log" 2>&1 ||
        echo "selectors: the SparQ peer script failed (see bench.log)"
      sparq=""
      [ -s "$peers/sparq.json" ] && sparq="--sparq-peers $peers/sparq.json"
      run_family selectors quest_peers.py selectors.json "" \
        "--attention-peers $peers/attention.json --ds-peers $peers/ds.json --append-peers $peers/append.json $sparq ${GPU_CHECK_SELECTORS:-}" ;;
    pipeline)
      # Our Quest's pages on the synthetic batch first (the same seed in both runs gives the
      # same selection), then the peers decode exactly those pages, then the benchmark,
      # which checks that each peer case decoded this run's selection.
      seed="--seed ${PIPELINE_SEED:-1}"
      echo "== pipeline: gpu-check pipeline --pages-only $seed" >>"$log"
      # shellcheck disable=SC2086
      $gc pipeline --pages-only --pages-out "$peers/pages" $seed >>"$log" 2>&1 ||
        echo "pipeline: writing the pages failed (see bench.log)"
      run_family pipeline pipeline_peers.py pipeline.json "--pages $(echo "$peers"/pages/*.pages)" \
        "$seed ${GPU_CHECK_PIPELINE:-}" ;;
    focus) run_family threshold-focus topp_peers.py threshold_search_focus.json "--focus 12" "--no-sweep --focus 12 ${GPU_CHECK_THRESHOLD:-}" ;;
    sanitize)
      for tool in memcheck racecheck; do
        # SANITIZE_FAMILIES: a subset (e.g. "selectors pipeline"); by default every family.
        for family in ${SANITIZE_FAMILIES:-spgemv "threshold --rows 300" attention selectors pipeline}; do
          echo "== compute-sanitizer --tool $tool gpu-check $family --check-only" >>"$out/sanitize.log"
          # shellcheck disable=SC2086
          compute-sanitizer --tool $tool $gc $family --check-only 2>&1 | tail -4 >>"$out/sanitize.log"
        done
      done ;;
    c)
      for example in spgemv attention prune; do
        .device/$example-c kernels_gen/bundle >>"$out/c_examples.txt" 2>&1
        echo "$example-c: exit $?" | tee -a "$out/c_examples.txt"
      done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

# The summary: every case's ratio to its peer and fraction of the copy rate.
python3 - "$out" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(path))
    print(f"{os.path.basename(path)} (copy {r.get('copy_gbps', 0):.0f} GB/s)")
    for c in r.get("cases", []):
        if "case" not in c:
            continue  # not a gpu-check result (a host-time file written beside them)
        s = c.get("speedup_vs_peer")
        t = c.get("timing", {})
        print(f"  {c['case'][:52]:<52} {c['ours_us']:8.1f} us  {s if s is None else round(s, 3)!s:>6}x"
              f"  {100 * c.get('frac_of_copy_bw', 0):5.1f}%  {t.get('ours')}/{t.get('peer')}")
PY
if [ -f "$out/sanitize.log" ]; then
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$out/sanitize.log"
fi
