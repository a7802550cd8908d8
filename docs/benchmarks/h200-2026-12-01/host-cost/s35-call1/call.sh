#!/usr/bin/env bash
# Session 35, call 1 (issue 13): 1. each GEMV launch alone (20B, one token): fp32 downs a program a pair with every
# request up front (AHEAD 3 of 3 steps), their slots summed by the token's last program (FUSED, no third launch),
# against the default down; the tensor-core gate/up with the integer decode against the default gate/up; 2. the
# public call eager: the default, the default gate/up with the best fp32 pairs down (by hot time), the best gate/up
# with it; 3. the probe's nine numerics cases for the
# faster new pair; 4. GPU tests: the fused sum against combine_slots, the tensor-core GEMV's integer decode;
# 5. the triton_kernels anchor (one token).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 75 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 \
  --kernel-gate-up "1,8;ti1,4@168" \
  --kernel-down "d1,4,1,3@128;pd1,8,1,3@128;p1,8,1,3@96" \
  --tag=-kernels --budget-s 65 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
best() { grep "^kernel $1 " $W/kernels.txt | grep -E "$2" | sort -k5 -g | head -1 | cut -d' ' -f3; }
BD=$(best down " p[0-9d]"); BG=$(best gate_up "."); echo "best pairs down $BD, best gate/up $BG"
eager() {
  n=$1-$(echo "${2:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${2:+--gemv-tiles "$2"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
}
med() { grep -o '"eager_us": [0-9.]*' $W/eager-$1-$(echo "$2" | sed 's/[/,@]/_/g').txt | cut -d' ' -f2; }
eager 1 ""; eager 2 "1,8/$BD"; NEWP="1,8/$BD"
if [ "$BG" != "1,8" ]; then
  eager 3 "$BG/$BD"
  a=$(med 2 "1,8/$BD"); b=$(med 3 "$BG/$BD")
  python3 -c "import sys; sys.exit(0 if float('${b:-1e9}') < float('${a:-1e9}') else 1)" && NEWP="$BG/$BD"
fi
echo "new pair $NEWP"
(cd /tmp && timeout 100 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "$NEWP" --tag=-num > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-230; snap
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 90 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "pairs_down_sums or (canonical and tc_int)" > $W/t-fused.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t-fused.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-fused.txt | cut -c1-300 | head -8; snap
(mkdir -p $W/tk && cd $W/tk && OUT=$W/tk timeout 60 python3 $R/.anchors/tk_moe.py --tokens 1 > tk.log 2>&1)
echo "tk rc $?"; tail -3 $W/tk/tk.log | cut -c1-300; snap
