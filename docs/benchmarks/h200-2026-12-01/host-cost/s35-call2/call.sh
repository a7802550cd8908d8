#!/usr/bin/env bash
# Session 35, call 2 (issue 13), on call 1's warm machine: why the fp32 pairs downs were slower. Each down alone
# (20B, one token): the f16i pairs down now fused (session 34 timed it with the combine launch), the fp32 pairs down
# without a ring or cap, the staged one, and call 1's unstaged AHEAD 3 one again; the TC gate/up with the integer
# decode without a cap and with two row groups a warp.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w2; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w2; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd /tmp && timeout 100 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 \
  --kernel-gate-up "ti1,4;ti2,4@168" --kernel-down "pi1,8;pd1,8;p1,8;pd1,8,1,3@128;d1,4,1,3@128" \
  --tag=-kernels --budget-s 90 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
