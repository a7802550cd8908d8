#!/usr/bin/env bash
# Session 32, call 2 (issue 13): the activation staging back to one load a range (call 1's pieces cost 3-5 us a
# launch; sm90 SASS of every KSPLIT-1 launch now equal to session 31's), K split kept in the gate/up:
# 1. numerics of a gate/up split pair + each kernel alone; 2. the TC GPU tests; 3. moe_apply alone and the public
# call eager, fp32 GEMV against the best TC pair.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s32-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
TC="t1,2:2/t1:2"
(cd /tmp && timeout 130 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$TC" --kernel-gate-up "1,8,1;t1,4;t1,1:2;t1,2:2;t1,1:4;t2,2:2" \
  --kernel-down "1,4;t1:1;t1:2" --tag=-kernels --budget-s 110 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-120; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
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
(cd /tmp && timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "tc_ or mixed_gemv" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
(cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1 \
  --gemv-tiles "$BEST" --tag=-apply-best > $W/apply-best.txt 2>&1)
echo "apply best rc $?"; grep -E "^apply" $W/apply-best.txt | cut -c1-200; snap
for n in fp32:1,8,1/1,4 tc:$BEST; do
  (cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "${n#*:}" \
    --tag=-eager-${n%%:*} --experts 32 > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $? $(grep ^eager $W/eager-${n%%:*}.txt | cut -c1-200)"
done; snap
