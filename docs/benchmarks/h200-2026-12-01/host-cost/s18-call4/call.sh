#!/usr/bin/env bash
# session 18, call 4 (issue 13): the launch test of the MoE ops with the replay given the recorded weights object;
# the anchor's host table; the probe's op rows and cProfile tables; the 24-layer decode step with launch plans on
# and with every replay falling back to its wrapper, alternated in one process (--ab-plans). One tarball back.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "moe_apply or moe_experts or rmsnorm" \
  > $W/launch-tests.txt 2>&1); echo "launch tests rc $?"
grep -E "FAILED|Error" $W/launch-tests.txt | cut -c1-300 | head; tail -1 $W/launch-tests.txt
(cd $W && timeout 100 python3 $R/.anchors/host_cost.py > host-anchor.txt 2>&1); echo "anchor rc $?"; cut -c1-160 $W/host-anchor.txt
timeout 120 python3 tools/host_probe.py --out $W/ops --layers 2 --decode-configs full --rounds 1 > $W/ops.txt 2>&1
echo "ops probe rc $?"; grep -E "public|F.rms|torch.mm|direct|C launch" $W/ops.txt | head -20
timeout 240 python3 tools/host_probe.py --out $W/ab --skip-ops --layers 24 --decode-configs full+prepared,full --rounds 5 \
  --ab-plans > $W/ab.txt 2>&1; echo "ab rc $?"; grep -E "eager|proxy" $W/ab.txt
tar czf $OUT/r.tgz -C $W .
