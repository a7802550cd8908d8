#!/usr/bin/env bash
# session 14, call 4 (what bounds the prefill GEMMs at 1024-2048 tokens, and the one-token decode GEMMs): per-launch
# device times of a graph of route + apply (torch profiler, no L2 flush) at 1, 1024, 2048 tokens, then ncu on one
# call of the packed kernel (the table's layout) at 1024 and 2048 tokens and at 1 token (the GEMMs only).
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
K=hopper.moe_apply_packed
timeout 90 python3 $R/tools/ncu_moe.py --graphs --tokens 1,1024,2048 --kernel $K --json $OUT/r/graphs.json \
  > $OUT/r/graphs.log 2>&1; echo "graphs rc $?"; cat $OUT/r/graphs.log | cut -c1-110
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); echo "ncu: $NCU"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
timeout 240 $NCU --clock-control none --profile-from-start off -k regex:"moe_prefill_gemm|moe_decode_gemm" $SECTIONS \
  python3 $R/tools/ncu_moe.py --tokens 1024,2048,1 --kernel $K > $OUT/r/ncu.txt 2>&1; echo "ncu rc $?"
grep -E "moe_.*_gemm \(|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|No Eligible|Theoretical Occ" $OUT/r/ncu.txt | head -80
cd $OUT && tar czf r.tgz r && rm -rf r
