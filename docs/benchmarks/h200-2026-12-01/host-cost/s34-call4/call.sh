#!/usr/bin/env bash
# Session 34, call 4 (issue 13): the three numerics cases call 2 did not reach, for the f16 pair i1,8 / pi1,8 (scale
# bytes 246-252 with activations times 2**-124; activations times 2**20, the case the emulation expects to fail;
# times 2**-30).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s34-call4/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd /tmp && timeout 80 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics --experts 32 \
  --gemv-tiles "i1,8/pi1,8" --numerics-cases "scales_246_252_T1,x_times_2pow20_T1,x_times_2pow-30_T2" --tag=-num \
  > $W/num.txt 2>&1)
echo "numerics rc $?"; grep ^numerics $W/num.txt | cut -c1-260; snap
