#!/bin/bash
# The search's steps in chunks (an ended search skips the rest): the threshold checks, the
# attention operator with its peers, then memcheck and racecheck over the pipeline checks:
#   OUT=$OUT bash .device/s/steps.sh COMMIT DATE
set -u
xz -dc .device/bin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 60 .device/gpu-check threshold --check-only --rows 2000 > $OUT/threshold_check.log 2>&1; echo "threshold check exit $? $(el)s"; tail -2 $OUT/threshold_check.log
timeout 170 bash benches/device_bench.sh $1 $2 pipeline > $OUT/summary.log 2>&1; echo "pipeline exit $? $(el)s"
grep -E "quest_twilight|two launches" $OUT/bench.log | cut -c1-160 | head -20; grep -E "_vs_" $OUT/summary.log | cut -c1-120
for tool in memcheck racecheck; do
  timeout 80 compute-sanitizer --tool $tool .device/gpu-check pipeline --check-only > $OUT/${tool}_pipeline.log 2>&1; echo "$tool pipeline exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|all checks" $OUT/${tool}_pipeline.log
done
# The same step before the change (the binary of b75f19f's kernels), batch 64, no peers:
xz -dc .device/bin/gpu-check-old.xz > /tmp/gpu-check-old && chmod +x /tmp/gpu-check-old
timeout 90 /tmp/gpu-check-old pipeline --batch 64 --seed 1 > $OUT/old_pipeline.log 2>&1; echo "old pipeline exit $? $(el)s"
grep -E "quest_twilight|two launches" $OUT/old_pipeline.log | cut -c1-160
