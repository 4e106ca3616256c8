#!/usr/bin/env bash
# The threshold search's GPU check, peers and benchmark in one device command (issue 4):
# memcheck and racecheck on the oracle check, the peers (FlashInfer, torch, Triton), then
# `gpu-check threshold` with the sweep, then ncu on the default search at 8192 candidates
# with and without the histogram. Results and logs go to $OUT.
#
#   OUT=$OUT bash benches/device_threshold.sh COMMIT DATE [quick|sweep]
#
# `quick`: the defaults only (no sweep, no ncu); `sweep`: the defaults and the sweep, no ncu.
# `focus F` (then `quick`): only the peers and the defaults, on logits times F (12: rows as
# focused as attention, ~2% kept at 32768), into threshold_search_focus.json; no sanitizers.
#
# Carry `.device` with `gpu-check` (../shared/tools/device-stage --release -p dusk-bench
# --bin gpu-check) and FlashInfer's wheels in .device/whl (../shared/tools/device-wheels);
# optional: `.device/prune-c` and `libdusk_capi.so` (cargo build --release -p dusk-capi,
# then examples/c/README.md's gcc line with -o .device/prune-c).
set -u
commit=${1:?commit} date=${2:?date} mode=${3:-}
focus=1 suffix=
if [ "$mode" = focus ]; then focus=${4:?focus F}; suffix=_focus; mode=quick; fi
quick=; [ "$mode" = quick ] && quick=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
cd .device
if [ -z "$suffix" ]; then
  compute-sanitizer --tool memcheck ./gpu-check threshold --check-only --rows 300 2>&1 | tail -3
  compute-sanitizer --tool racecheck ./gpu-check threshold --check-only --rows 120 2>&1 | tail -2
fi
if [ -z "$suffix" ] && [ -x ./prune-c ]; then
  ./prune-c ../kernels_gen/bundle > "$OUT/prune_c.txt" 2>&1; echo "prune-c: exit $?" | tee -a "$OUT/prune_c.txt"
  tail -2 "$OUT/prune_c.txt"
fi
python3 ../benches/baselines/topp_peers.py --focus "$focus" --out "$OUT/topp$suffix.json" > "$OUT/peers$suffix.log" 2>&1
tail -4 "$OUT/peers$suffix.log" | cut -c1-300
./gpu-check threshold --focus "$focus" --peer "$OUT/topp$suffix.json" --out "$OUT/threshold_search$suffix.json" \
  --commit "$commit" --date "$date" ${quick:+--no-sweep} > "$OUT/bench$suffix.log" 2>&1
grep -v '^ \|^{\|^}' "$OUT/bench$suffix.log" | head -12
for n in 8192 32768 4096; do
  echo "fastest at $n:"
  awk "/x $n:/{f=1;next} /top-p/{f=0} f" "$OUT/bench$suffix.log" | sort -t: -k2 -n | head -6
done
[ -n "$mode" ] && exit 0
for h in "" --no-histogram; do
  timeout 150 ncu --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --section InstructionStats -k regex:threshold --launch-skip 4 \
    --launch-count 2 ./gpu-check threshold --profile 8192 $h > "$OUT/ncu8k$h.log" 2>&1
  grep -E "threshold_|Duration|Achieved Occupancy|Block Limit Sh|Block Limit Reg|Warp Cycles Per Issued|Executed Instructions  " "$OUT/ncu8k$h.log"
done
