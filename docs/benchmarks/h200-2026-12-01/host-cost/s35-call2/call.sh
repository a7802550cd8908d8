#!/usr/bin/env bash
# Session 35, call 2 (issue 13): the GEMV pair NEW (call 1's fastest, now GEMV_TILES in the tree) against session 33's
# fp32 pair OLD: 1. the probe's nine numerics cases for NEW; 2. moe_apply alone at one token; 3. the public call eager,
# A B A B; 4. the GPU tests of the default tiles at one and two tokens, the PDL order, and the fused pairs sum.
# run(command="NEW=... OLD=... bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
OLD=${OLD:-1,8/d1,4,1,3@128}
(cd /tmp && timeout 110 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "$NEW" --tag=-num > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-230; snap
for G in "$OLD" "$NEW"; do
  n=$(echo "$G" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply --experts 32 --tokens 1 \
    --gemv-tiles "$G" --tag=-apply-$n > $W/apply-$n.txt 2>&1)
  echo "apply $n rc $?"; grep -E "^apply" $W/apply-$n.txt; snap
done
i=0
for G in "$OLD" "$NEW" "$OLD" "$NEW"; do
  i=$((i + 1)); n=$i-$(echo "$G" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    --gemv-tiles "$G" --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  $T/test_hopper_moe_pdl.py -k "(canonical and (T1 or T2) and not tc_ and not split and not mixed and not f16) or (pdl and 120b_T1)" \
  > $W/t.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t.txt | cut -c1-300 | head -8; snap
