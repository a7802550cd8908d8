#!/usr/bin/env bash
# session 13, call 1: two-chunk prefill programs (PrefillTile chunks=2). (1) the GPU tests of the new tiles
# (bf16 both layouts, W4A8); (2) the prefill tile sweep on packed weights (moe_apply alone, CUDA graph, L2 flushed),
# then the layer bench (route + apply, every moe_apply kernel, the peer among them) at the sweep's best tiles;
# (3) W4A8 tiles with and without chunks.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k chunks \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_prefill.py $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_w4a8.py \
  > $OUT/r/gpu-tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/r/gpu-tests.log
T="64,16,4,4,4;64,16,4,4,4,2;64,32,4,2,2;64,32,4,2,2,2;64,64,4,2,2;64,64,4,2,2,2;128,128,8,2,2;128,64,8,2,2,2"
timeout 300 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/hm --skip-numerics --skip-breakdown --prefill --skip-prefill-numerics \
  --prefill-layouts packed --prefill-tokens 1024,512,2048,256,4096,16384 --prefill-tiles "$T" --tokens 512,1024,2048 \
  --budget-s 210 > $OUT/r/hm.log 2>&1; echo "hm rc $?"
grep "tiles used\|bench {" $OUT/r/hm.log | cut -c1-600
timeout 90 python3 $R/tools/hopper_w4a8_h200.py --out $OUT/r/w4a8 --skip-numerics --tokens 4096,16384 \
  --tiles "64,128,4,2;64,64,4,2,2;64,64,4,2,2,2" > $OUT/r/w4a8.log 2>&1; echo "w4a8 rc $?"; grep timing $OUT/r/w4a8.log | cut -c1-500
cd $OUT && tar czf r.tgz r && rm -rf r
