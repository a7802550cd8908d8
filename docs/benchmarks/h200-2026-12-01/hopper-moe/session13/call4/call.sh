#!/usr/bin/env bash
# session 13, call 4 (the prefill tables keyed by the mean load of an expert): the GPU tests of 20B shapes and of a
# two-chunk tile, then GPT-OSS-20B end to end with this checkout (after) and f475d3b's wheels (before), alternated
# twice (after, before, after, before).
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "20b or chunks_2_unroll_2_T1024" \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_prefill.py $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_w4a8.py \
  > $OUT/r/gpu-tests.log 2>&1; echo "tests rc $?"; tail -2 $OUT/r/gpu-tests.log
E2E="--configs full --prefill 1x2048,8x2048 --decode-batches 1,64 --decode-steps 16 --eager-decode-steps 0 --no-op-times --prefill-iters 10"
for run in after1 before1 after2 before2; do
  site=/tmp/site; case $run in before*) site=/tmp/site-before;; esac
  PYTHONPATH=$site timeout 120 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e-$run $E2E > $OUT/r/e2e-$run.log 2>&1
  echo "== $run rc $?"; grep -E "^prefill|^decode" $OUT/r/e2e-$run.log | cut -c1-60
done
cd $OUT && tar czf r.tgz r && rm -rf r
