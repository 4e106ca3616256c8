#!/usr/bin/env bash
# SparQ's decode append with each finished run's copy spread over the next run's steps
# (wt-defer): the append peers, gpu-check selectors --only sparq_ --only append_ with them,
# compute-sanitizer memcheck and racecheck over the checks, then (time allowing) main's
# binary (1892e79) on the SparQ score cases and the SparQ appends in the same command:
#   OUT=$OUT bash .device/defer/final.sh COMMIT DATE
set -u
commit=$1 date=$2
D=.device/defer
for b in gpu-check gpu-check-base; do xz -d -f $D/$b.xz && chmod +x $D/$b || exit 1; done
export PYTHONUNBUFFERED=1
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/defer/final.sh $commit $date (benches/device_bench.sh's selectors and sanitize steps for --only sparq_ --only append_)"
peers=/tmp/dusk-peers; mkdir -p $peers
log=$OUT/bench.log
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== selectors: peers (append_peers.py)" >>$log
timeout 50 python3 $D/baselines/append_peers.py --out $peers/append.json >>$log 2>&1 || echo "append_peers.py failed"
echo "append peers done $(el)s"
echo "== selectors: gpu-check --only sparq_ --only append_ --append-peers $peers/append.json" >>$log
timeout 130 $D/gpu-check selectors --only sparq_ --only append_ --append-peers $peers/append.json \
  --out $OUT/selectors.json --commit $commit --date $date >>$log 2>&1 || echo "gpu-check failed"
echo "gpu-check done $(el)s"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool gpu-check selectors --check-only --only sparq_ --only append_" >>$OUT/sanitize.log
  timeout 55 compute-sanitizer --tool $tool $D/gpu-check selectors --check-only --only sparq_ --only append_ >$OUT/$tool.full 2>&1
  echo "exit $?" >>$OUT/sanitize.log
  tail -6 $OUT/$tool.full >>$OUT/sanitize.log
  grep -c "equal" $OUT/$tool.full >>$OUT/sanitize.log
  rm -f $OUT/$tool.full
  echo "$tool done $(el)s"
done
if [ $(el) -lt 215 ]; then
  echo "== main (1892e79): gpu-check selectors --only sparq_b --only append_sparq_" >>$OUT/base.log
  timeout 50 $D/gpu-check-base selectors --only sparq_b --only append_sparq_ --out $OUT/base_selectors.json \
    --commit 1892e79 --date $date >>$OUT/base.log 2>&1 || echo "base gpu-check failed"
  echo "base done $(el)s"
fi
grep -v "equal to the host" $log | grep "append_sparq\|sparq_b\|scores tile\|blocks of\|device\|failed\|Error\|error\|Traceback\|rows equal\|AssertionError" | head -60
echo "== base"
grep "append_sparq\|sparq_b\|scores tile\|blocks of" $OUT/base.log | head -20
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rror\|exit" $OUT/sanitize.log | head
