#!/usr/bin/env bash
# session 11, call 2: the GPT-OSS-120B layer bench (route + moe_apply, one CUDA graph, L2 flushed before
# every replay) of every moe_apply kernel on the machine, hopper.moe_apply_packed beside hopper.moe_apply
# and the peer triton_kernels.moe_apply (its own layout), plus the bf16 grouped-GEMM column.
export WHL_DIR=.whl-moe
[ -f /tmp/site/.installed ] || { rm -rf /tmp/site; bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; cd /tmp
timeout 400 python3 $R/tools/hopper_moe_h200.py --out $OUT --skip-numerics --skip-breakdown --grouped-mm \
  --tokens 1,4,8,64,512,1024,4096,16384 > $OUT/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/bench.log | cut -c1-400
