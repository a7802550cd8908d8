#!/usr/bin/env bash
# session 14, call 5 (the final code): every GPU test of test_hopper_moe.py (the decode and prefill paths against
# the reference, graph replay, both layouts; the fused epilogues), then the PDL on/off tests, until the time limit.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 320 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs $N/test_hopper_moe.py $N/test_hopper_moe_pdl.py \
  > $OUT/r/gpu-tests.log 2>&1; echo "tests rc $?"
grep -cE "PASSED" $OUT/r/gpu-tests.log; grep -E "FAILED|ERROR" $OUT/r/gpu-tests.log | head; tail -2 $OUT/r/gpu-tests.log
