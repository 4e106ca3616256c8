#!/bin/bash
# Every selector case and the attention operator, ours and the peers in one command
# (benches/device_bench.sh's selectors and pipeline steps), at COMMIT:
#   OUT=$OUT bash .device/s/time.sh COMMIT DATE
set -u
xz -dc .device/bin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-570} bash benches/device_bench.sh $1 $2 selectors pipeline; echo "device_bench exit $? after $(( $(date +%s) - t0 )) s"
grep -E "^  (quest|ds|sparq|append)_b.*:|^  pipeline_|top-k|fused|two launches" $OUT/bench.log | cut -c1-190 | head -80
