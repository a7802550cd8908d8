#!/usr/bin/env bash
# Session 35, call 3 (issue 13), on the warm machine: the pairs downs with their slots summed by the combine launch
# (GEMV_FUSED_COMBINE False) and by their last program (True), taking turns, each alone (20B, one token).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w3; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w3; }
i=0
for F in False True False True; do
  i=$((i + 1))
  (cd /tmp && timeout 60 python3 -c "
import sys; sys.path.insert(0, '$R/tools')
from tokenspeed_kernel_nvidia.hopper.moe import layer
layer.GEMV_FUSED_COMBINE = $F
import moe_gemv_probe as p
sys.exit(p.main(['--out', '$W', '--stages', 'kernels', '--experts', '32', '--kernel-gate-up', '',
                 '--kernel-down', 'pi1,8;p1,8;d1,4,1,3@128', '--tag=-fused-$i-$F', '--budget-s', '50']))
" > $W/k-$i-$F.txt 2>&1)
  echo "fused $F rc $?"; grep -E "^kernel" $W/k-$i-$F.txt | sed "s/^/fused=$F /"; grep -iE "error|Traceback" $W/k-$i-$F.txt | head -3; snap
done
