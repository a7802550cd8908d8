#!/usr/bin/env bash
# session 11, call 3: the layer bench of call 2 again, in two fresh processes (another draw order per process:
# --tokens differs), to see how much of call 2's canonical-vs-packed differences is run-to-run spread.
export WHL_DIR=.whl-moe
[ -f /tmp/site/.installed ] || { rm -rf /tmp/site; bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; cd /tmp
for run in p1:1,4,8,64,512,1024,4096,16384 p2:16384,4096,1024,512,64,8,4,1; do
  tag=${run%%:*}; timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/$tag --skip-numerics --skip-breakdown \
    --tokens ${run#*:} > $OUT/$tag.log 2>&1; echo "$tag rc $?"
  grep "bench {" $OUT/$tag.log | sed -E 's/, .triton.moe_apply.: [0-9.]+//; s/.touched_experts/te/' | cut -c1-300
done
