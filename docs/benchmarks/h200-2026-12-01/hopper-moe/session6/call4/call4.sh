#!/usr/bin/env bash
# session 6, call 4 (code 167d4df): the W4A8 GPU tests, verify of hopper.moe_apply, per-launch times at
# 8-1024 tokens, a bf16 prefill tile sweep at 1024-4096 tokens with 4-warp 128-pair tiles, bench there
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_w4a8.py 2>&1 | tee $OUT/r/gpu-tests-w4a8.log | tail -3
timeout 150 python3 -m tokenspeed_kernel verify hopper.moe_apply --set gpu --json $OUT/r/verify.json > $OUT/r/verify.log 2>&1; echo "verify rc $?"; tail -4 $OUT/r/verify.log
timeout 90 python3 $R/tools/ncu_moe.py --graphs --tokens 8,64,512,1024 --json $OUT/r/breakdown.json > $OUT/r/breakdown.log 2>&1; grep "sum of" $OUT/r/breakdown.log
TILES="64,64,4,2,2;64,128,4,2,1;64,128,4,2,2;64,128,4,3,1;128,128,8,2;128,128,8,2,2"
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --prefill --skip-prefill-numerics --prefill-tokens 1024,2048,4096 --prefill-tiles "$TILES" --tokens 1024,2048,4096 --budget-s 150 > $OUT/r/sweep.log 2>&1; echo "sweep rc $?"
grep "prefill sweep {\|tiles used\|bench {" $OUT/r/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r
