#!/usr/bin/env bash
# session 9, call 1: upper bound of a bit-placed MXFP4 layout. TS_EXP_PACKED=1 runs the packed layout's decode
# instruction sequence (and its activation order) on canonical weights: the values are wrong, the instruction
# count and the memory traffic are those of the real layout. Layer bench with the toggle off, on, off again.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
for run in a0:0 b1:1 c0:0; do
  tag=${run%%:*}; TS_EXP_PACKED=${run##*:} timeout 170 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/$tag --skip-numerics \
    --skip-breakdown --tokens 1,4,8,64,512,1024,4096 > $OUT/r/$tag.log 2>&1; echo "$tag rc $?"
  grep "bench {" $OUT/r/$tag.log | cut -c1-260
done
cd $OUT && tar czf r.tgz r && rm -rf r
