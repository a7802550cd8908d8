#!/usr/bin/env bash
# session 13, call 2 (the table with two-chunk tiles from 2048 tokens): (1) the GPU tests whose calls take the table's
# new tiles (both layouts); (2) a sweep of 8-warp tiles at 4096 / 16384 tokens on both layouts in one process
# (moe_apply alone), its bench at 16384; (3) the layer bench (route + apply, every moe_apply kernel, the peer among
# them) at the shipped table.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "T4096_table or 120b_T3000 or 20b_T700" \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_prefill.py > $OUT/r/gpu-tests.log 2>&1; echo "tests rc $?"; tail -2 $OUT/r/gpu-tests.log
T="128,128,8,2,2;128,64,8,2,2,2;128,64,8,3,2,2;128,32,8,4,2,2;64,64,4,2,2,2"
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --prefill --skip-prefill-numerics \
  --prefill-layouts packed,canonical --prefill-tokens 4096,16384 --prefill-tiles "$T" --tokens 16384 \
  --budget-s 170 > $OUT/r/sweep.log 2>&1; echo "sweep rc $?"
grep "bench {" $OUT/r/sweep.log | cut -c1-500
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown \
  --tokens 1,64,512,1024,2048,4096,16384 > $OUT/r/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/r/bench.log | cut -c1-500
cd $OUT && tar czf r.tgz r && rm -rf r
