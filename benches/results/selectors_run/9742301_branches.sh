#!/bin/bash
# Three branches on the GPU in one command:
#  1. Quest's score: quest-tiles (2060f8a) / main's one-tile kernel (topk-radix's binary, same
#     Quest as 6664b2d) / quest-tiles without the L2 prefetch / quest-tiles again; memcheck.
#  2. topk-radix (9742301): gpu-check selectors --only sparq_b (top_k_us_by_config), memcheck, racecheck.
#  3. py-drop-order (89ae8ad): test_gpu.py, memcheck over the ordering tests.
#   OUT=$OUT bash .device/combo.sh DATE
set -u
date=$1
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in new nopf; do xz -dc .device/sel/gpu-check-$b.xz > /tmp/gc-$b; done
xz -dc .device/topk/gpu-check.xz > /tmp/gc-topk; chmod +x /tmp/gc-*
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/combo.sh $date"
q() { timeout 40 /tmp/gc-$1 selectors --only quest_ --out $OUT/quest_$2.json --commit $3 --date $date > $OUT/quest_$2.log 2>&1; echo "quest $2 $? $(el)s"; }
q new new1 2060f8a; q topk base 9742301; q nopf nopf 2060f8a-nopf; q new new2 2060f8a
for f in new1 base nopf new2; do echo "== $f"; grep -E "^  quest_b" $OUT/quest_$f.log | cut -c1-150; done
grep -E "rows equal|pages equal" $OUT/quest_new1.log | head -4
timeout 40 compute-sanitizer --tool memcheck /tmp/gc-new selectors --check-only --only quest_ > $OUT/quest_memcheck.log 2>&1; echo "quest memcheck $?"; grep "ERROR SUMMARY" $OUT/quest_memcheck.log
timeout 40 compute-sanitizer --tool memcheck /tmp/gc-nopf selectors --check-only --only quest_ > $OUT/quest_nopf_memcheck.log 2>&1; echo "quest nopf memcheck $?"; grep "ERROR SUMMARY" $OUT/quest_nopf_memcheck.log
echo "== topk-radix $(el)s"
timeout 120 /tmp/gc-topk selectors --only sparq_b --out $OUT/topk_selectors.json --commit 9742301 --date $date > $OUT/topk_bench.log 2>&1; echo "topk gpu-check $? $(el)s"
grep -E "top-k|sparq_b" $OUT/topk_bench.log | cut -c1-170
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool /tmp/gc-topk selectors --check-only --only sparq_ --only ds_ > $OUT/topk_$tool.log 2>&1; echo "topk $tool $? $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/topk_$tool.log
done
echo "== py-drop-order $(el)s"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/pyd/*.whl .device/whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cp .device/pyd/test_gpu.py python/tests/test_gpu.py; cd python/tests
timeout 150 python3 -m pytest -q test_gpu.py > $OUT/py_gpu.log 2>&1; echo "pytest $? $(el)s"; tail -3 $OUT/py_gpu.log
timeout 200 compute-sanitizer --tool memcheck python3 -m pytest -q test_gpu.py -k "dropping or planning_again or token_selector" > $OUT/py_memcheck.log 2>&1; echo "py memcheck $? $(el)s"; grep -E "passed|failed|ERROR SUMMARY" $OUT/py_memcheck.log | tail -3
