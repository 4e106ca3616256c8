#!/bin/bash
# Sanitizers over the selectors' and the pipeline's checks, the Python GPU tests with the
# wheel of this commit, and the SparQ pipeline test under memcheck:
#   OUT=$OUT bash .device/s/check.sh
set -u
xz -dc .device/bin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
for tool in memcheck racecheck; do for fam in pipeline selectors; do
  timeout 110 compute-sanitizer --tool $tool .device/gpu-check $fam --check-only > $OUT/${tool}_$fam.log 2>&1; echo "$tool $fam exit $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/${tool}_$fam.log
done; done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/py/*.whl .device/whl/*.whl 2>&1 | tail -2
cd python/tests && PYTHONPATH=/tmp/site timeout 100 python3 -m pytest -q test_gpu.py > $OUT/py_gpu.log 2>&1; echo "pytest exit $? $(el)s"; tail -2 $OUT/py_gpu.log
PYTHONPATH=/tmp/site timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q test_gpu.py -k "token_selector" > $OUT/py_memcheck.log 2>&1; echo "py memcheck exit $? $(el)s"; tail -4 $OUT/py_memcheck.log
