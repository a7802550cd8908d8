#!/usr/bin/env bash
# session 16, call 4 (issue 13; final code): GPU tests of the GPT-OSS model, the triton_kernels wrapper (all five) and the
# Hopper graph-replay test on every case that takes the eager graph (call 3 found call 2's failures in that test's own
# new check, which left x modified); then before (6301995's wheels) and after (this checkout) alternated in separate
# processes: the anchor's host table and the GPT-OSS-20B decode step (24 layers), prepared and plain, with the host proxy.
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
N=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 290 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py $N/test_triton_kernels.py \
  "$N/test_hopper_moe.py::test_gpu_matches_the_reference_and_replays_in_a_graph" -k "not split and not decode_tiles" \
  > $OUT/r/tests.log 2>&1); echo "tests rc $?"; grep -cE "PASSED" $OUT/r/tests.log; grep -E "FAILED|ERROR" $OUT/r/tests.log | cut -c1-250 | head; tail -1 $OUT/r/tests.log
export PROBE_ARGS="--layers 24 --decode-configs full+prepared,full --rounds 3"
for s in host-before host-after host-before host-after; do
  OUT=$OUT/r timeout 70 bash tools/gpu_session.sh $s > $OUT/r/$s.$(date +%H%M%S).log 2>&1; echo "$s rc $?"
done
for f in $OUT/r/host-*.log; do echo "== $(basename $f)"; grep -h "eager\|graphs\|proxy\|rmsnorm\|mm\|mha" $f | cut -c1-160; done
cd $OUT && tar czf r.tgz r && rm -rf r
