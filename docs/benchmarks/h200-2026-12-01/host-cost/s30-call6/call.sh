#!/usr/bin/env bash
# Session 30, call 6 (issue 13): the GEMV kernel with three steps (a pass of a sub-tile) of codes in flight a program
# instead of one (AHEAD = 3), measured as call 5 measured the one-step version:
# 1. moe_gemv_probe.py numerics and each kernel alone (tile variants); 2. moe_apply alone at 1 and 2 tokens (20B and
#    120B), the tile sweep, the layer; 3. eager (MMA / GEMV, twice); 4. per-launch times (ncu_moe --graphs).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s30-call6/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd /tmp && timeout 150 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --tag=-kernels --budget-s 120 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-250; snap
(cd /tmp && timeout 170 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply,sweep,layer --experts 32,128 \
  --tokens 1,2 --budget-s 150 > $W/probe.txt 2>&1)
echo "probe rc $?"; grep -E "^(apply|best|layer)" $W/probe.txt | cut -c1-250
grep "^sweep" $W/probe.txt | tr '\n' '|'; echo; snap
BEST=$(python3 -c "import json;print(json.load(open('$W/moe_gemv_probe.json')).get('best','1,8,1/1,4'))")
for r in 1 2; do
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --tag=-mma-$r --experts 32 \
    > $W/eager-mma-$r.txt 2>&1)
  echo "eager mma $r rc $? $(grep ^eager $W/eager-mma-$r.txt | cut -c1-200 | tr '\n' '|')"
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "$BEST" \
    --tag=-gemv-$r --experts 32 > $W/eager-gemv-$r.txt 2>&1)
  echo "eager gemv $r rc $? $(grep ^eager $W/eager-gemv-$r.txt | cut -c1-200 | tr '\n' '|')"
done; snap
(cd /tmp && timeout 60 python3 $R/tools/ncu_moe.py --graphs --tokens 1 --gemv "$BEST" --json $W/gemv-breakdown.json \
  > $W/gemv-breakdown.txt 2>&1); echo "breakdown gemv rc $?"; grep "tokens" $W/gemv-breakdown.txt | cut -c1-160; snap
