#!/usr/bin/env bash
# SparQ's scores and appends (wt-sparqm): device_bench.sh's selectors step for --only sparq_
# --only append_ with both peers, then the sanitize step over the checks, then (time allowing)
# main's binary (b91c7eb: SparQ's kernels as at 8ef026d) on the same SparQ cases:
#   OUT=$OUT bash .device/sparqm/final.sh COMMIT DATE
set -u
commit=$1 date=$2
D=.device/sparqm
for b in gpu-check gpu-check-base; do xz -d -f $D/$b.xz && chmod +x $D/$b || exit 1; done
export PYTHONUNBUFFERED=1
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/sparqm/final.sh $commit $date (benches/device_bench.sh's selectors and sanitize steps for --only sparq_ --only append_)"
peers=/tmp/dusk-peers; mkdir -p $peers
log=$OUT/bench.log
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== selectors: peers (sparq_peers.py)" >>$log
timeout 75 python3 $D/baselines/sparq_peers.py --out $peers/sparq.json >>$log 2>&1 || echo "sparq_peers.py failed"
echo "sparq peers done $(el)s"
echo "== selectors: peers (append_peers.py)" >>$log
timeout 60 python3 $D/baselines/append_peers.py --out $peers/append.json >>$log 2>&1 || echo "append_peers.py failed"
echo "append peers done $(el)s"
echo "== selectors: gpu-check --only sparq_ --only append_ --sparq-peers $peers/sparq.json --append-peers $peers/append.json" >>$log
timeout 170 $D/gpu-check selectors --only sparq_ --only append_ --sparq-peers $peers/sparq.json --append-peers $peers/append.json \
  --out $OUT/selectors.json --commit $commit --date $date >>$log 2>&1 || echo "gpu-check failed"
echo "gpu-check done $(el)s"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool gpu-check selectors --check-only --only sparq_ --only append_" >>$OUT/sanitize.log
  timeout 80 compute-sanitizer --tool $tool $D/gpu-check selectors --check-only --only sparq_ --only append_ 2>&1 | tail -6 >>$OUT/sanitize.log
  echo "$tool done $(el)s"
done
if [ $(el) -lt 250 ]; then
  echo "== main (b91c7eb): gpu-check selectors --only sparq_ --only append_sparq_" >>$OUT/base.log
  timeout 75 $D/gpu-check-base selectors --only sparq_ --only append_sparq_ --out $OUT/base_selectors.json \
    --commit b91c7eb --date $date >>$OUT/base.log 2>&1 || echo "base gpu-check failed"
  echo "base done $(el)s"
fi
grep -v "equal to the host" $log | grep "append_sparq\|sparq_b\|scores tile\|device\|failed\|Error\|error\|Traceback\|rows equal" | head -60
echo "== base"
grep "append_sparq\|sparq_b\|scores tile" $OUT/base.log | head -20
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rror" $OUT/sanitize.log | head
