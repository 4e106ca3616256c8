#!/bin/bash
# GQA's top-p search split over the heads (branch gqa-split) beside main's (81f2a07) in one
# command: the attention operator at GQA 32/8 (new with the search sweep, main, new), then
# memcheck and racecheck over the pipeline's checks with the new binary.
#   OUT=$OUT bash .device/split/run.sh DATE
set -u
date=$1
xz -dc .device/split/gpu-check.xz > /tmp/gc-new; xz -dc .device/split/gpu-check-main.xz > /tmp/gc-main; chmod +x /tmp/gc-*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/split/run.sh $date"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
r() { timeout 120 /tmp/gc-$1 pipeline --heads 32x8 $3 --out $OUT/pipeline_$2.json --commit $2 --date $date > $OUT/pipeline_$2.log 2>&1; echo "$2 exit $? $(el)s"; grep -E "select|search alone|step" $OUT/pipeline_$2.log | grep -v "^correct" | cut -c1-200 | head -24; }
r new new1 --sweep; r main main ""; r new new2 ""
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool /tmp/gc-new pipeline --check-only > $OUT/$tool.log 2>&1; echo "$tool exit $? $(el)s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/$tool.log
done
