#!/usr/bin/env bash
# Session 32, call 1 (issue 13): the tensor-core GEMV with K split across warps in the gate/up too, and its activation
# staging in pieces (down: 167 -> 96-100 registers at sm90): 1. numerics + each kernel alone (tile sweep);
# 2. the TC GPU tests; 3. moe_apply alone and the public call eager, fp32 GEMV against the sweep's best TC pair.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s32-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
TC="t1,2:2/t1:2"
(cd /tmp && timeout 200 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$TC" --kernel-gate-up "1,8,1;t1,4;t1,4:2;t1,2:2;t1,1:2;t1,1:4;t1,2:4;t1,4:4;t2,2:2;t2,1:4" \
  --kernel-down "1,4;t1:1;t1:2;t1:4;t2:2;t2:4" --tag=-kernels --budget-s 170 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-200; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
BEST=$(python3 -c "
import json
k = json.load(open('$W/moe_gemv_probe-kernels.json'))['kernels']
def best(g):
    rows = [r for r in k if r['gemm'] == g and r['variant'].startswith('t') and r.get('flushed_us')]
    return min(rows, key=lambda r: r['flushed_us'] + r['hot_us'])['variant'] if rows else None
gu, dn = best('gate_up'), best('down')
print(f'{gu}/{dn}' if gu and dn else '$TC')
" 2>/dev/null || echo "$TC"); echo "best TC pair: $BEST"
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 110 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "tc_ or mixed_gemv" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
(cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,apply --experts 32 --tokens 1,2 \
  --gemv-tiles "$BEST" --tag=-apply-best > $W/apply-best.txt 2>&1)
echo "apply best rc $?"; grep -E "^(numerics|apply)" $W/apply-best.txt | cut -c1-200; snap
for n in fp32:1,8,1/1,4 tc:$BEST; do
  (cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-230)"
done; snap
