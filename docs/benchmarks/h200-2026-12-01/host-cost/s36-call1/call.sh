#!/usr/bin/env bash
# Session 36, call 1 (issue 13): the GEMV path's L2 prefetches (layer.GEMV_PREFETCH "own" / "down",
# GEMV_EVICT_FIRST) with the default pair and with 1,8/pi1,8 (fp32 gate/up, f16i pairs down, combine launch), and
# the exact fp32 pairs downs p1,8 / pd1,8 with the combine launch (session 35 timed them only fused):
# 1. the public call eager at one token (20B), two rounds (and the TC integer gate/up with both prefetches, and
#    direct launches instead of the layer's eager graph); 2. between the rounds, each GEMV kernel alone with and
#    without its own prefetch, flushed / hot (gate/up sub-tiles too); 3. moe_apply alone, flushed / hot;
# 4. the GPU tests of the GEMV and pairs cases with the prefetches on; 5. on an H200, the triton_kernels anchor.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s36-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w1; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w1; }
GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader); echo "$GPU"
probe() {  # probe NAME "LAYER SETTINGS (python)" TILES STAGE [probe args]
  local n=$1 set=$2 g=$3 st=$4; shift 4
  (cd /tmp && timeout $([ $st = kernels ] && echo 75 || echo 45) python3 -c "
import sys; sys.path.insert(0, '$R/tools')
from tokenspeed_kernel_nvidia.hopper.moe import layer
$set
import moe_gemv_probe as p
sys.exit(p.main(['--out', '$W', '--stages', '$st', '--default-gemv', '--experts', '32', '--tokens', '1',
                 '--gemv-tiles', '$g', '--tag=-$st-$n'] + sys.argv[1:]))
" "$@" > $W/$st-$n.txt 2>&1)
  echo "$st $n rc $? $(grep -E "^(eager|apply|kernel)" $W/$st-$n.txt | sed 's/\"rounds_us.*graph/graph/' | cut -c1-170)"; snap
}
D=1,8/d1,4,1,3@128; P=1,8/pi1,8; X=1,8/p1,8; Y=1,8/pd1,8
NONE="pass"; DOWN="layer.GEMV_PREFETCH = ('down',)"; BOTH="layer.GEMV_PREFETCH = ('own', 'down')"
GU="1,8;1,8,2;1,8,3;1,4,6;ti1,4@168;ti1,4:2@128"; DN="d1,4,1,3@128;pi1,8;p1,8;pd1,8"
probe A1 "$NONE" $D eager
probe B1 "$DOWN" $D eager
probe C1 "$BOTH" $D eager
probe D1 "$NONE" $P eager
probe F1 "$BOTH" $P eager
probe X1 "$NONE" $X eager  # fp32 pairs down, the combine launch: an exact pair
probe Y1 "$NONE" $Y eager
probe G1 "$BOTH; layer.GEMV_EVICT_FIRST = True" $P eager
probe H1 "layer.GRAPH_MAX_TOKENS = 0" $D eager  # direct launches (programmatic launch across calls)
probe I1 "$BOTH; layer.GRAPH_MAX_TOKENS = 0" $P eager
probe T1 "$BOTH" ti1,4@168/d1,4,1,3@128 eager
probe K-none "$NONE" $D kernels --kernel-gate-up "$GU" --kernel-down "$DN"
probe K-own "layer.GEMV_PREFETCH = ('own',)" $D kernels --kernel-gate-up "$GU" --kernel-down "$DN"
probe A2 "$NONE" $D eager
probe C2 "$BOTH" $D eager
probe D2 "$NONE" $P eager
probe F2 "$BOTH" $P eager
probe X2 "$NONE" $X eager
probe Y2 "$NONE" $Y eager
probe A "$NONE" $D apply --skip-mma
probe F "$BOTH" $P apply --skip-mma
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 150 python3 -c "
import sys, pytest
from tokenspeed_kernel_nvidia.hopper.moe import layer
layer.GEMV_PREFETCH = ('own', 'down')
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rfEs', '--tb=short', '-m', 'gpu', '$T/test_hopper_moe.py', '-k',
    '(canonical and (T1 or T2) and (gemv or pairs) and not f16_tiles) or pairs_down_sums or l2_prefetches']))
" > $W/t.txt 2>&1)
echo "tests (prefetch own,down) rc $? | $(tail -1 $W/t.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t.txt | cut -c1-300 | head -8; snap
case "$GPU" in *H200*)
  (cd /tmp && timeout 90 python3 $R/.anchors/tk_moe.py --tokens 1 > $W/anchor.txt 2>&1); echo "anchor rc $? $(tail -2 $W/anchor.txt)"; snap;;
esac
