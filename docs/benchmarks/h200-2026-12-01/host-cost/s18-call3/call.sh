#!/usr/bin/env bash
# session 18, call 3 (issue 13): public calls served by prepared calls with launch plans. Stage a (tests): every
# in-tree op's cached launch vs JIT, graph replay, launch-plan replay and served public calls (test_launch_gpu.py);
# every GPU test of the core package (the GPT-OSS model: prepared equals plain, graph equals eager; attention plans).
# Stage b (timing): before (120292c's wheels) / after processes (anchor host table, 24-layer decode step with the
# in-situ op times), then the probe's op rows and cProfile tables (after, 2 layers).
stage=${1:-a}
[ -f /tmp/site/.installed ] || { rm -rf /tmp/site /tmp/site-before; bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
if [ "$stage" = a ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader
  (cd /tmp && timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
    $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $OUT/r/launch-tests.txt 2>&1); echo "launch tests rc $?"
  grep -E "FAILED|ERROR|Error" $OUT/r/launch-tests.txt | cut -c1-400 | head -20; tail -1 $OUT/r/launch-tests.txt
  (cd /tmp && timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
    $R/packages/tokenspeed-kernel-core/tests > $OUT/r/core-tests.txt 2>&1); echo "core tests rc $?"
  grep -E "FAILED|ERROR" $OUT/r/core-tests.txt | cut -c1-400 | head -20; tail -1 $OUT/r/core-tests.txt
else
  export PROBE_ARGS="--layers 24 --decode-configs full+prepared,full --rounds 3 --sites"
  for s in host-before host-after; do
    timeout 170 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).txt 2>&1; echo "$s rc $?"
  done
  grep -h -E "eager|host proxy|plans" $OUT/r/host-*.txt | cut -c1-220
  timeout 150 python3 tools/host_probe.py --out $OUT/r/ops --layers 2 --decode-configs full --rounds 1 \
    > $OUT/r/ops.txt 2>&1; echo "ops probe rc $?"; grep -E "public|F.rms|torch.mm|direct" $OUT/r/ops.txt | head -20
fi
