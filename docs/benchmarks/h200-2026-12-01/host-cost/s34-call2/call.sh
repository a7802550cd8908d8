#!/usr/bin/env bash
# Session 34, call 2 (issue 13): call 1 cut to fit the device time left (about 300 s): 1. each gate/up and down tile
# alone (20B, one token): the default's, f16i and f16 at one row pair a thread, f16i at two, the pairs downs;
# 2. numerics of i1,8/pi1,8; 3. moe_apply alone at one token; 4. the public call eager, default then i1,8/pi1,8;
# 5. two GPU test cases.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s34-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 80 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 \
  --kernel-gate-up "1,8;i1,8;h1,8;i2,8" --kernel-down "d1,4,1,3@128;pi1,8;ph1,8" \
  --tag=-kernels --budget-s 70 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
(cd /tmp && timeout 40 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "i1,8/pi1,8" --tag=-num > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-230; snap
for G in "" "i1,8/pi1,8"; do
  n=$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1 \
    ${G:+--gemv-tiles "$G"} --tag=-apply-$n > $W/apply-$n.txt 2>&1)
  echo "apply $n rc $?"; grep -E "^apply" $W/apply-$n.txt; snap
done
for G in "" "i1,8/pi1,8"; do
  n=$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "canonical and (gemv_f16i_tiles_T1 or gemv_pairs_tiles_T2)" > $W/t-f16.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t-f16.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-f16.txt | cut -c1-300 | head -8; snap
