#!/usr/bin/env bash
# Session 34, call 3 (issue 13): the new default GEMV_TILES (i1,8 / pi1,8; fp32 pair above scale byte 220):
# 1. the probe's nine numerics cases; 2. the public call eager, new default then session 33's pair; 3. the GPU tests
# of the table's 1-2 token cases (canonical) and the new f16/pairs cases, then PDL on/off.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s34-call3/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 75 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 --tag=-num \
  > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-230; snap
for G in "" "1,8/d1,4,1,3@128"; do
  n=$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 110 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  $T/test_hopper_moe_pdl.py -k "(canonical and (T1 or T2) and not tc_ and not split and not mixed) or (pdl and 120b_T1)" \
  > $W/t.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t.txt | cut -c1-300 | head -8; snap
