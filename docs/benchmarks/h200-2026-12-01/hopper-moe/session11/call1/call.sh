#!/usr/bin/env bash
# session 11, call 1: the GPU tests of hopper.moe_apply's decode and prefill paths on both weight layouts
# (canonical: hopper.moe_apply; packed: hopper.moe_apply_packed), the two files in parallel (the cases
# are bound by JIT compilation on the host). Logs under $OUT.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
T=$PWD/packages/tokenspeed-kernel-nvidia/tests; cd /tmp
for f in test_hopper_moe test_hopper_moe_prefill; do
  timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --durations=5 $T/$f.py > $OUT/$f.log 2>&1 &
done
wait
for f in test_hopper_moe test_hopper_moe_prefill; do echo "== $f"; grep -E "passed|failed|FAILED|Error" $OUT/$f.log | tail -8; done
