#!/usr/bin/env bash
# Session 35, call 1 (issue 13): the fp32 downs a program a pair with every request up front (AHEAD 3 of 3 steps),
# their slots summed by the last program of a token (FUSED, no third launch), against the default down, each alone
# (20B, one token); gate/up tiles of three sub-tiles a program, the tensor-core gate/up with the integer decode; then the public call eager: the default, the default
# gate/up with the best fp32 pairs down (by hot time), and the best gate/up with it; the GPU test of the fused sum
# (bits of combine_slots) and of the tensor-core GEMV's integer decode; then the triton_kernels anchor (one token) in the same call.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call1/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; uptime
(cd /tmp && timeout 135 python3 $R/tools/moe_gemv_probe.py --out $W --stages kernels --experts 32 \
  --kernel-gate-up "1,8;1,8,3;1,8,3@64;ti1,4@168;t1,4@168" \
  --kernel-down "d1,4,1,3@128;pd1,8,1,3@128;p1,8,1,3@96;pd1,4,1,3@128;p1,4,1,3@96;ti1:1" \
  --tag=-kernels --budget-s 120 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^kernel" $W/kernels.txt; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
best() { grep "^kernel $1 " $W/kernels.txt | grep -E "$2" | sort -k5 -g | head -1 | cut -d' ' -f3; }
BD=$(best down " p[0-9d]"); BG=$(best gate_up "."); echo "best pairs down $BD, best gate/up $BG"
for G in "" "1,8/$BD" "$BG/$BD"; do
  n=$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  [ -f $W/eager-$n.txt ] && continue
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "pairs_down_sums or (canonical and tc_int)" > $W/t-fused.txt 2>&1)
echo "tests rc $? | $(tail -1 $W/t-fused.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-fused.txt | cut -c1-300 | head -8; snap
(mkdir -p $W/tk && cd $W/tk && OUT=$W/tk timeout 90 python3 $R/.anchors/tk_moe.py --tokens 1 > tk.log 2>&1)
echo "tk rc $?"; tail -3 $W/tk/tk.log | cut -c1-300; snap
