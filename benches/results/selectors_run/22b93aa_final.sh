#!/usr/bin/env bash
# SparQ's and the append's parts of device_bench.sh's `selectors` step, then its `sanitize`
# step over the same checks:  OUT=$OUT bash .device/sparq/final.sh COMMIT DATE
set -u
commit=$1 date=$2
D=.device/sparq
xz -d -f $D/gpu-check.xz && chmod +x $D/gpu-check || exit 1
export PYTHONUNBUFFERED=1
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/sparq/final.sh $commit $date (benches/device_bench.sh's selectors and sanitize steps for --only sparq_ --only append_)"
peers=/tmp/dusk-peers; mkdir -p $peers
log=$OUT/bench.log
t0=$(date +%s)
echo "== selectors: peers (sparq_peers.py)" >>$log
python3 $D/baselines/sparq_peers.py --out $peers/sparq.json >>$log 2>&1 || echo "sparq_peers.py failed"
echo "== selectors: peers (append_peers.py)" >>$log
python3 $D/baselines/append_peers.py --out $peers/append.json >>$log 2>&1 || echo "append_peers.py failed"
echo "peers done $(( $(date +%s) - t0 ))s"
echo "== selectors: gpu-check --only sparq_ --only append_ --sparq-peers $peers/sparq.json --append-peers $peers/append.json" >>$log
$D/gpu-check selectors --only sparq_ --only append_ --sparq-peers $peers/sparq.json --append-peers $peers/append.json \
  --out $OUT/selectors.json --commit $commit --date $date >>$log 2>&1 || echo "gpu-check failed"
echo "gpu-check done $(( $(date +%s) - t0 ))s"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool gpu-check selectors --check-only --only sparq_ --only append_" >>$OUT/sanitize.log
  timeout 240 compute-sanitizer --tool $tool $D/gpu-check selectors --check-only --only sparq_ --only append_ 2>&1 | tail -6 >>$OUT/sanitize.log
  echo "$tool done $(( $(date +%s) - t0 ))s"
done
grep -v "equal to the host" $log | grep "^  \|^    \|device\|rc\|failed\|Error\|error" | head -80
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/sanitize.log
