#!/usr/bin/env bash
# The append's and SparQ's parts of device_bench.sh's `selectors` step (no sparq_peers.py:
# the session's device time), the same SparQ cases by the base's binary (bc74490, before
# this branch) on the same device, then the `sanitize` step over the checks:
#   OUT=$OUT bash .device/append/final.sh COMMIT DATE
set -u
commit=$1 date=$2
D=.device/append
for b in gpu-check gpu-check-base; do xz -d -f $D/$b.xz && chmod +x $D/$b || exit 1; done
export PYTHONUNBUFFERED=1
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/append/final.sh $commit $date (benches/device_bench.sh's selectors and sanitize steps for --only sparq_ --only append_, without sparq_peers.py)"
peers=/tmp/dusk-peers; mkdir -p $peers
log=$OUT/bench.log
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== selectors: peers (append_peers.py)" >>$log
python3 $D/baselines/append_peers.py --out $peers/append.json >>$log 2>&1 || echo "append_peers.py failed"
echo "peers done $(( $(date +%s) - t0 ))s"
echo "== selectors: gpu-check --only sparq_ --only append_ --append-peers $peers/append.json" >>$log
$D/gpu-check selectors --only sparq_ --only append_ --append-peers $peers/append.json \
  --out $OUT/selectors.json --commit $commit --date $date >>$log 2>&1 || echo "gpu-check failed"
echo "gpu-check done $(( $(date +%s) - t0 ))s"
echo "== the base (bc74490): gpu-check selectors --only sparq_ --only append_sparq_" >>$OUT/base.log
$D/gpu-check-base selectors --only sparq_ --only append_sparq_ --out $OUT/base_selectors.json \
  --commit bc74490 --date $date >>$OUT/base.log 2>&1 || echo "base gpu-check failed"
echo "base done $(( $(date +%s) - t0 ))s"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool gpu-check selectors --check-only --only sparq_ --only append_" >>$OUT/sanitize.log
  timeout 90 compute-sanitizer --tool $tool $D/gpu-check selectors --check-only --only sparq_ --only append_ 2>&1 | tail -6 >>$OUT/sanitize.log
  echo "$tool done $(( $(date +%s) - t0 ))s"
done
grep -v "equal to the host" $log | grep "append_sparq\|sparq_b\|device\|failed\|Error\|error\|Traceback\|assert\|rows equal" | head -40
echo "== base"
grep "append_sparq\|sparq_b\|scores tile\|device" $OUT/base.log | head -30
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rror" $OUT/sanitize.log | head
