#!/usr/bin/env bash
# Session 32, call 4 (issue 13): call 3's ncu found the TC gate/up waiting at the top of every trip for codes that
# ptxas requested at the end of the previous one. The loop now requests the next trip's chunks first, and a maxnreg
# cap (TcTile(1, 4, 1, 168)) lets ptxas keep 6 of the 8 loads ahead of the MMAs (sm90 SASS; the patch adds a CPU test).
# 1. numerics of the TC gate/up + fp32 down pair; 2. each gate/up kernel alone; 3. the public call eager.
# NOT RUN in session 32 (no device time was left). The kernel change is not in the tree: apply it first with
#   git apply docs/benchmarks/h200-2026-12-01/host-cost/s32-call4/prefetch-maxnreg.patch
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s32-call4/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name --format=csv,noheader
NEW="t1,4@168/1,4"
(cd /tmp && timeout 75 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$NEW" --kernel-gate-up "1,8,1;t1,4;t1,4@168" --kernel-down "1,4" --tag=-kernels \
  --budget-s 65 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-110; grep -iE "error|Traceback" $W/kernels.txt | head -3; snap
for n in new:$NEW fp32:1,8,1/1,4; do
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-200)"; snap
done
