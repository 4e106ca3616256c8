#!/bin/bash
# Lead's last run of the session (OUT=$OUT bash .device/lead/final.sh COMMIT DATE):
# 1. the Python SparQ test (its step queued behind torch.cuda._sleep) on the wheel before
#    the copy fix (expected to fail), then test_gpu.py and memcheck on the wheel at COMMIT;
# 2. python/benches/host_overhead.py twice;
# 3. SparQ's scores with the staged rows prefetched (COMMIT) beside the binary without
#    (9e67bac, .device/defer), new / base / new; memcheck and racecheck over SparQ's checks.
set -u
commit=$1 date=$2
D=.device/lead; B=.device/defer; O=/tmp/final; mkdir -p $O
for x in $D/gpu-check $B/gpu-check; do xz -dkf $x.xz && chmod +x $x || exit 1; done
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site_old $D/old/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site $D/*.whl .device/whl/*.whl 2>&1 | tail -2
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd python/tests
 PYTHONPATH=/tmp/site_old timeout 60 python3 -m pytest -q test_gpu.py -k "token_selector" > $O/before_copy_fix.log 2>&1; echo "before the copy fix: exit $?"; tail -1 $O/before_copy_fix.log
 PYTHONPATH=/tmp/site timeout 100 python3 -m pytest -q test_gpu.py > $O/pytest_gpu.log 2>&1; echo "pytest exit $?"; tail -1 $O/pytest_gpu.log
 PYTHONPATH=/tmp/site timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q test_gpu.py -k "token_selector or device_table or planning_again" > $O/memcheck_py.log 2>&1; echo "memcheck py exit $?"; grep -E "passed|failed|ERROR SUMMARY" $O/memcheck_py.log | tail -2)
echo "python done $(el)s"
for i in 1 2; do PYTHONPATH=/tmp/site timeout 90 python3 python/benches/host_overhead.py --out $O/host_overhead_${commit}_$i.json --commit $commit > $O/host_$i.log 2>&1; echo "host $i exit $?"; grep "^summary" $O/host_$i.log; done
echo "host done $(el)s"
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/lead/final.sh $commit $date (gpu-check selectors --only sparq_b, new / base 9e67bac / new)"
timeout 50 $D/gpu-check selectors --only sparq_b --out $O/selectors_new1.json --commit $commit --date $date > $O/scores_new1.log 2>&1; echo "new1 exit $?"
timeout 50 $B/gpu-check selectors --only sparq_b --out $O/selectors_base.json --commit 9e67bac --date $date > $O/scores_base.log 2>&1; echo "base exit $?"
timeout 50 $D/gpu-check selectors --only sparq_b --out $O/selectors_new2.json --commit $commit --date $date > $O/scores_new2.log 2>&1; echo "new2 exit $?"
for f in new1 base new2; do echo "== $f"; grep -E "sparq_b.*select|scores tile 256 chunk 8" $O/scores_$f.log | cut -c1-150; done
echo "scores done $(el)s"
for tool in memcheck racecheck; do timeout 60 compute-sanitizer --tool $tool $D/gpu-check selectors --check-only --only sparq_ > $O/sanitize_$tool.log 2>&1; echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $O/sanitize_$tool.log; done
echo "all done $(el)s"
tar czf $OUT/final.tgz -C /tmp final
