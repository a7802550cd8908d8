#!/usr/bin/env bash
# Session 26, call 3: NOT RUN (session 26's device time ran out; s27-call1 holds its probe). The CUDA-core MoE path software-pipelined by hand (a step's loads issued before the previous
# step's arithmetic) against the MMA decode path at 1 and 2 tokens; its GPU tests; the decode step with it where the
# probe finds it faster (s26-call2/step_gemv.py sets GEMV_TILES from the probe's layer times, or leaves it empty).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s26-call3/call.sh", carry=[".whl"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 120 python3 tools/moe_gemv_probe.py --out $W --tokens 1,2 --rounds 2 --budget-s 80 \
  --gemv "16,16,4/8,8,4;32,16,8/8,16,8;64,8,8/16,8,8;128,8,8/8,16,8" > $W/gemv.txt 2>&1
echo "gemv probe rc $?"; grep -E "^(apply|layer)" $W/gemv.txt | cut -c1-160; grep -E "^numerics" $W/gemv.txt | head -4; snap
(cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_gemv.py > $W/t-gemv.txt 2>&1)
echo "tests gemv rc $? | $(tail -1 $W/t-gemv.txt)"; grep -E "^(FAILED|ERROR)" $W/t-gemv.txt | cut -c1-250 | head -4; snap
S="--skip-ops --layers 24 --decode-configs full+prepared --rounds 3"
timeout 100 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s26-call2/step_gemv.py $W/moe_gemv_probe.json $S \
  --out $W/step-gemv > $W/step-gemv.txt 2>&1; echo "step gemv rc $?"
grep -E "^tokens|GEMV_TILES|^full|proxy|^plans.*moe" $W/step-gemv.txt | cut -c1-200; snap
