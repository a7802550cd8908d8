#!/usr/bin/env bash
# session 8, call 1: the decode stream probe's persistent rows (per GEMM and the whole layer, loads only),
# then the layer at 1-64 tokens in the same call for reference
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 200 python3 $R/tools/decode_stream_probe.py --out $OUT/r/probe > $OUT/r/probe.log 2>&1; echo "probe rc $?"; cut -c1-150 $OUT/r/probe.log
timeout 120 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown --tokens 1,2,4,8,64 > $OUT/r/bench.log 2>&1; echo "bench rc $?"; grep "bench {" $OUT/r/bench.log | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r
