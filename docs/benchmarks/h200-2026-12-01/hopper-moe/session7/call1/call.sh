#!/usr/bin/env bash
# session 7, call 1: the PDL GPU tests (on/off bit-identical back to back, eager and graph) and the decode GPU tests;
# the layer with PDL on and off in one process (--pdl-ab); W4A8 below FP8_MIN_TOKENS at forced tiles
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
T=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $T/test_hopper_moe_pdl.py $T/test_hopper_moe.py 2>&1 | tee $OUT/r/gpu-tests.log | tail -4
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/table --skip-numerics --skip-breakdown --tokens 1,2,4,8,16,64,256,512,1024,4096 --pdl-ab > $OUT/r/table.log 2>&1; echo "table rc $?"; grep "bench {" $OUT/r/table.log
timeout 100 python3 $R/tools/hopper_w4a8_h200.py --out $OUT/r/w4a8 --skip-numerics --tokens 8,64,256,512 --tiles "64,16,4,4,4;64,32,4,2,2;64,64,4,2,2" > $OUT/r/w4a8.log 2>&1; echo "w4a8 rc $?"; grep timing $OUT/r/w4a8.log
cd $OUT && tar czf r.tgz r && rm -rf r
