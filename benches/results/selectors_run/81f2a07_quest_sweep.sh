#!/bin/bash
# Quest's selection with its other walks and top-k configurations (GQA cases), beside
# FlashInfer's dense decode in the same command:   OUT=$OUT bash .device/fin/quest.sh DATE
set -u
xz -dc .device/fin/gpu-check.xz > .device/gpu-check && chmod +x .device/gpu-check || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site MAX_JOBS=16 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/fin/quest.sh $1"
timeout 90 python3 benches/baselines/attention_peers.py --no-sdpa --out $OUT/attention_peers.json > $OUT/peers.log 2>&1; echo "attention peers $?"
timeout 200 .device/gpu-check selectors --only quest_ --attention-peers $OUT/attention_peers.json --out $OUT/quest.json --commit quest-sweep --date $1 > $OUT/quest.log 2>&1; echo "quest exit $?"
grep -E "^  quest_b|^    (score|top-k)" $OUT/quest.log | cut -c1-170
