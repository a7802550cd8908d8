#!/usr/bin/env bash
# session 18, call 1 (issue 13): test_launch_gpu.py on every in-tree op (the two fused decode ops included); the
# 24-layer decode step (prepared) sampled by py-spy, Python frames and native frames; the anchor's host table.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $OUT/r/launch-tests.log 2>&1); echo "launch tests rc $?"
grep -E "FAILED|ERROR" $OUT/r/launch-tests.log | cut -c1-200 | head; tail -1 $OUT/r/launch-tests.log
SPY=/tmp/site/bin/py-spy
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --spin 8"
timeout 120 $SPY record --nonblocking -r 1000 -f raw -o $OUT/r/spy-py.txt -- python3 $P --out $OUT/r/spin-py \
  > $OUT/r/spy-py.log 2>&1; echo "spy py rc $?"; tail -3 $OUT/r/spy-py.log
timeout 120 $SPY record --native -r 250 -f raw -o $OUT/r/spy-native.txt -- python3 $P --out $OUT/r/spin-native \
  > $OUT/r/spy-native.log 2>&1; echo "spy native rc $?"; tail -3 $OUT/r/spy-native.log
timeout 60 python3 $P --out $OUT/r/spin-none 2>&1 | tail -1
(cd $OUT/r && timeout 100 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1); echo "anchor rc $?"; tail -12 $OUT/r/host-anchor.log
