#!/usr/bin/env bash
# session 6, call 1: per-launch device times of the MoE layer (graph replay) and ncu of 1 and 64 tokens
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -3 $OUT/setup.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$PWD
cd /tmp
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
mkdir -p $OUT/r
timeout 120 python3 $R/tools/ncu_moe.py --graphs --tokens 1,2,4,8,64,512 --json $OUT/r/hopper-breakdown.json 2>&1 | tee $OUT/r/hopper-breakdown.log | grep "sum of"
timeout 90 python3 $R/tools/ncu_moe.py --graphs --tokens 1,8,64,512 --kernel triton_kernels.moe_apply --json $OUT/r/tk-breakdown.json 2>&1 | tee $OUT/r/tk-breakdown.log | grep "sum of"
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
timeout 150 $NCU --profile-from-start off --clock-control none $SECS python3 $R/tools/ncu_moe.py --tokens 1 > $OUT/r/ncu-1.txt 2>&1; echo "ncu 1: $?"
timeout 150 $NCU --profile-from-start off --clock-control none -k regex:moe_ $SECS python3 $R/tools/ncu_moe.py --tokens 64 > $OUT/r/ncu-64.txt 2>&1; echo "ncu 64: $?"
grep -E "moe_|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|DRAM Throughput|Theoretical Occupancy" $OUT/r/ncu-1.txt | head -80
cd $OUT && tar czf r.tgz r && rm -rf r
