#!/usr/bin/env bash
# Session 35, call 5 (issue 13): the public call eager at one token with the GEMV down releasing the next grid when
# its programs end (GEMV_DOWN_LATE_RELEASE) against after its grid wait, the default pair and the f16 pair, in turns.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call5/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w5; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w5; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
i=0
for C in "False|1,8/d1,4,1,3@128" "True|1,8/d1,4,1,3@128" "False|i1,8/pi1,8" "True|i1,8/pi1,8"; do
  i=$((i + 1)); L=${C%%|*}; G=${C#*|}; n=$i-$L-$(echo "$G" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 -c "
import sys; sys.path.insert(0, '$R/tools')
from tokenspeed_kernel_nvidia.hopper.moe import layer
layer.GEMV_DOWN_LATE_RELEASE = $L
import moe_gemv_probe as p
sys.exit(p.main(['--out', '$W', '--stages', 'eager', '--default-gemv', '--experts', '32', '--gemv-tiles', '$G',
                 '--tag=-eager-$n']))
" > $W/eager-$n.txt 2>&1)
  echo "eager late=$L $G rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-160)"; snap
done
