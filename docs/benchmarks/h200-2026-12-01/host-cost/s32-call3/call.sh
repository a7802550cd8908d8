#!/usr/bin/env bash
# Session 32, call 3 (issue 13): where the GEMV launches' time goes, instruction by instruction. ncu's warp-state
# sampling (SourceCounters) of the one-token layer call with the fp32 GEMV pair (the default) and the unsplit TC
# pair, exported per SASS instruction (--page source), for the next kernel's design.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s32-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"; $NCU --version | tail -1
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis"
for n in fp32:1,8,1/1,4 tc:t1,4/t1:1; do
  tag=${n%%:*}
  (cd /tmp && timeout 100 $NCU --profile-from-start off --clock-control none -k regex:moe_gemv $SECS --import-source no \
    -o $W/ncu-$tag python3 $R/tools/ncu_moe.py --tokens 1 --gemv "${n#*:}" > $W/ncu-$tag.log 2>&1); echo "ncu $tag rc $?"
  (timeout 40 $NCU -i $W/ncu-$tag.ncu-rep --page details > $W/ncu-$tag-details.txt 2>&1); echo "details rc $?"
  (timeout 40 $NCU -i $W/ncu-$tag.ncu-rep --page source --csv --print-source sass > $W/ncu-$tag-sass.csv 2>&1)
  echo "source rc $? $(wc -l < $W/ncu-$tag-sass.csv) lines"; head -c 600 $W/ncu-$tag-sass.csv; echo
  grep -E "moe_gemv|Duration|Warp Cycles Per Issued|Achieved Active Warps|DRAM Throughput|Registers Per" $W/ncu-$tag-details.txt | head -14
  snap
done
