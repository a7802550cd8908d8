#!/usr/bin/env bash
# session 21, call 1 (issue 13): moe_apply's decode GEMMs with L2 prefetch of their weights (layer.DECODE_PREFETCH
# modes 0-3): bits against mode 0, route + apply timed in turns, each GEMM alone with and without the L2 flush;
# the GPT-OSS-20B decode step (graph and prepared eager) with modes 0 and 2 in alternated processes; then the Hopper
# MoE GPU tests with mode 2. Ran at fb62686; the probe is kept beside this script (moe_prefetch_probe.py).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 tools/moe_prefetch_probe.py --out $W --tokens 1,2,4 --modes 0,1,2,3 --rounds 2 > $W/probe.txt 2>&1
echo "probe rc $?"; grep -E "^(bits|layer|gemm)" $W/probe.txt | awk '{printf "%s | ", $0} END {print ""}'
tail -2 $W/probe.txt | cut -c1-300
(cd /tmp && TOKENSPEED_KERNEL_MOE_PREFETCH=2 timeout 80 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_pdl.py > $W/tests-moe.txt 2>&1)
echo "tests moe rc $?"; grep -E "FAILED|ERROR" $W/tests-moe.txt | cut -c1-300 | head -5; tail -1 $W/tests-moe.txt
for run in m0a m2a; do
  mode=${run:1:1}
  TOKENSPEED_KERNEL_MOE_PREFETCH=$mode timeout 50 python3 tools/host_probe.py --out $W/step-$run --skip-ops --layers 24 \
    --decode-configs full+prepared --rounds 2 > $W/step-$run.txt 2>&1
  echo "step $run rc $?"; grep -E "^full|proxy" $W/step-$run.txt | cut -c1-200 | head -4
done
