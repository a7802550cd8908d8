#!/usr/bin/env bash
# session 14, call 2 (fused epilogues per GEMM, in the tile): (1) the fused-epilogue GPU tests (fused against the
# separate launches bit for bit, counters zero after, per stream), the decode PDL on/off tests; (2) a sweep at 1, 2
# and 4 tokens of the table's tiles with each GEMM's epilogue fused or not; (3) the layer bench at 1-4 tokens with the
# table, every tile fused, and none fused (route + apply, one process, two passes).
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "fused or 120b_T1 or 120b_T3" \
  $N/test_hopper_moe.py $N/test_hopper_moe_pdl.py > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAIL|Error" $OUT/r/gpu-tests.log | tail -6
A="32,8,1,4,4"; B="32,8,1,8,1"
TILES="$A,0/$A,0;$A,1/$A,0;$A,0/$A,1;$A,1/$A,1;$B,0/$A,0;$B,0/$A,1"
timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --sweep \
  --sweep-tokens 1,2,4,1,2,4 --sweep-tiles "$TILES" --tokens 1 --budget-s 200 > $OUT/r/sweep.log 2>&1; echo "sweep rc $?"
grep "sweep {" $OUT/r/sweep.log | cut -c1-200
timeout 100 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown --fused-ab \
  --tokens 1,2,4,1,2,4 > $OUT/r/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/r/bench.log | cut -c1-600
cd $OUT && tar czf r.tgz r && rm -rf r
