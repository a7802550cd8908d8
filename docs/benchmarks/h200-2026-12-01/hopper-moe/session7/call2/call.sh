#!/usr/bin/env bash
# session 7, call 2: what bounds the decode GEMMs at one token (tools/decode_stream_probe.py), and PDL on/off
# repeated in two more processes at 1 / 8 / 256 / 1024 / 4096 tokens
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 120 python3 $R/tools/decode_stream_probe.py --out $OUT/r/probe > $OUT/r/probe.log 2>&1; echo "probe rc $?"; cat $OUT/r/probe.log | cut -c1-150
for n in 1 2; do
timeout 110 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/ab$n --skip-numerics --skip-breakdown --tokens 1,8,256,1024,4096 --pdl-ab > $OUT/r/ab$n.log 2>&1; echo "ab$n rc $?"; grep "bench {" $OUT/r/ab$n.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l.split('bench ',1)[1]); print(r['tokens'], round(r['hopper.moe_apply'],1), round(r['hopper.moe_apply_no_pdl'],1), round(r.get('triton_kernels.moe_apply') or 0,1))"
done
cd $OUT && tar czf r.tgz r && rm -rf r
