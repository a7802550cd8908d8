#!/usr/bin/env bash
# Session 30, call 2 (issue 13): the GEMV path with the next pass's codes, scales and activations requested before a
# pass is decoded and the bias before the first pass, against the MMA decode path:
# 1. moe_gemv_probe.py: numerics, moe_apply alone (20B, 1 token), the tile sweep, the layer;
# 2. per-launch device times (ncu_moe.py --graphs, 120B layer, 1 token), GEMV and MMA;
# 3. the public tk.moe_apply eager back to back at one token, MMA then GEMV, twice;
# 4. ncu sections of the GEMV launches at one token.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s30-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd /tmp && timeout 150 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,apply,sweep,layer --experts 32 \
  --tokens 1 --gemv-tiles "2,4/8" --gate-up "1,4;2,4;2,8;4,2" --down "4;8" --budget-s 120 > $W/probe.txt 2>&1)
echo "probe rc $?"; grep -E "^(numerics|apply|best|layer)" $W/probe.txt | cut -c1-250
BEST=$(python3 -c "import json;print(json.load(open('$W/moe_gemv_probe.json')).get('best','2,4/8'))")
grep "^sweep" $W/probe.txt | tr '\n' '|'; echo
(cd /tmp && timeout 60 python3 $R/tools/ncu_moe.py --graphs --tokens 1 --gemv "$BEST" --json $W/gemv-breakdown.json \
  > $W/gemv-breakdown.txt 2>&1); echo "breakdown gemv rc $?"; grep "tokens" $W/gemv-breakdown.txt | cut -c1-160
(cd /tmp && timeout 60 python3 $R/tools/ncu_moe.py --graphs --tokens 1 --json $W/mma-breakdown.json \
  > $W/mma-breakdown.txt 2>&1); echo "breakdown mma rc $?"; grep "tokens" $W/mma-breakdown.txt | cut -c1-160
for r in 1 2; do
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --tag=-mma-$r --experts 32 \
    > $W/eager-mma-$r.txt 2>&1)
  echo "eager mma $r rc $? $(grep ^eager $W/eager-mma-$r.txt | cut -c1-220 | tr '\n' '|')"
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "$BEST" \
    --tag=-gemv-$r --experts 32 > $W/eager-gemv-$r.txt 2>&1)
  echo "eager gemv $r rc $? $(grep ^eager $W/eager-gemv-$r.txt | cut -c1-220 | tr '\n' '|')"
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
(cd /tmp && timeout 120 $NCU --profile-from-start off --clock-control none -k regex:moe_gemv $SECS python3 \
  $R/tools/ncu_moe.py --tokens 1 --gemv "$BEST" > $W/ncu-gemv.txt 2>&1); echo "ncu rc $?"
grep -E "moe_gemv|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|DRAM Throughput|Eligible Warps|Active Warps Per|No Eligible|Stall" $W/ncu-gemv.txt | head -60 | cut -c1-160
