#!/usr/bin/env bash
# Session 33, call 1 (issue 13): the fp32 GEMV requesting steps ahead (GemvTile ahead, maxnreg) and session 32's
# prepared TC gate/up (next trip's loads first, maxnreg 168).
# 1. numerics of a ring pair + each kernel alone; 2. the public call eager: default, the best fp32 pair by the
# kernels (flushed + hot), the TC@168 gate/up with that down; 3. the GEMV GPU tests.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s33-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
RING="1,8,1,2@128/1,4,1,3@128"
(cd /tmp && timeout 150 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$RING" --kernel-gate-up "1,8;1,8,1,2;1,8@128;1,8,1,2@128;1,8,2,3@128;t1,4;t1,4@168" \
  --kernel-down "1,4;1,4@128;1,4,1,2@128;1,4,1,3@128;1,4,1,4@128;1,4,1,3" --tag=-kernels --budget-s 135 \
  > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-120; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
PAIR=$(python3 -c "
import json
k = json.load(open('$W/moe_gemv_probe-kernels.json'))['kernels']
def best(g):
    rows = [r for r in k if r['gemm'] == g and not r['variant'].startswith('t') and r.get('flushed_us')]
    return min(rows, key=lambda r: r['flushed_us'] + r['hot_us'])['variant']
print(best('gate_up') + '/' + best('down'))
" 2>/dev/null || echo "$RING"); echo "best fp32 pair: $PAIR"
for n in default:1,8/1,4 best:$PAIR tc168:t1,4@168/${PAIR#*/}; do
  (cd /tmp && timeout 40 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-220)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "gemv or tc_" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
