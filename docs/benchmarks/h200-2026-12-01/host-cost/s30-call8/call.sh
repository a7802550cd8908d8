#!/usr/bin/env bash
# Session 30, call 8 (issue 13): the GPT-OSS-20B decode step (24 layers, batch 1, prepared calls; host_probe.py),
# eager and CUDA graph, with the shipped default (the GEMV kernel at one token: on an H100 the plan keeps the
# canonical layout), then with the MMA decode path (GEMV_MAX_TOKENS = 0), one process each.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s30-call8/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for cfg in gemv mma; do
  M=2; [ $cfg = mma ] && M=0
  (cd $R && timeout 75 python3 -c "
import runpy, sys
import tokenspeed_kernel_nvidia.hopper.moe.layer as L
L.GEMV_MAX_TOKENS = $M
sys.argv = ['host_probe.py', '--skip-ops', '--layers', '24', '--decode-configs', 'full+prepared', '--rounds', '3',
            '--out', '$W/step-$cfg']
runpy.run_path('tools/host_probe.py', run_name='__main__')
" > $W/step-$cfg.txt 2>&1)
  echo "step $cfg rc $? | $(grep -E '^host proxy|^full' $W/step-$cfg.txt | cut -c1-160 | tr '\n' '|')"; snap
done
