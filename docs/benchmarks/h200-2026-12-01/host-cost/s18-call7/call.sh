#!/usr/bin/env bash
# session 18, call 7 (issue 13): the final code (replays also check strides, served calls skip the guards their key
# matched, plain values by value): the GPT-OSS model GPU tests, the launch test of the decode and MoE ops, and the
# 24-layer decode step with launch plans on / replays off alternated in one process.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $W/model-tests.txt 2>&1); echo "model tests rc $?"
grep -E "FAILED|ERROR" $W/model-tests.txt | cut -c1-300 | head; tail -1 $W/model-tests.txt
(cd /tmp && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py \
  -k "rmsnorm or rotary or mha_decode_with_kvcache or moe_gate or kvcache_store or moe_apply" \
  > $W/launch-tests.txt 2>&1); echo "launch tests rc $?"
grep -E "FAILED|Error" $W/launch-tests.txt | cut -c1-300 | head; tail -1 $W/launch-tests.txt
timeout 75 python3 tools/host_probe.py --out $W/ab --skip-ops --layers 24 --decode-configs full+prepared,full --rounds 3 \
  --ab-plans > $W/ab.txt 2>&1; echo "ab rc $?"; grep -E "eager|proxy|graph calls" $W/ab.txt | cut -c1-250
tar czf $OUT/r.tgz -C $W .
