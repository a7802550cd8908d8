#!/usr/bin/env bash
# session 14, call 1 (the decode path's fused epilogues): (1) the decode GPU tests (reference, graph replay, the
# fused epilogues against the separate launches bit for bit, PDL on/off); (2) the layer bench at 1-4 tokens with the
# fused and the separate epilogues in one process (route + apply; the peer among the kernels); (3) GPT-OSS-20B decode
# end to end with this checkout (after) and 8716421's wheels (before), alternated.
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x -k "fused or T1 or T2 or T3 or T4 or T64_decode" \
  $N/test_hopper_moe.py $N/test_hopper_moe_pdl.py > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -4 $OUT/r/gpu-tests.log
timeout 120 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown --fused-ab \
  --tokens 1,2,4,1,2,4 > $OUT/r/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/r/bench.log | cut -c1-400
E2E="--configs full --prefill 1x128 --prefill-iters 2 --decode-batches 1 --decode-steps 32 --eager-decode-steps 0 --no-op-times"
for run in after1 before1 after2 before2; do
  site=/tmp/site; case $run in before*) site=/tmp/site-before;; esac
  PYTHONPATH=$site timeout 90 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e-$run $E2E > $OUT/r/e2e-$run.log 2>&1
  echo "== $run rc $?"; grep -E "^prefill|^decode" $OUT/r/e2e-$run.log | cut -c1-80
done
cd $OUT && tar czf r.tgz r && rm -rf r
