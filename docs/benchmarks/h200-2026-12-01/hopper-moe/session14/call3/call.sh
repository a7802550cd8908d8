#!/usr/bin/env bash
# session 14, call 3 (the one-token entry takes the 4-token tiles): (1) the GPU tests of the one-token table tiles
# (reference, graph replay, PDL on/off); (2) at 1 token, moe_apply alone: the old entry, the new one and both fused,
# three passes; (3) the layer bench at 1-4 tokens (route + apply, the peer in the same process); (4) GPT-OSS-20B end
# to end with this checkout (after) and 8716421's wheels (before), alternated.
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "120b_T1-" $N/test_hopper_moe.py > $OUT/r/gpu-tests.log 2>&1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "120b_T1]" $N/test_hopper_moe_pdl.py >> $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed" $OUT/r/gpu-tests.log
A="32,8,1,4,4"; B="32,8,1,8,1"
timeout 90 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/sweep --skip-numerics --skip-breakdown --sweep \
  --sweep-tokens 1,1,1 --sweep-tiles "$A,0/$A,0;$B,0/$A,0;$A,1/$A,1" --tokens 1 --budget-s 200 > $OUT/r/sweep.log 2>&1
echo "sweep rc $?"; grep "sweep {" $OUT/r/sweep.log | cut -c1-200
timeout 90 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown \
  --tokens 1,2,4,1,2,4 > $OUT/r/bench.log 2>&1; echo "bench rc $?"
grep "bench {" $OUT/r/bench.log | cut -c1-420
E2E="--configs full --prefill 1x2048 --prefill-iters 3 --decode-batches 1,64 --decode-steps 32 --eager-decode-steps 0 --no-op-times"
for run in after1 before1 after2 before2; do
  site=/tmp/site; case $run in before*) site=/tmp/site-before;; esac
  PYTHONPATH=$site timeout 80 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e-$run $E2E > $OUT/r/e2e-$run.log 2>&1
  echo "== $run rc $?"; grep -h "ms/step\|prefill 1x2048:" $OUT/r/e2e-$run.log | cut -c12-90
done
cd $OUT && tar czf r.tgz r && rm -rf r
