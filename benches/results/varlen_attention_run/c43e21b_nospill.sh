#!/bin/bash
# One command, in order of what it decides (each part guarded by the time left):
# (1) GQA dense attention with the queries in shared memory under the register cap
#     (branch attn-nospill, c43e21b) against main's binary (b369448), alternated, ours only;
# (2) the split union unrolled (split-unroll, 2678068) against main: the search alone at
#     GQA batch 64 (`pipeline --sweep`);
# (3) the operator's benchmark with main's binary (pipeline.json);
# (4) the sanitizers over the changed kernels' checks.
#   OUT=$OUT bash .device/s/full2.sh b369448 2026-12-07
set -u
for b in main nospill unroll; do
  f=.device/bin/gpu-check-$b.xz; [ $b = unroll ] && f=.device/bin/gpu-check.xz
  xz -dc $f > /tmp/gc-$b && chmod +x /tmp/gc-$b || exit 1
done
cp /tmp/gc-main .device/gpu-check
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
for i in 1 2; do for b in main nospill; do
  timeout 70 /tmp/gc-$b attention --only dense_b32_h32x8 --only dense_b64_h32x8 --only quarter_b32_h32x8 --seed 1 > $OUT/attn_${b}_$i.log 2>&1
  echo "attention $b $i exit $? $(el)s"; grep -E "^  (dense|quarter)_.*copy" $OUT/attn_${b}_$i.log | cut -c1-110
done; done
for b in unroll main; do
  timeout 85 /tmp/gc-$b pipeline --batch 64 --heads 32x8 --sweep --seed 1 >> $OUT/sweep.log 2>&1; echo "$b b64 sweep exit $? $(el)s"
  grep -E "quest_twilight|search alone" $OUT/sweep.log | tail -8 | cut -c1-150
done
timeout 170 bash benches/device_bench.sh $1 $2 pipeline > $OUT/summary.log 2>&1; echo "pipeline exit $? $(el)s"
grep -E "quest_twilight " $OUT/bench.log | cut -c1-170 | head -4; grep -E "_vs_" $OUT/summary.log | cut -c1-120
for tool in memcheck racecheck; do
  [ $(el) -lt 480 ] || break
  timeout 60 compute-sanitizer --tool $tool /tmp/gc-nospill attention --check-only > /tmp/a_$tool.log 2>&1; echo "$tool attention nospill exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|all checks|passed" /tmp/a_$tool.log | tail -3 | tee -a $OUT/sanitize.log
  timeout 50 compute-sanitizer --tool $tool /tmp/gc-unroll pipeline --check-only > /tmp/p_$tool.log 2>&1; echo "$tool pipeline unroll exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|all checks" /tmp/p_$tool.log | tail -3 | tee -a $OUT/sanitize.log
done
