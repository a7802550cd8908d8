#!/usr/bin/env bash
# Session 31, call 4 (issue 13): the tensor-core GEMV with 8 chunks of codes in flight a warp (TcTile ahead=8) against
# 4 and against the fp32 GEMV: 1. numerics (ahead 8 on both GEMMs) + each kernel alone; 2. moe_apply alone at one
# token, the fp32 pair and the TC pair (no eager rounds: 312 s of device time were left).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s31-call4/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
TC8="t1,4@8/t1:1@8"; FP="1,8,1/1,4"
(cd /tmp && timeout 110 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$TC8" --kernel-gate-up "1,8,1;t1,4;t1,4@8;t1,2@8" --kernel-down "1,4;t1:1;t1:1@8;t1:2@8" \
  --tag=-kernels --budget-s 90 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-150; grep -iE "error|Traceback" $W/kernels.txt | head -3; snap
for n in fp32:$FP tc8:$TC8; do
  (cd /tmp && timeout 40 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1 \
    --gemv-tiles "${n#*:}" --tag=-apply-${n%%:*} > $W/apply-${n%%:*}.txt 2>&1)
  echo "apply ${n%%:*} rc $? $(grep ^apply $W/apply-${n%%:*}.txt | tr '\n' '|')"
done; snap
