#!/usr/bin/env bash
# session 7, call 3: decode tiles at 1 / 2 / 4 tokens with deeper cp.async rings and fewer K splits (gate/up tile / down tile),
# then the bench at those counts with the fastest
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
TILES="32,8,1,4,4;32,8,1,8,1/32,8,1,4,4;32,8,1,12,1/32,8,1,4,4;32,8,1,16,1/32,8,1,4,4;32,8,1,8,2/32,8,1,4,4;32,8,1,6,4"
TILES="$TILES;32,8,1,4,4/32,8,1,8,2;32,8,1,12,1/32,8,1,12,1;32,8,1,12,1/32,8,1,8,2;64,8,4,12,1/32,8,1,4,4"
timeout 400 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --sweep --sweep-tokens 1,2,4 \
  --sweep-tiles "$TILES" --budget-s 700 --tokens 1,2,4 > $OUT/r/sweep.log 2>&1; echo "sweep rc $?"
grep "sweep {\|tiles used\|bench {" $OUT/r/sweep.log | cut -c1-200
cd $OUT && tar czf r.tgz r && rm -rf r
