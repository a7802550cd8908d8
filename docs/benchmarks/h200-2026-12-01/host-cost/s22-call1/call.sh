#!/usr/bin/env bash
# session 22, call 1 (issue 13): hopper.moe_apply's decode GEMMs with register caps (DecodeTile.maxnreg) and more
# K splits to fill the SM (tools/moe_regcap_probe.py: each GEMM alone, numerics, the layer in turns); then the
# GPT-OSS-20B decode step with the table's tiles and with the tiles capped at 168 registers, in alternated processes.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 430 python3 tools/moe_regcap_probe.py --out $W --tokens 1,4,2 --rounds 2 --budget-s 400 \
  --gate-up "32,8,1,8,1,0,168;32,8,1,8,1,0,128;32,8,1,6,2,0,128;32,8,1,6,2,0,168;32,8,1,4,4,0,128;32,8,1,4,3,0,128" \
  --down "32,8,1,4,4,0,168;32,8,1,4,4,0,128;32,8,1,4,6,0,128;32,8,1,4,8,0,128" > $W/probe.txt 2>&1
echo "probe rc $?"; grep -E "^(gemm|numerics|layer)" $W/probe.txt | cut -c1-120 | awk '{printf "%s | ", $0} END {print ""}'
tail -2 $W/probe.txt | cut -c1-300
for run in t168 t0; do
  cap=${run:1}
  timeout 50 python3 -c "
import runpy, sys
from tokenspeed_kernel_nvidia.hopper.moe import layer
cap = $cap or None
layer.DECODE_TILES = tuple((b, tuple(layer.DecodeTile(*v[:6], cap) for v in tiles)) for b, tiles in layer.DECODE_TILES)
sys.argv = ['host_probe.py', '--out', '$W/step-$run', '--skip-ops', '--layers', '24', '--decode-configs', 'full+prepared', '--rounds', '2']
runpy.run_path('tools/host_probe.py', run_name='__main__')" > $W/step-$run.txt 2>&1
  echo "step $run rc $?"; grep -E "^full|proxy" $W/step-$run.txt | cut -c1-200 | head -4
done
