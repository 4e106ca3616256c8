#!/bin/bash
# SparQ's score walking tiles (working tree) beside main's one-tile kernel (the topk-radix
# binary, 9742301) in one command: new / old / new, `gpu-check selectors --only sparq_b`.
#   OUT=$OUT bash .device/walk/run.sh DATE
set -u
date=$1
xz -dc .device/walk/gpu-check.xz > /tmp/gc-new; xz -dc .device/topk/gpu-check.xz > /tmp/gc-old; chmod +x /tmp/gc-*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/walk/run.sh $date"
r() { timeout 150 /tmp/gc-$1 selectors --only sparq_b --out $OUT/sparq_$2.json --commit $3 --date $date > $OUT/sparq_$2.log 2>&1; echo "$2 $?"; grep -E "sparq_b|scores tile" $OUT/sparq_$2.log | cut -c1-150; }
r new new1 walk; r old old 9742301; r new new2 walk
timeout 60 compute-sanitizer --tool memcheck /tmp/gc-new selectors --check-only --only sparq_ > $OUT/memcheck.log 2>&1; echo "memcheck $?"; grep "ERROR SUMMARY" $OUT/memcheck.log
