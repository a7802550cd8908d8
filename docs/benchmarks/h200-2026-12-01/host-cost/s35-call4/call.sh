#!/usr/bin/env bash
# Session 35, call 4 (issue 13): the public call eager at one token with the pairs downs' slots summed by their last
# program: the default, the fp32 gate/up with the f16i pairs down, the f16 pair (session 34: 25.89 with the combine
# launch); then the probe's nine numerics cases for the fp32 gate/up with the f16i pairs down (the down is linear
# after SwiGLU's clamp).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s35-call4/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w4; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w4; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
i=0
for G in "" "1,8/pi1,8" "i1,8/pi1,8"; do
  i=$((i + 1)); n=$i-$(echo "${G:-default}" | sed 's/[/,@]/_/g')
  (cd /tmp && timeout 35 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --experts 32 \
    ${G:+--gemv-tiles "$G"} --tag=-eager-$n > $W/eager-$n.txt 2>&1)
  echo "eager $n rc $? $(grep ^eager $W/eager-$n.txt | cut -c1-200)"; snap
done
(cd /tmp && timeout 100 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "1,8/pi1,8" --tag=-num > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-200; snap
