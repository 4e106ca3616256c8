#!/bin/bash
# Every selector case in one command on the GPU machine (benches/device_bench.sh's
# selectors step, without sparq_peers.py for the device time; each step under a timeout):
#   OUT=$OUT bash .device/sel/run.sh COMMIT DATE
set -u
commit=$1 date=$2
export DUSK_BENCH_COMMAND="OUT=\$OUT bash .device/sel/run.sh $commit $date (benches/device_bench.sh's selectors step without sparq_peers.py)"
xz -dc .device/sel/gpu-check.xz > /tmp/gpu-check && chmod +x /tmp/gpu-check || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site MAX_JOBS=16 PYTHONUNBUFFERED=1
log=$OUT/bench.log; peers=/tmp/dusk-peers; mkdir -p $peers
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 70 python3 benches/baselines/attention_peers.py --no-sdpa --out $peers/attention.json >>$log 2>&1; echo "attention peers $? $(el)s"
timeout 60 python3 benches/baselines/ds_peers.py --out $peers/ds.json >>$log 2>&1; echo "ds peers $? $(el)s"
timeout 50 python3 benches/baselines/append_peers.py --out $peers/append.json >>$log 2>&1; echo "append peers $? $(el)s"
timeout 60 python3 benches/baselines/quest_peers.py --out $peers/selectors.json >>$log 2>&1; echo "quest peers $? $(el)s"
echo "== gpu-check selectors" >>$log
timeout 200 /tmp/gpu-check selectors --peers $peers/selectors.json --out $OUT/selectors.json --commit $commit --date $date \
  --attention-peers $peers/attention.json --ds-peers $peers/ds.json --append-peers $peers/append.json >>$log 2>&1; echo "gpu-check $? $(el)s"
grep -E "^  (quest|ds|sparq|append)_b.*:" $log | cut -c1-200 | head -40
