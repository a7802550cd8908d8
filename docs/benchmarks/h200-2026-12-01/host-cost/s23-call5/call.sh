#!/usr/bin/env bash
# NOT RUN: too little device time was left to start a machine (session 23); the one-tile first pass has not run on a GPU. Superseded by s24-call1/call.sh (session 24).
# session 23, call 5 (issue 13): moe_gate's norm with its first pass in one whole-row tile (decode). GPU tests and
# verify of moe_gate; device time (CUDA graphs, L2 flushed) of moe_gate with and without the norm;
# the 24-layer prepared decode step, the code before session 23 (.anchors/pre-s23) and this checkout alternated.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/pre-s23/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && PYTHONPATH=/tmp/site timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_moe.py -k gate $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py \
  > $W/tests.txt 2>&1; echo "tests rc $?" >> $W/tests.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 120 python3 -m tokenspeed_kernel verify triton.moe_gate --set gpu > $W/verify.txt 2>&1; echo "verify rc $?" >> $W/verify.txt) &
wait
grep -E "FAILED|ERROR" $W/tests.txt | cut -c1-250 | head -4; tail -2 $W/tests.txt
grep -E "^(FAIL|ERROR)" $W/verify.txt | cut -c1-250 | head -4; tail -2 $W/verify.txt | cut -c1-200
export PYTHONPATH=/tmp/site
for op in moe_gate; do
  (cd /tmp && timeout 100 python3 -m tokenspeed_kernel bench $op --graph --no-ceilings --md $W/bench-$op.md > $W/bench-$op.txt 2>&1)
  echo "bench $op rc $?"; grep -E "^\|" $W/bench-$op.md | cut -c1-230 | head -12
done
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --rounds 2"
for run in before1 after1; do
  site=/tmp/site; [ "${run:0:6}" = before ] && site=/tmp/site-before
  PYTHONPATH=$site timeout 80 python3 $P --out $W/$run > $W/step-$run.txt 2>&1
  echo "$run rc $? | $(grep -E '^host proxy|^full' $W/step-$run.txt | cut -c1-150 | tr '\n' '|')"
done
