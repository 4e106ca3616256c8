#!/usr/bin/env bash
# wt-defer, second run: SparQ's scores with the tiles taken from the last, beside main's
# binary (1892e79) in the same command, the SparQ appends again, and memcheck over SparQ's
# checks:  OUT=$OUT bash .device/defer/scores.sh COMMIT DATE
set -u
commit=$1 date=$2
D=.device/defer
for b in gpu-check gpu-check-base; do xz -d -f $D/$b.xz && chmod +x $D/$b || exit 1; done
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/defer/scores.sh $commit $date (gpu-check selectors --only sparq_b --only append_sparq_)"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== gpu-check selectors --only sparq_b --only append_sparq_" >$OUT/bench.log
timeout 45 $D/gpu-check selectors --only sparq_b --only append_sparq_ --out $OUT/selectors.json \
  --commit $commit --date $date >>$OUT/bench.log 2>&1 || echo "gpu-check failed"
echo "gpu-check done $(el)s"
echo "== main (1892e79): gpu-check selectors --only sparq_b" >$OUT/base.log
timeout 35 $D/gpu-check-base selectors --only sparq_b --out $OUT/base_selectors.json \
  --commit 1892e79 --date $date >>$OUT/base.log 2>&1 || echo "base gpu-check failed"
echo "base done $(el)s"
echo "== compute-sanitizer --tool memcheck gpu-check selectors --check-only --only sparq_" >$OUT/sanitize.log
timeout 25 compute-sanitizer --tool memcheck $D/gpu-check selectors --check-only --only sparq_ >>$OUT/sanitize.log 2>&1
echo "exit $?" >>$OUT/sanitize.log
echo "memcheck done $(el)s"
grep "append_sparq\|sparq_b\|scores tile\|blocks of\|copy:\|failed\|rror\|rows equal" $OUT/bench.log | head -40
echo "== base"
grep "sparq_b\|scores tile\|blocks of\|copy:" $OUT/base.log | head -30
grep -h "ERROR SUMMARY\|exit\|passed" $OUT/sanitize.log
