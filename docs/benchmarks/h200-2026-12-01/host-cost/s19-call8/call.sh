#!/usr/bin/env bash
# session 19, call 8 (issue 13), after the review: decode attention with an attention plan now uses the stream's
# scratch too. The decode tests on CUDA (plan and graph replays included) and the launch GPU test of decode attention.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
T=$R/packages/tokenspeed-kernel-triton/tests
(cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short $T/test_attention.py -k "decode" \
  > $W/tests-decode.txt 2>&1); echo "decode rc $?"; grep -E "FAILED|Error" $W/tests-decode.txt | head; tail -1 $W/tests-decode.txt
(cd /tmp && timeout 40 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_launch_gpu.py \
  -k mha_decode_with_kvcache > $W/tests-launch.txt 2>&1); echo "launch rc $?"; tail -1 $W/tests-launch.txt
tar czf $OUT/r.tgz -C $W .
