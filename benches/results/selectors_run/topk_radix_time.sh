#!/usr/bin/env bash
# Not yet run. The radix top-k (branch topk-radix) beside the two-bits-a-pass one, in one
# binary: `gpu-check selectors --only sparq_b` times the top-k of each configuration over
# the same SparQ scores (`top_k_us_by_config` in the JSON: the default
# TopKConfig { tile: 4096, num_warps: 8, resident: false, radix: false } and the radix one),
# then memcheck and racecheck over the selectors' checks.
#   OUT=$OUT bash benches/results/selectors_run/topk_radix_time.sh COMMIT DATE   (gpu-check staged in .device/)
set -u
commit=$1 date=$2
timeout 120 .device/gpu-check selectors --only sparq_b --out $OUT/selectors.json --commit $commit --date $date > $OUT/bench.log 2>&1; echo "gpu-check $?"
grep -E "top-k|sparq_b" $OUT/bench.log | cut -c1-160
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool .device/gpu-check selectors --check-only --only sparq_ --only ds_ > $OUT/$tool.log 2>&1; echo "$tool $?"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/$tool.log
done
