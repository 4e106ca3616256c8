#!/bin/bash
# Quest's selection, the pipelined tiles (COMMIT) beside 6664b2d's one-tile kernel in one
# command: new / base / new, then memcheck over the selectors' Quest checks.
#   OUT=$OUT bash .device/sel/quest.sh COMMIT DATE
set -u
commit=$1 date=$2
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/sel/quest.sh $commit $date (gpu-check selectors --only quest_, new / base 6664b2d / new)"
xz -dc .device/sel/gpu-check-new.xz > /tmp/gc-new && xz -dc .device/sel/gpu-check.xz > /tmp/gc-base && chmod +x /tmp/gc-new /tmp/gc-base || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 40 /tmp/gc-new selectors --only quest_ --out $OUT/quest_new1.json --commit $commit --date $date > $OUT/quest_new1.log 2>&1; echo "new1 $?"
timeout 40 /tmp/gc-base selectors --only quest_ --out $OUT/quest_base.json --commit 6664b2d --date $date > $OUT/quest_base.log 2>&1; echo "base $?"
timeout 40 /tmp/gc-new selectors --only quest_ --out $OUT/quest_new2.json --commit $commit --date $date > $OUT/quest_new2.log 2>&1; echo "new2 $?"
for f in new1 base new2; do echo "== $f"; grep -E "^  quest_b" $OUT/quest_$f.log | cut -c1-140; done
grep -E "quest|rows equal|pages equal" $OUT/quest_new1.log | grep -v "^  quest_b" | head -6
timeout 40 compute-sanitizer --tool memcheck /tmp/gc-new selectors --check-only --only quest_ > $OUT/memcheck.log 2>&1; echo "memcheck $?"; grep "ERROR SUMMARY" $OUT/memcheck.log
