#!/usr/bin/env bash
# session 11, call 2: (1) the GPT-OSS-120B layer bench (route + moe_apply, one CUDA graph, L2 flushed before
# every replay) of every moe_apply kernel on the machine, hopper.moe_apply_packed beside hopper.moe_apply and
# the peer triton_kernels.moe_apply (its own layout), plus the bf16 grouped-GEMM column; (2) the selection
# bench of moe_apply (sets A, F, B: the measured table's source format).
export WHL_DIR=.whl-moe
[ -f /tmp/site/.installed ] || { rm -rf /tmp/site; bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; cd /tmp
timeout 260 python3 $R/tools/hopper_moe_h200.py --out $OUT --skip-numerics --skip-breakdown --grouped-mm \
  --tokens 1,4,8,64,512,1024,4096,16384 > $OUT/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/bench.log | cut -c1-420
timeout 280 python3 $R/tools/selection_h200.py bench --out $OUT/sel --ops moe_apply --sets A F B > $OUT/sel.log 2>&1
echo "selection rc $?"; tail -4 $OUT/sel.log
