#!/usr/bin/env bash
# session 7, call 5: the prefill GEMMs' prologue order A/B in one process (--order-ab: the first weight codes before the
# grid wait, the default, against the order before PDL: wait, activation TMA, then the codes)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 200 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/ab --skip-numerics --skip-breakdown --tokens 64,256,1024,4096,16384 --order-ab > $OUT/r/ab.log 2>&1; echo "ab rc $?"
grep "bench {" $OUT/r/ab.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l.split('bench ',1)[1]); print(r['tokens'], {k: round(v, 1) for k, v in r.items() if k.startswith(('hopper.', 'triton_kernels')) and isinstance(v, float)})"
cd $OUT && tar czf r.tgz r && rm -rf r
