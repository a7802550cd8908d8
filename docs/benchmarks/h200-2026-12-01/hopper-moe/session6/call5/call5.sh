#!/usr/bin/env bash
# session 6, call 5 (code 167d4df): the bf16 prefill tiles at 8192 and 16384 tokens (moe_apply alone)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
TILES="64,64,4,2,2;128,128,8,2;128,128,8,2,2"
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --prefill --skip-prefill-numerics --prefill-tokens 8192,16384 --prefill-tiles "$TILES" --tokens 16384 --budget-s 150 > $OUT/r/sweep.log 2>&1; echo "sweep rc $?"
grep "prefill sweep {\|tiles used\|bench {" $OUT/r/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r
