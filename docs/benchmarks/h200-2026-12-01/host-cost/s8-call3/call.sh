#!/usr/bin/env bash
# session 8, call 3 (final code): the sampler GPU tests, the anchor's host table, bench --host on every decode-step
# op, the GPT-OSS-20B decode step eager vs graph; then the MoE layer at 1 and 64 tokens in two processes
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-triton/tests/test_sampling.py > $OUT/r/tests.log 2>&1; echo "tests rc $?"; tail -2 $OUT/r/tests.log
(cd $OUT/r && timeout 120 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1); echo "anchor rc $?"; tail -12 $OUT/r/host-anchor.log
timeout 240 python3 -m tokenspeed_kernel bench --host --quiet --json $OUT/r/host-default.json --md $OUT/r/host-default.md > $OUT/r/host-default.log 2>&1; echo "bench-host rc $?"; grep "^| " $OUT/r/host-default.md | cut -c1-220
timeout 200 python3 $R/tools/host_probe.py --out $OUT/r/probe --skip-ops --layers 24 --decode-configs full,hopper.moe_apply --rounds 3 > $OUT/r/probe.log 2>&1; echo "probe rc $?"; tail -8 $OUT/r/probe.log
for n in 1 2; do
timeout 100 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/moe$n --skip-numerics --skip-breakdown --tokens 1,64 > $OUT/r/moe$n.log 2>&1; echo "moe$n rc $?"; grep "bench {" $OUT/r/moe$n.log | cut -c1-260
done
cd $OUT && tar czf r.tgz r && rm -rf r
