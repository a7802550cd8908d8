#!/usr/bin/env bash
# Session 36, call 2 (issue 13): the GPT-OSS-20B decode step (24 layers, batch 1, prepared calls) eager and in a CUDA
# graph with the default GEMV path and with NEW (default: both L2 prefetches, layer.GEMV_PREFETCH = ("own", "down")),
# in turns (the eager/graph ratio; the step's weights come from HBM, where the prefetches are meant to help);
# then each launch's device time in a replayed graph of one layer call, and the triton_kernels anchor. NEW comes from
# SETTINGS (python run after importing the layer), e.g. SETTINGS="layer.GEMV_TILES = (layer.GemvTile(1, 8), layer.GemvTile(1, 8, pairs=True))".
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s36-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w2; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w2; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
NEW=${SETTINGS:-"layer.GEMV_PREFETCH = ('own', 'down')"}
for cfg in old1 new1 old2 new2; do
  case $cfg in old*) S="pass";; *) S="$NEW";; esac
  (cd $R && timeout 90 python3 -c "
import runpy, sys
import tokenspeed_kernel_nvidia.hopper.moe.layer as layer
$S
sys.argv = ['host_probe.py', '--skip-ops', '--layers', '24', '--decode-configs', 'full+prepared', '--rounds', '3',
            '--out', '$W/step-$cfg']
runpy.run_path('tools/host_probe.py', run_name='__main__')
" > $W/step-$cfg.txt 2>&1)
  echo "step $cfg rc $? | $(grep -E '^host proxy|^full' $W/step-$cfg.txt | cut -c1-160 | tr '\n' '|')"; snap
done
# Each launch's device time in a replayed graph of route + apply (120B shapes, one token, weights in L2; torch
# profiler, 20 replays), the default pair and 1,8/pi1,8 and 1,8/p1,8, without and with both prefetches.
for c in "D|1,8/d1,4,1,3@128|pass" "DP|1,8/d1,4,1,3@128|$NEW" "P|1,8/pi1,8|pass" "PP|1,8/pi1,8|$NEW" "X|1,8/p1,8|pass"; do
  n=${c%%|*}; r=${c#*|}; g=${r%%|*}; S=${r#*|}
  (cd $R && timeout 60 python3 -c "
import runpy, sys
import tokenspeed_kernel_nvidia.hopper.moe.layer as layer
$S
sys.argv = ['ncu_moe.py', '--tokens', '1', '--gemv', '$g', '--graphs', '--json', '$W/graphs-$n.json']
runpy.run_path('tools/ncu_moe.py', run_name='__main__')
" > $W/graphs-$n.txt 2>&1)
  echo "graphs $n rc $? | $(grep -E 'us' $W/graphs-$n.txt | cut -c1-110 | tr '\n' '|')"; snap
done
# The triton_kernels anchor (120B layer, one token) on the same machine.
(cd /tmp && timeout 90 python3 $R/.anchors/tk_moe.py --tokens 1 > $W/anchor.txt 2>&1); echo "anchor rc $? $(tail -2 $W/anchor.txt)"; snap
