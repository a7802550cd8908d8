#!/usr/bin/env bash
# Session 34, call 3 (issue 13): PREPARED, NOT RUN (the device time ran out). The f16 pair (i1,8 / pi1,8) against
# the default fp32 pair: 1. the probe's nine numerics cases for it (call 2 ran six before its time limit; the
# activations times 2**20 are the case a float64 emulation expects to fail: SwiGLU's clamp and the f16 rounding);
# 2. the public call eager, A B A B; 3. the GPU tests of the f16 and pairs cases and the table's 1-2 token cases.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s34-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 100 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "i1,8/pi1,8" --tag=-num > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-230; snap
i=0
for G in "" "i1,8/pi1,8" "" "i1,8/pi1,8"; do
  i=$((i + 1)); n=$i-$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  $T/test_hopper_moe_pdl.py -k "(canonical and (T1 or T2) and not tc_ and not split and not mixed) or (pdl and 120b_T1)" \
  > $W/t.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t.txt | cut -c1-300 | head -8; snap
