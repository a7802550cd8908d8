#!/usr/bin/env bash
# session 12, call 2 (after the launch-by-address and host cdiv commits): GPU tests (cached launch vs JIT on the new launch key, cuBLAS mm paths, GPT-OSS model); before (f5f5e2c's wheels, .anchors/before)
# and after (this checkout) in two processes: the anchor's host table + the GPT-OSS-20B decode step
# (24 layers) eager vs graph, and after only with prepared calls and with attention plans; where each decode-step op's host time goes (tools/host_breakdown.py)
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
(cd /tmp && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py $R/packages/tokenspeed-kernel-nvidia/tests/test_cublas_gpu.py $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $OUT/r/launch-tests.log 2>&1); echo "launch tests rc $?"; tail -2 $OUT/r/launch-tests.log
export PROBE_ARGS="--layers 24 --decode-configs full --rounds 3"
for s in host-before host-after; do
  OUT=$OUT/r timeout 100 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
grep -h "eager\|rmsnorm\|mm\|mha" $OUT/r/host-*.log | cut -c1-200
cd /tmp
timeout 150 python3 $R/tools/host_probe.py --out $OUT/r/probe-prepared --skip-ops --layers 24 --decode-configs full,full+prepared --rounds 3 > $OUT/r/probe-prepared.log 2>&1; echo "probe-prepared rc $?"; tail -3 $OUT/r/probe-prepared.log
timeout 150 python3 $R/tools/host_breakdown.py --out $OUT/r/breakdown > $OUT/r/breakdown.log 2>&1; echo "breakdown rc $?"; cut -c1-230 $OUT/r/breakdown.log
cd $OUT && tar czf r.tgz r && rm -rf r
