#!/bin/bash
# Every selector case again (the first run's selectors.json did not come back: more than 8
# files), then ncu's source counters of the GQA split top-p search at batch 64:
#   OUT=$OUT bash .device/s/sel.sh COMMIT DATE
set -u
xz -dc .device/bin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 250 bash benches/device_bench.sh $1 $2 selectors > $OUT/summary.log 2>&1; echo "selectors exit $? $(el)s"
tail -5 $OUT/summary.log
k=threshold_top_p_s1024_g4_w4_h_l2_x
timeout 200 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight -k regex:$k \
  --launch-skip 100 --launch-count 1 -o /tmp/prof .device/gpu-check pipeline --batch 64 --heads 32x8 > $OUT/ncu.log 2>&1
echo "ncu exit $? $(el)s"; grep -E "Duration|Throughput|Registers|Achieved Occ|Warp Cycles" $OUT/ncu.log | head -12
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>&1
xz -T8 -6 -c /tmp/sass.csv > $OUT/sass.csv.xz; ls -la $OUT
