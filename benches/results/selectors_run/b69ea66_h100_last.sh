#!/bin/bash
# verify.sh's sanitizers, then a run's host time with the wheel in .device/py2 (two
# processes), then on an H100 the selectors and the operator timed:
#   OUT=$OUT bash .device/s/last.sh COMMIT DATE
set -u
commit=$1 date=$2
xz -dc .device/bin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
for run in "memcheck pipeline" "racecheck pipeline" "memcheck selectors"; do
  tool=${run% *} fam=${run#* }
  timeout 110 compute-sanitizer --tool $tool .device/gpu-check $fam --check-only > $OUT/${tool}_$fam.log 2>&1; echo "$tool $fam exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|fused|MHA\)|all checks" $OUT/${tool}_$fam.log | cut -c1-150
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/py2/*.whl 2>&1 | grep -v WARNING | tail -2
(cd python/tests && PYTHONPATH=/tmp/site timeout 90 python3 -m pytest -q test_gpu.py > $OUT/py_gpu.log 2>&1; echo "pytest exit $? $(el)s"; tail -1 $OUT/py_gpu.log)
for i in 1 2; do
  PYTHONPATH=/tmp/site timeout 60 python3 python/benches/host_overhead.py --out $OUT/host_overhead_$i.json --commit $commit > $OUT/host_$i.log 2>&1; echo "host $i exit $? $(el)s"
  grep -E "AttentionPlan.run:|bare launch\)|dusk.data_ptr|torch's own" $OUT/host_$i.log | cut -c1-150
done
case $gpu in *H100*) BENCH_TIMEOUT=330 bash .device/s/time.sh "$commit" "$date" | tail -n +2 ;; esac
