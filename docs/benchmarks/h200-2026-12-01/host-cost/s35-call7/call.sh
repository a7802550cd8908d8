#!/usr/bin/env bash
# Session 35, call 7 (issue 13): PREPARED, NOT RUN (no device time left). The fp32 gate/up with the f16i pairs down,
# its slots summed by the combine launch (GEMV_FUSED_COMBINE off, the default since call 6), against the default pair:
# 1. the public call eager at one token, A B A B; 2. the same with the pairs down fused, once (call 6's 3 us); 3. the
# GPU tests of the default tiles at one and two tokens and of the pairs downs.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call7/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w7; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w7; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
i=0
for C in "False|1,8/d1,4,1,3@128" "False|1,8/pi1,8" "False|1,8/d1,4,1,3@128" "False|1,8/pi1,8" "True|1,8/pi1,8"; do
  i=$((i + 1)); F=${C%%|*}; G=${C#*|}; n=$i-$F-$(echo "$G" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 -c "
import sys; sys.path.insert(0, '$R/tools')
from tokenspeed_kernel_nvidia.hopper.moe import layer
layer.GEMV_FUSED_COMBINE = $F
import moe_gemv_probe as p
sys.exit(p.main(['--out', '$W', '--stages', 'eager', '--default-gemv', '--experts', '32', '--gemv-tiles', '$G',
                 '--tag=-eager-$n']))
" > $W/eager-$n.txt 2>&1)
  echo "eager fused=$F $G rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-160)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "(canonical and (T1 or T2) and (gemv or pairs) and not f16_tiles) or pairs_down_sums" > $W/t.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t.txt | cut -c1-300 | head -8; snap
