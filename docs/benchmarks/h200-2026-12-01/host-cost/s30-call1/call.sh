#!/usr/bin/env bash
# Session 30, call 1 (issue 13): the GEMV path of hopper.moe_apply (hopper/moe/gemv.py) against the MMA decode path.
# 1. tools/moe_gemv_probe.py: numerics, moe_apply alone (20B and 120B layers, 1 and 2 tokens), the tile sweep, the
#    layer (route + apply);
# 2. the public tk.moe_apply eager back to back at one token: MMA path, then GEMV path (the sweep's best), one
#    process each, twice, alternated;
# 3. the triton_kernels anchor at one token (.anchors/tk_moe.py, 120B layer).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s30-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd /tmp && timeout 200 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,apply,sweep,layer \
  --budget-s 170 > $W/probe.txt 2>&1)
echo "probe rc $?"; grep -E "^(numerics|apply|best|layer)" $W/probe.txt | cut -c1-330
BEST=$(python3 -c "import json;print(json.load(open('$W/moe_gemv_probe.json')).get('best','2,4/4'))")
grep "^sweep" $W/probe.txt | tr '\n' '|'; echo
for r in 1 2; do
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --tag -mma-$r > $W/eager-mma-$r.txt 2>&1)
  echo "eager mma $r rc $? $(grep ^eager $W/eager-mma-$r.txt | cut -c1-200 | tr '\n' '|')"
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "$BEST" \
    --tag -gemv-$r > $W/eager-gemv-$r.txt 2>&1)
  echo "eager gemv $r rc $? $(grep ^eager $W/eager-gemv-$r.txt | cut -c1-200 | tr '\n' '|')"
done
(mkdir -p $W/tk && cd $W/tk && OUT=$W/tk timeout 120 python3 $R/.anchors/tk_moe.py --tokens 1 > tk.log 2>&1)
echo "tk rc $?"; tail -5 $W/tk/tk.log | cut -c1-250
