#!/usr/bin/env bash
# session 6, call 6 (code at HEAD): GPU tests of the table's tiles, W4A8 tiles at 4096 / 16384, the table
# (bench with the bf16 grouped-GEMM column), end to end (GPT-OSS-20B, full vs triton)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_prefill.py -k "T4096 or T3000 or T5_ or T700" 2>&1 | tee $OUT/r/gpu-tests.log | tail -2
timeout 60 python3 $R/tools/hopper_w4a8_h200.py --out $OUT/r/w4a8 --skip-numerics --tokens 4096,16384 --tiles "64,128,4,2;64,128,4,2,2;128,128,8,2,2" > $OUT/r/w4a8.log 2>&1; echo "w4a8 rc $?"; grep "timing" $OUT/r/w4a8.log
timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/table --skip-numerics --skip-breakdown --tokens 1,8,64,512,1024,4096,16384 --grouped-mm > $OUT/r/table.log 2>&1; echo "table rc $?"; grep "bench {" $OUT/r/table.log
timeout 170 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e --configs full,triton --prefill 1x2048,8x2048 --decode-batches 1,64 --eager-decode-steps 0 --no-op-times > $OUT/r/e2e.log 2>&1; echo "e2e rc $?"; tail -14 $OUT/r/e2e.log
cd $OUT && tar czf r.tgz r && rm -rf r
