#!/usr/bin/env bash
# session 22, call 4 (issue 13): the GPU tests of hopper.moe_apply with the new decode table (scales six K blocks
# ahead, a 4-deep gate/up ring at 1, 3 and 4 tokens). Not run in session 22: the device time ran out first.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
R=$PWD; W=$OUT/r; mkdir -p $W
(cd /tmp && PYTHONPATH=/tmp/site timeout 140 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu -x \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py > $W/tests-moe.txt 2>&1)
echo "tests moe rc $?"; grep -E "FAILED|ERROR|passed|failed" $W/tests-moe.txt | cut -c1-300 | head -8; tail -1 $W/tests-moe.txt
