#!/usr/bin/env bash
# session 17, call 1 (issue 13): the new fused ops on the GPU (verify --set gpu of triton.apply_rotary_and_store and
# triton.moe_gate; the GPT-OSS model's GPU tests), then before (7a3cc14's wheels: the code as session 16 left it) and
# after (this checkout, 3 processes: after, before, after; the decode layer's rotary + KV store and router + routing fused, 8 op calls a layer instead
# of 10) alternated in separate processes: the anchor's host table and the GPT-OSS-20B decode step (24 layers, batch
# 1, context 2000), prepared with and without attention plans, and plain, each op call's in-situ host time (--sites) and the host-speed proxy.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && for k in triton.apply_rotary_and_store triton.moe_gate; do
  timeout 120 python3 -m tokenspeed_kernel verify $k --set gpu 2>&1 | tail -12; done) > $OUT/r/verify.log 2>&1
grep -E "FAIL|ERROR|verify on" $OUT/r/verify.log | cut -c1-220
(cd /tmp && timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py \
  $R/packages/tokenspeed-kernel-triton/tests/test_rope.py::test_rotary_and_store_gpt_oss_gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_moe.py::test_gate_gpt_oss_router_gpu > $OUT/r/tests.log 2>&1); echo "tests rc $?"; tail -3 $OUT/r/tests.log
export PROBE_ARGS="--layers 24 --decode-configs full+prepared+plan,full+prepared,full --rounds 3 --sites"
for s in host-after host-before host-after; do
  OUT=$OUT/r timeout 95 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
for f in $OUT/r/host-*.log; do echo "== $(basename $f)"; grep -h "eager\|proxy\|step\|rmsnorm  \|mm  \|mha\|moe\|apply_rot\|kvcache" $f | cut -c1-150; done
cd $OUT && tar czf r.tgz r && rm -rf r
