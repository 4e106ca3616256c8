#!/bin/bash
# Sanitizers over the selectors' and the pipeline's checks, then the Python GPU tests with
# the wheel of COMMIT:   OUT=$OUT bash .device/fin/check.sh
set -u
xz -dc .device/fin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
for tool in memcheck racecheck; do for fam in selectors pipeline; do
  timeout 120 compute-sanitizer --tool $tool .device/gpu-check $fam --check-only > $OUT/${tool}_$fam.log 2>&1; echo "$tool $fam exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/${tool}_$fam.log
done; done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/fin/*.whl .device/whl/*.whl 2>&1 | tail -2
cd python/tests && PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q test_gpu.py > $OUT/py_gpu.log 2>&1; echo "pytest exit $? $(el)s"; tail -2 $OUT/py_gpu.log
