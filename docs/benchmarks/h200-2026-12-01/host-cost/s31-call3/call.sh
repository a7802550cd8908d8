#!/usr/bin/env bash
# Session 31, call 3 (issue 13): 1. ncu of the tensor-core GEMV launches at one token (why it streams at ~1.2 TB/s);
# 2. the fp32 GEMV gate/up with the tensor-core down (inter bf16 now on both paths): numerics, moe_apply alone at one
# token against the fp32 pair, the GPU tests of forced mixed and TC tiles, then the public call eager for both; 3. ncu of the fp32 GEMV for comparison.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s31-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MIX="1,8,1/t1:1"; FP="1,8,1/1,4"
(cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 --gemv-tiles "$MIX" \
  --tag=-numerics-mix > $W/numerics-mix.txt 2>&1); echo "numerics mix rc $?"; grep "^numerics" $W/numerics-mix.txt | cut -c1-170; snap
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 90 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "mixed_gemv or tc_tiles" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
for n in fp32:$FP mix:$MIX; do
  (cd /tmp && timeout 50 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1 \
    --gemv-tiles "${n#*:}" --tag=-apply-${n%%:*} > $W/apply-${n%%:*}.txt 2>&1)
  echo "apply ${n%%:*} rc $? $(grep ^apply $W/apply-${n%%:*}.txt | tr '\n' '|')"
done; snap
for n in fp32:$FP mix:$MIX; do
  (cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-230)"
done; snap
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
SECS="--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
(cd /tmp && timeout 100 $NCU --profile-from-start off --clock-control none -k regex:moe_gemv $SECS python3 \
  $R/tools/ncu_moe.py --tokens 1 --gemv "t1,4/t1:1" > $W/ncu-tc.txt 2>&1); echo "ncu rc $?"
grep -E "moe_gemv|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|DRAM Throughput|Memory Throughput|Eligible Warps|Active Warps Per|No Eligible|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" $W/ncu-tc.txt | head -50 | cut -c1-150; snap
(cd /tmp && timeout 70 $NCU --profile-from-start off --clock-control none -k regex:moe_gemv $SECS python3 \
  $R/tools/ncu_moe.py --tokens 1 --gemv "1,8,1/1,4" > $W/ncu-fp32.txt 2>&1); echo "ncu fp32 rc $?"
grep -E "moe_gemv|Duration|DRAM Throughput|Memory Throughput|Eligible Warps|No Eligible|L2 Hit|Mem Busy|Max Bandwidth" $W/ncu-fp32.txt | head -30 | cut -c1-150; snap
