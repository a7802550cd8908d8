#!/usr/bin/env bash
# session 17, call 2 (issue 13): call 1 found the fused router (moe_gate, one program reducing every K step) 0.7 ms a
# step slower on the device. The kernel now accumulates lane by lane and reduces once (8 warps): its GPU tests and
# verify, then --parts (device time of the fused ops against the pairs they replace; host time of the MoE call and its
# pieces, and of launches into an idle and a busy GPU) and the decode step with its in-situ op times; then the same
# decode step with 7a3cc14's wheels (before) in a second process, then after again.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_moe.py::test_gate_gpt_oss_router_gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_rope.py::test_rotary_and_store_gpt_oss_gpu \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $OUT/r/tests.log 2>&1); echo "tests rc $?"; tail -2 $OUT/r/tests.log
(cd /tmp && timeout 60 python3 -m tokenspeed_kernel verify triton.moe_gate --set gpu 2>&1 | tail -9) > $OUT/r/verify.log
grep -E "FAIL|ERROR|verify on" $OUT/r/verify.log | cut -c1-160
C="--layers 24 --decode-configs full+prepared+plan,full+prepared,full --rounds 3 --sites"
timeout 150 python3 tools/host_probe.py --out $OUT/r --skip-ops --parts $C > $OUT/r/probe.log 2>&1; echo "probe rc $?"
cut -c1-180 $OUT/r/probe.log
export PROBE_ARGS="$C"
for s in host-before host-after; do
  OUT=$OUT/r timeout 90 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
for f in $OUT/r/host-*.log; do echo "== $(basename $f)"; grep -h "eager\|proxy" $f | cut -c1-150; done
cd $OUT && tar czf r.tgz r && rm -rf r
