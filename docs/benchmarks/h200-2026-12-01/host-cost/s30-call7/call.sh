#!/usr/bin/env bash
# Session 30, call 7 (issue 13): the final code (call 5's GEMV kernel, the default up to 2 tokens on canonical weights):
# 1. the Hopper MoE GPU tests that take the GEMV path (the table's 1-token cases, canonical and packed, a forced GEMV
#    case at 5 tokens) and an MMA case, then programmatic launch on/off at one token;
# 2. moe_gemv_probe.py numerics (reference, MMA path, determinism, graph replay);
# 3. the public tk.moe_apply eager back to back at one token: MMA path, then the GEMV path (one process each).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s30-call7/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "120b_T1 or 20b_T3 or gemv_tiles" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR)" $W/t-moe.txt | cut -c1-300 | head -6; snap
(cd /tmp && timeout 80 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe_pdl.py \
  -k "120b_T1 and not w4a8" > $W/t-pdl.txt 2>&1)
echo "tests pdl rc $? | $(tail -1 $W/t-pdl.txt)"; grep -E "^(FAILED|ERROR)" $W/t-pdl.txt | cut -c1-300 | head -4; snap
(cd /tmp && timeout 60 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 --tag=-numerics \
  > $W/numerics.txt 2>&1); echo "numerics rc $?"; grep "^numerics" $W/numerics.txt | cut -c1-240; snap
for p in mma gemv; do
  A=""; [ $p = gemv ] && A="--default-gemv"
  (cd /tmp && timeout 50 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager $A --tag=-$p --experts 32 \
    > $W/eager-$p.txt 2>&1); echo "eager $p rc $? $(grep ^eager $W/eager-$p.txt | cut -c1-200)"
done; snap
