#!/bin/bash
# The search's chunked steps (0595960), then GQA's union from marks (HEAD): threshold checks,
# the attention operator with its peers, memcheck and racecheck over the pipeline checks, and
# the step at batch 64 with the binaries before (b75f19f's kernels; f9a370b's, the chunked
# steps and the shared words) in the same command:
#   OUT=$OUT bash .device/s/marks.sh COMMIT DATE
set -u
for b in gpu-check gpu-check-f9a gpu-check-old; do
  xz -dc .device/bin/$b.xz > /tmp/$b && chmod +x /tmp/$b || exit 1
done
cp /tmp/gpu-check .device/gpu-check
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 60 .device/gpu-check threshold --check-only --rows 2000 > $OUT/threshold_check.log 2>&1; echo "threshold check exit $? $(el)s"; tail -2 $OUT/threshold_check.log
timeout 170 bash benches/device_bench.sh $1 $2 pipeline > $OUT/summary.log 2>&1; echo "pipeline exit $? $(el)s"
grep -E "quest_twilight|two launches" $OUT/bench.log | cut -c1-170 | head -20; grep -E "_vs_" $OUT/summary.log | cut -c1-120
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool .device/gpu-check pipeline --check-only > $OUT/${tool}_pipeline.log 2>&1; echo "$tool pipeline exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|all checks" $OUT/${tool}_pipeline.log
done
for b in gpu-check-f9a gpu-check-old; do
  timeout 100 /tmp/$b pipeline --batch 64 --seed 1 > $OUT/${b}_pipeline.log 2>&1; echo "$b pipeline exit $? $(el)s"
  grep -E "quest_twilight|two launches" $OUT/${b}_pipeline.log | cut -c1-170
done
