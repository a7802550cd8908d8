#!/usr/bin/env bash
# session 16, call 2 (issue 13): GPU tests of the in-place eager graphs (hopper moe_apply, triton_kernels wrapper) and of
# the GPT-OSS model (the residual adds fused into the next norm); then before (6301995's wheels, .anchors/before) and
# after (this checkout) alternated in separate processes: the anchor's host table and the GPT-OSS-20B decode step
# (24 layers) eager vs graph, plain and prepared.
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
(cd /tmp && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py $R/packages/tokenspeed-kernel-nvidia/tests/test_triton_kernels.py \
  "$R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py::test_gpu_matches_the_reference_and_replays_in_a_graph" \
  > $OUT/r/tests.log 2>&1); echo "tests rc $?"; tail -3 $OUT/r/tests.log
export PROBE_ARGS="--layers 24 --decode-configs full,full+prepared --rounds 3"
for s in host-before host-after host-before host-after; do
  OUT=$OUT/r timeout 110 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
grep -h "eager\|graphs" $OUT/r/host-*.log | cut -c1-200
cd $OUT && tar czf r.tgz r && rm -rf r
