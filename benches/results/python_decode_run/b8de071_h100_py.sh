#!/bin/bash
# The model's decode step (python_decode.json) and a run's host time, with the wheel of
# COMMIT and FlashInfer 0.5.3:   OUT=$OUT bash .device/s/py.sh COMMIT DATE
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/py/*.whl .device/whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/site
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 420 python3 python/benches/llama_decode.py --out $OUT/python_decode.json --commit $1 --date $2 > $OUT/decode.log 2>&1; echo "decode exit $? $(el)s"
grep -E "us a step|max \|logits|budgets|replayed" $OUT/decode.log | cut -c1-160
timeout 150 python3 python/benches/host_overhead.py --out $OUT/host_overhead.json --commit $1 > $OUT/host.log 2>&1; echo "host exit $? $(el)s"
grep -E "AttentionPlan.run:|GPU time of AttentionPlan.run, default|under|NOT" $OUT/host.log | cut -c1-160
