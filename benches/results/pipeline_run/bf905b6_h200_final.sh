#!/bin/bash
# Lead's final check of merged main (bf905b6) on the GPU: gpu-check pipeline's checks (decode
# loops on a device table: Quest, Full + top-p, DS + top-p, SparQ with its mix; graph
# replays against eager steps), the Python GPU tests, memcheck over both, then the
# attention operator at GQA 32/8 batch 64 32k beside FlashInfer (dense, and our pages).
set -u
D=.device/lead
FINAL=${OUT:-/tmp/final}; O=/tmp/lead-final; mkdir -p "$O" "$FINAL"
xz -dkf "$D/gpu-check.xz" && chmod +x "$D/gpu-check"
if ldd "$D/gpu-check" | grep -q "not found"; then export LD_LIBRARY_PATH="$PWD/$D/lib"; fi
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site $D/*.whl .device/whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MAX_JOBS=16
timeout 120 "$D/gpu-check" pipeline --check-only > "$O/pipeline_check.log" 2>&1; echo "pipeline check exit $?"; grep -E "^  GQA|^  MHA|passed|FAIL|rror" "$O/pipeline_check.log" | cut -c1-150 | tail -9
(cd python/tests && timeout 120 python3 -m pytest -q test_gpu.py > "$O/pytest_gpu.log" 2>&1; echo "pytest exit $?"; tail -2 "$O/pytest_gpu.log")
timeout 150 compute-sanitizer --tool memcheck "$D/gpu-check" pipeline --replay-only > "$O/memcheck_replay.log" 2>&1; echo "memcheck replay exit $?"; tail -1 "$O/memcheck_replay.log"
(cd python/tests && timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q test_gpu.py -k "token_selector or device_table" > "$O/memcheck_py.log" 2>&1; echo "memcheck py exit $?"; grep -E "passed|failed|ERROR SUMMARY" "$O/memcheck_py.log" | tail -3)
tar czf "$FINAL/final.tgz" -C /tmp lead-final
P=/tmp/pages; mkdir -p $P
timeout 60 "$D/gpu-check" pipeline --pages-only --pages-out $P --seed 1 --batch 64 --heads 32x8 > "$O/pages.log" 2>&1; echo "pages exit $?"
timeout 90 python3 benches/baselines/pipeline_peers.py --only b64_h32x8 --pages $P/*.pages --out /tmp/peers.json > "$O/peers.log" 2>&1; echo "peers exit $?"
timeout 120 "$D/gpu-check" pipeline --peers /tmp/peers.json --out "$O/pipeline_gqa_b64_h200.json" --commit bf905b6 --date 2026-12-02 --seed 1 --batch 64 --heads 32x8 > "$O/bench.log" 2>&1; echo "bench exit $?"
tail -25 "$O/bench.log" | cut -c1-160
tar czf "$FINAL/final.tgz" -C /tmp lead-final
