#!/usr/bin/env bash
# Session 33, call 3 (issue 13): the new default down tile (GEMV_TILES = 1,8 / d1,4,1,3@128: unstaged, three steps
# ahead, 128 registers) against session 30's pair (1,8 / 1,4): 1. down tiles around the new one, each alone;
# 2. the public call eager, 20B and 120B; 3. the triton_kernels anchor; 4. the hopper MoE GPU tests at 1-2 tokens
# and the GEMV cases (both layouts), and PDL on/off; 5. moe_apply alone at 1-2 tokens, 20B and 120B.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s33-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
OLD="1,8/1,4"
(cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 --kernel-gate-up "1,8" \
  --kernel-down "1,4;d1,4,1,3@128;d1,4,1,4@128;d1,4,1,4@160;d1,2,1,4@128" \
  --tag=-kernels --budget-s 50 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
for n in new: old:$OLD; do
  G=${n#*:}; (cd /tmp && timeout 50 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32,128 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-${n%%:*} > $W/eager-${n%%:*}.txt 2>&1)
  echo "eager ${n%%:*} rc $?"; grep ^eager $W/eager-${n%%:*}.txt | cut -c1-200; snap
done
(mkdir -p $W/tk && cd $W/tk && OUT=$W/tk timeout 70 python3 $R/.anchors/tk_moe.py --tokens 1 > tk.log 2>&1)
echo "tk rc $?"; tail -4 $W/tk/tk.log; snap
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  $T/test_hopper_moe_pdl.py -k "T1 or T2 or gemv or pdl" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
for n in new: old:$OLD; do
  G=${n#*:}; (cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32,128 --tokens 1,2 \
    ${G:+--gemv-tiles "$G"} --tag=-apply-${n%%:*} > $W/apply-${n%%:*}.txt 2>&1)
  echo "apply ${n%%:*} rc $?"; grep -E "^apply" $W/apply-${n%%:*}.txt; snap
done
