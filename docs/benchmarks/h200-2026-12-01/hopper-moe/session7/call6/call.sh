#!/usr/bin/env bash
# session 7, call 6: the session's start (a3601e2, wheels built into .anchors/before/, its own hopper_moe_h200.py)
# against this code at 4096 / 16384 tokens, alternating processes, same routing draws
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl >> $OUT/setup.log 2>&1
export PYTHONUNBUFFERED=1
R=$PWD; mkdir -p $OUT/r; cd /tmp
n=0
for v in before after before; do
  n=$((n+1))
  if [ $v = before ]; then S=/tmp/site-before; TOOL=$R/.anchors/before/hopper_moe_h200_old.py; else S=/tmp/site; TOOL=$R/tools/hopper_moe_h200.py; fi
  PYTHONPATH=$S timeout 70 python3 $TOOL --out $OUT/r/$n-$v --skip-numerics --skip-breakdown --tokens 4096,16384 > $OUT/r/$n-$v.log 2>&1; echo "$n $v rc $?"
  grep "bench {" $OUT/r/$n-$v.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l.split('bench ',1)[1]); print(r['tokens'], {k: round(v, 1) for k, v in r.items() if k.startswith(('hopper.', 'triton_kernels')) and isinstance(v, float)})"
done
cd $OUT && tar czf r.tgz r && rm -rf r
