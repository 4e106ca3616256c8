#!/bin/sh
# Varlen attention on the GPU machine in one command: sanitizers over every GPU check, the
# C example through the bundle, the peers, the benchmark (with the tilings to sweep beside
# the defaults), and ncu on the skewed case. Run from the repository root with `.device/`
# carried, holding:
#   .device/gpu-check                      ../shared/tools/device-stage --release -p dusk-bench --bin gpu-check
#   .device/whl/*.whl                      ../shared/tools/device-wheels (FlashInfer)
#   .device/attention-c, .device/prune-c,  optional: cargo build --release -p dusk-capi, then the
#   libdusk_capi.so                        gcc lines of examples/c/README.md with -o .device/<name>
# Usage: benches/device_attention.sh COMMIT DATE [TILINGS]
#   TILINGS: the list tilings to time beside the defaults (gpu-check --sweep-lists),
#   default: the split merging rows (groups of 8 pieces, and of 4), also with row starts
#   counted as 32 entries and with segments of at least 128 entries (fewer pieces).
# Writes into $OUT (at most 8 files come back): bench.log, varlen_attention.json,
# peers.json, memcheck_tail.log, racecheck_tail.log, c_example.txt, ncu_skewed.log.
set -u
commit=$1
date=$2
tilings=${3:-8x1j1,8x1j1k4,8x1j1h32,8x1j1c128}
out=${OUT:?OUT names the folder whose files come back}
root=$(pwd)

python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl
export PYTHONPATH=/tmp/site MAX_JOBS=16 PYTHONUNBUFFERED=1

cd .device
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool ./gpu-check attention --check-only 2>&1 | tail -40 >"$out/${tool}_tail.log"
done
for example in attention-c prune-c; do
  if [ -x ./$example ]; then
    ./$example "$root/kernels_gen/bundle" >>"$out/c_example.txt" 2>&1
    echo "$example: exit $?" >>"$out/c_example.txt"
  fi
done
python3 "$root/benches/baselines/attention_peers.py" --out "$out/peers.json" >/dev/null 2>&1
./gpu-check attention --peers "$out/peers.json" --out "$out/varlen_attention.json" \
  --commit "$commit" --date "$date" --sweep-lists "$tilings" >"$out/bench.log" 2>&1
ncu --clock-control none --kernel-name regex:attn_ --launch-skip 20 --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy \
  ./gpu-check attention --profile-skewed >"$out/ncu_skewed.log" 2>&1
grep -E "skewed|quarter|graph replay|checks passed" "$out/bench.log"
tail -n 3 "$out/memcheck_tail.log" "$out/racecheck_tail.log"
