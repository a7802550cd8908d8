#!/usr/bin/env bash
# Session 34, call 1 (issue 13): the GEMV with f16 pairs (GemvTile dot "f16": e4m3 decode, "f16i": integer decode;
# probe prefixes h / i; p: a down program a pair, GemvTile pairs) against the fp32 default: 1. each gate/up and down tile alone (20B, one token); 2. numerics
# of the f16i pair; 3. moe_apply alone at 1-2 tokens; 4. the public call eager; 5. the GPU tests' f16/pairs cases.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s34-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 130 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 \
  --kernel-gate-up "1,8;i1,8;h1,8;i2,8;i2,4" \
  --kernel-down "d1,4,1,3@128;pi1,8;ph1,8;pd1,4,1,3@128;pi2,8" \
  --tag=-kernels --budget-s 100 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
for G in "i1,8/pi1,8"; do
  n=$(echo "$G" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 --gemv-tiles "$G" \
    --tag=-num-$n > $W/num-$n.txt 2>&1)
  echo "numerics $G rc $?"; grep ^numerics $W/num-$n.txt | cut -c1-230; snap
done
for G in "" "i1,8/pi1,8" "h1,8/ph1,8"; do
  n=$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 45 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1,2 \
    ${G:+--gemv-tiles "$G"} --tag=-apply-$n > $W/apply-$n.txt 2>&1)
  echo "apply $n rc $?"; grep -E "^apply" $W/apply-$n.txt | grep -v " mma "; snap
done
i=0
for G in "" "i1,8/pi1,8" "" "i1,8/pi1,8"; do
  i=$((i + 1)); n=$i-$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 40 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "f16 or pairs" > $W/t-f16.txt 2>&1)
echo "tests f16 rc $? | $(tail -1 $W/t-f16.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-f16.txt | cut -c1-300 | head -8; snap
