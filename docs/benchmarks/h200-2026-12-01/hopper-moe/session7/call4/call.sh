#!/usr/bin/env bash
# session 7, call 4 (code at the commit of this script's folder): the GPU tests of the decode path (every table tile),
# the prefill and W4A8 GPU tests (a subset: ragged, large, 5 tokens), verify of hopper.moe_apply
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
T=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $T/test_hopper_moe.py 2>&1 | tee $OUT/r/gpu-tests-decode.log | tail -2
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $T/test_hopper_moe_prefill.py $T/test_hopper_moe_w4a8.py -k "T4096 or T3000 or T5_ or T700 or T1024 or hot or unroll_4_T600" 2>&1 | tee $OUT/r/gpu-tests-prefill.log | tail -2
timeout 150 python3 -m tokenspeed_kernel verify hopper.moe_apply --set gpu --json $OUT/r/verify.json > $OUT/r/verify.log 2>&1; echo "verify rc $?"; tail -12 $OUT/r/verify.log
cd $OUT && tar czf r.tgz r && rm -rf r
