#!/bin/bash
# Lead's verification of main on the GPU (2026-12-02): Python GPU tests, pipeline checks,
# host time of a run (twice), the main job (examples/twilight) at its GPU defaults.
set -u
D=.device/lead
FINAL=${OUT:-/tmp/final}; OUT=/tmp/lead-out; mkdir -p "$OUT" "$FINAL"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in twilight gpu-check; do xz -dkf "$D/$b.xz" && chmod +x "$D/$b"; done
if ldd "$D/twilight" | grep -q "not found"; then export LD_LIBRARY_PATH="$PWD/$D/lib"; fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/*.whl .device/whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
(cd python/tests && timeout 240 python3 -m pytest -q -x test_gpu.py 2>&1 | tail -6) | tee "$OUT/pytest_gpu.log"
timeout 120 "$D/gpu-check" pipeline --check-only 2>&1 | tail -25 > "$OUT/pipeline_check.log"; echo "pipeline check exit ${PIPESTATUS[0]}"; tail -4 "$OUT/pipeline_check.log"
for i in 1 2; do timeout 90 python3 python/benches/host_overhead.py --out "$OUT/host_overhead_$i.json" --commit 8ef026d > "$OUT/host_overhead_$i.log" 2>&1; echo "host $i exit $?"; done
export DUSK_CACHE_DIR=/tmp/lead-dusk-cache CUDA_CACHE_PATH=/tmp/lead-cuda-cache
TIMEFORMAT="wall %R s, user %U s, sys %S s"
{ time timeout 200 "$D/twilight" --out "$OUT/twilight" --bundle kernels_gen/bundle; } > "$OUT/twilight_cold.log" 2>&1
echo "cold: exit $?"
{ time timeout 120 "$D/twilight" --out /tmp/twilight-warm --bundle kernels_gen/bundle; } > "$OUT/twilight_warm.log" 2>&1
echo "warm: exit $?"
grep -E "^\| |^(PASS|FAIL):|FAIL" "$OUT/twilight_cold.log" | cut -c1-150 | head -40
for r in cold warm; do echo "== $r"; grep -E "^backend|^time:|^\(|^wall" "$OUT/twilight_$r.log"; done
for i in 1 2; do grep -iE "run|target|us" "$OUT/host_overhead_$i.log" | tail -8; done
tar czf "$FINAL/all.tgz" -C /tmp lead-out
