#!/usr/bin/env bash
# session 18, call 2 (issue 13): launch plans (prepared calls replay their recorded launches). GPU tests: every
# decode op's launch plan replays to the wrapper's outputs (test_launch_gpu.py, the decode ops), the GPT-OSS model
# (prepared equals plain, graph equals eager); then before (120292c's wheels) / after processes:
# the anchor's host table and the 24-layer decode step, eager against its graph, with the in-situ op times.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py \
  -k "rmsnorm or rotary or mha_decode_with_kvcache or moe_gate or kvcache_store or moe_route" \
  > $OUT/r/launch-tests.log 2>&1); echo "launch tests rc $?"
grep -E "FAILED|ERROR|Error" $OUT/r/launch-tests.log | cut -c1-300 | head; tail -1 $OUT/r/launch-tests.log
(cd /tmp && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $OUT/r/model-tests.log 2>&1); echo "model tests rc $?"
grep -E "FAILED|ERROR" $OUT/r/model-tests.log | cut -c1-300 | head; tail -1 $OUT/r/model-tests.log
export PROBE_ARGS="--layers 24 --decode-configs full+prepared,full --rounds 3 --sites"
for s in host-before host-after; do
  timeout 170 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
grep -h -E "eager|host proxy|plans" $OUT/r/host-*.log | cut -c1-220
