#!/usr/bin/env bash
# session 19, call 1 (issue 13): the dense bf16 GEMV against cuBLAS at GPT-OSS's decode GEMMs (tools/gemv_sweep.py);
# GPU tests of what changed (decode attention's one partials buffer, launch plans, the GEMV, the GPT-OSS model);
# the 24-layer decode step with the MoE weights' memo keys and without, alternated in one process; the anchor's
# host table, and the same (probe + anchor) with the session's starting wheels (.anchors/before, built from ed0fb33).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 160 python3 tools/gemv_sweep.py --out $W/gemv --budget-s 120 > $W/gemv.txt 2>&1; echo "gemv rc $?"
grep -E "cuBLAS|best" $W/gemv.txt | cut -c1-200
(cd /tmp && timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py $R/packages/tokenspeed-kernel-triton/tests/test_attention.py \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $W/tests.txt 2>&1); echo "tests rc $?"
grep -E "FAILED|ERROR" $W/tests.txt | cut -c1-300 | head; tail -1 $W/tests.txt
(cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -k gemv \
  $R/packages/tokenspeed-kernel-triton/tests/test_mm.py > $W/tests-gemv.txt 2>&1); echo "gemv tests rc $?"; tail -1 $W/tests-gemv.txt
timeout 110 python3 tools/host_probe.py --out $W/ab --skip-ops --layers 24 --decode-configs full,full+prepared --rounds 3 \
  --ab-moe-keys > $W/ab.txt 2>&1; echo "ab rc $?"; grep -E "eager|proxy|graph calls" $W/ab.txt | cut -c1-250
(mkdir -p $W/anchor && cd $W/anchor && timeout 45 python3 $R/.anchors/host_cost.py > log.txt 2>&1); echo "anchor rc $?"
cut -c1-200 $W/anchor/log.txt
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
(mkdir -p $W/anchor-before && cd $W/anchor-before && PYTHONPATH=/tmp/site-before timeout 45 python3 $R/.anchors/host_cost.py \
  > log.txt 2>&1); echo "anchor before rc $?"; cut -c1-200 $W/anchor-before/log.txt
tar czf $OUT/r.tgz -C $W .
