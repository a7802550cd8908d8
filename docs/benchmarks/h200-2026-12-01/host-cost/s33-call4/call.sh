#!/usr/bin/env bash
# Session 33, call 4 (issue 13): PREPARED, NOT RUN (no device time was left). Before running it, carry the anchor's
# wheel too:  bash ../shared/tools/gpu-wheels.sh .whl && bash ../shared/tools/gpu-wheels.sh .whl tokenspeed-triton-kernels
# (drop tokenspeed-fa3 from .whl if the carry passes 64 MiB: this call does not use it).
# 1. the public call eager at one token, session 30's pair and the new default in alternating processes (A B A B),
#    to tell the new pair's bimodal rounds (call 3, warm 2) from the host's drift; 2. the GPT-OSS-20B decode step
#    eager and in a graph with either pair (the eager/graph ratio with the new default); 3. the anchor.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s33-call4/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
for n in old1:1,8/1,4 new1: old2:1,8/1,4 new2: ; do
  G=${n#*:}; (cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-${n%%:*} > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-240)"; snap
done
for cfg in new old; do
  (cd $R && timeout 75 python3 -c "
import runpy, sys
import tokenspeed_kernel_nvidia.hopper.moe.layer as L
if '$cfg' == 'old':
    L.GEMV_TILES = (L.GemvTile(1, 8), L.GemvTile(1, 4))
sys.argv = ['host_probe.py', '--skip-ops', '--layers', '24', '--decode-configs', 'full+prepared', '--rounds', '3',
            '--out', '$W/step-$cfg']
runpy.run_path('tools/host_probe.py', run_name='__main__')
" > $W/step-$cfg.txt 2>&1)
  echo "step $cfg rc $? | $(grep -E '^host proxy|^full' $W/step-$cfg.txt | cut -c1-160 | tr '\n' '|')"; snap
done
(mkdir -p $W/tk && cd $W/tk && OUT=$W/tk timeout 80 python3 $R/.anchors/tk_moe.py --tokens 1 > tk.log 2>&1)
echo "tk rc $?"; tail -4 $W/tk/tk.log; snap
