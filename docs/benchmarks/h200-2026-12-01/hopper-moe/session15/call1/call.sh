#!/usr/bin/env bash
# session 15, call 1: prefill tiles with 32 weight rows a warp (two wgmma M blocks per warpgroup on each activation
# tile). (1) the GPU tests of the new tiles (bf16 both layouts, W4A8); (2) the prefill tile sweep on packed weights
# (moe_apply alone, CUDA graph, L2 flushed): the table's tiles against the new ones, then the layer bench (route +
# apply, every moe_apply kernel, the peer among them) at the sweep's best tiles.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs -k rows_32 \
  $N/test_hopper_moe_prefill.py $N/test_hopper_moe_w4a8.py > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -4 $OUT/r/gpu-tests.log
T="64,32,4,2,2;64,64,4,2,2;64,32,4,2,2,2;128,64,8,2,2,2;64,16,4,4,4"
T="$T;128,64,4,2,2;128,32,4,2,2;128,32,4,3,1;128,64,4,3,1;128,32,4,2,2,2;128,16,4,4,2"
timeout 340 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/hm --skip-numerics --skip-breakdown --prefill \
  --skip-prefill-numerics --prefill-layouts packed --prefill-tokens 1024,512,2048,4096,256,64 --prefill-tiles "$T" \
  --tokens 512,1024,2048 --budget-s 250 > $OUT/r/hm.log 2>&1; echo "hm rc $?"
grep "tiles used\|bench {" $OUT/r/hm.log | cut -c1-600
cd $OUT && tar czf r.tgz r && rm -rf r
