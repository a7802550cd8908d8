#!/usr/bin/env bash
# session 19, call 4 (issue 13): the launch GPU test of every in-tree op that calls 2-3 did not reach (mm with the
# dense GEMV row included: cached vs JIT launch, graph replay, launch-plan replay, served public calls), and the core
# package's GPU tests (GPT-OSS model: prepared equals plain, graph equals eager; public calls served).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR|Error|assert" $W/tests-$name.txt | cut -c1-400 | head -12
  tail -1 $W/tests-$name.txt; }
t core 120 -m gpu $R/packages/tokenspeed-kernel-core/tests
t launch 330 -m gpu $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "mha_extend or mha_prefill or mm or moe_apply or moe_combine or moe_dispatch or moe_experts or moe_route or quantize or silu or swiglu or top_k"
tar czf $OUT/r.tgz -C $W .
