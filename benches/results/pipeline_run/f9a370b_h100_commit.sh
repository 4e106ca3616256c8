#!/bin/bash
# f9a370b's kernels (the chunked steps, the split union's shared words; HEAD's kernels):
# memcheck and racecheck over the pipeline checks (the words' barrier), the operator and the
# search's own benchmarks with their peers, then ncu's source counters of the GQA split
# search if time is left:   OUT=$OUT bash .device/s/commit.sh COMMIT DATE
set -u
xz -dc .device/bin/gpu-check-f9a.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool .device/gpu-check pipeline --check-only > /tmp/${tool}.log 2>&1; echo "$tool pipeline exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|all checks" /tmp/${tool}.log | tee -a $OUT/sanitize.log
done
for step in pipeline threshold focus; do
  timeout 150 bash benches/device_bench.sh $1 $2 $step >> $OUT/summary.log 2>&1; echo "$step exit $? $(el)s"
done
grep -E "quest_twilight" $OUT/bench.log | cut -c1-170 | head -4; grep -E "_vs_" $OUT/summary.log | cut -c1-120
if [ $(el) -lt 430 ]; then
  k=threshold_top_p_s1024_g4_w4_h_l2_x
  timeout 140 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight -k regex:$k \
    --launch-skip 100 --launch-count 1 -o /tmp/prof .device/gpu-check pipeline --batch 64 --heads 32x8 > $OUT/ncu.log 2>&1
  echo "ncu exit $? $(el)s"; grep -E "Duration|Throughput" $OUT/ncu.log | head -6
  ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>&1
  xz -T8 -6 -c /tmp/sass.csv > $OUT/sass_split.csv.xz
fi
