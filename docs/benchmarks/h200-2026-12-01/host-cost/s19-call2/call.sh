#!/usr/bin/env bash
# session 19, call 2 (issue 13): decode attention in one launch (the last split merges, counted on the stream's
# counters; launch plans replay them). GPU tests of what changed; the anchor's host table with this checkout and with
# the session's starting wheels (.anchors/before, ed0fb33), alternated after / before / after in separate processes;
# the dense GEMV's row against cuBLAS and the old tile; the 24-layer decode step eager vs graph.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
T=$R/packages/tokenspeed-kernel-triton/tests
t attention 100 $T/test_attention.py
t launch 100 -m gpu $T/test_launch_gpu.py
t mm 40 $T/test_mm.py -k "gemv or bf16_gpt_oss"
t hopper 40 -m gpu $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py -k "fused or graph"
t model 60 -m gpu $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after1 before1 after2 before2; do
  site=/tmp/site; [ "${run#before}" != "$run" ] && site=/tmp/site-before
  (mkdir -p $W/anchor-$run && cd $W/anchor-$run && PYTHONPATH=$site timeout 40 python3 $R/.anchors/host_cost.py > log.txt 2>&1)
  echo "anchor $run rc $?"; cut -c1-160 $W/anchor-$run/log.txt | grep -v "'direct_us'" 
done
timeout 60 python3 tools/gemv_sweep.py --out $W/gemv --configs 2/4/512/4 > $W/gemv.txt 2>&1; echo "gemv rc $?"
grep -E "cuBLAS|best" $W/gemv.txt | cut -c1-200
timeout 110 python3 tools/host_probe.py --out $W/probe --skip-ops --layers 24 --decode-configs full+prepared,full,triton \
  --rounds 3 > $W/probe.txt 2>&1; echo "probe rc $?"; grep -E "eager|proxy|graph calls|plans" $W/probe.txt | cut -c1-250
tar czf $OUT/r.tgz -C $W .
