#!/bin/bash
# The attention operator with its peers (benches/device_bench.sh's pipeline step) at COMMIT,
# then memcheck and racecheck over the pipeline's checks:
#   OUT=$OUT bash .device/split/final.sh COMMIT DATE
set -u
xz -dc .device/split/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 200 bash benches/device_bench.sh $1 $2 pipeline; echo "device_bench exit $? after $(( $(date +%s) - t0 )) s"
grep -E "quest_twilight  budgets|search alone" $OUT/bench.log | cut -c1-150
timeout 45 compute-sanitizer --tool memcheck .device/gpu-check pipeline --check-only > $OUT/memcheck.log 2>&1; echo "memcheck $?"; grep "ERROR SUMMARY" $OUT/memcheck.log
