#!/usr/bin/env bash
# Session 33, call 2 (issue 13): the fp32 GEMV with its activations not staged (GemvTile staged=False, the probe's
# `d`: each lane loads its own with the codes, no shared memory, no barrier; inter in bf16 for such a down).
# 1. numerics of an unstaged pair + each kernel alone; 2. the public call eager: default, the best fp32 pair by the
# kernels (flushed + hot) and by hot alone; 3. the GEMV GPU tests.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s33-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
NEW="d1,8,1,2/d1,4,1,3@128"
(cd /tmp && timeout 170 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$NEW" --kernel-gate-up "1,8;d1,8;d1,8,1,2;d2,8;d2,4;d1,4;d2,4,1,2@128" \
  --kernel-down "1,4;1,4,1,2@128;d1,4;d1,4,1,2@128;d1,4,1,3@128;d1,2;d1,2,1,3@128;d2,4,1,2@128" \
  --tag=-kernels --budget-s 155 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-120; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
PAIRS=$(python3 -c "
import json
k = json.load(open('$W/moe_gemv_probe-kernels.json'))['kernels']
def best(g, key):
    rows = [r for r in k if r['gemm'] == g and not r['variant'].startswith('t') and r.get('flushed_us')]
    return min(rows, key=key)['variant']
s = lambda r: r['flushed_us'] + r['hot_us']
h = lambda r: r['hot_us']
a, b = best('gate_up', s) + '/' + best('down', s), best('gate_up', h) + '/' + best('down', h)
print(f'sum:{a}' if a == b else f'sum:{a} hot:{b}')
" 2>/dev/null || echo "sum:$NEW"); echo "best fp32 pairs: $PAIRS"
for n in default:1,8/1,4 $PAIRS; do
  (cd /tmp && timeout 40 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-220)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "gemv" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
