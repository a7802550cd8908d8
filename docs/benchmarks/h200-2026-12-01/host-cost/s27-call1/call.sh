#!/usr/bin/env bash
# Session 27, call 1 (issue 13): s26-call3's stages (the CUDA-core MoE path, software-pipelined, against the MMA
# decode path at 1 and 2 tokens; its GPU tests; the step with it only where it is faster), then the host questions
# session 25 left: moe_gate's split against one program eager (gate_tile_probe --host), and bench --host of rmsnorm,
# argmax and moe_gate (public, prepared, graph, torch) as this session's baseline. First: alloc_probe.py (what a
# replay pays besides the launch: allocations, the capture check, the stream).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/call.sh", carry=[".whl"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 60 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/alloc_probe.py $W > $W/alloc.txt 2>&1; echo "alloc rc $?"; cat $W/alloc.txt; snap
timeout 120 python3 tools/moe_gemv_probe.py --out $W --tokens 1,2 --rounds 2 --budget-s 80 \
  --gemv "16,16,4/8,8,4;32,16,8/8,16,8;64,8,8/16,8,8;128,8,8/8,16,8" > $W/gemv.txt 2>&1
echo "gemv probe rc $?"; grep -E "^(apply|layer)" $W/gemv.txt | cut -c1-160; grep -E "^numerics" $W/gemv.txt | head -4; snap
timeout 70 python3 tools/gate_tile_probe.py --out $W --experts 32 --tokens 1,2 --rounds 2 --host \
  --tiles "table;1,1024,0" > $W/gate.txt 2>&1; echo "gate probe rc $?"; cut -c1-220 $W/gate.txt | tail -12; snap
for op in rmsnorm argmax moe_gate; do
  (cd /tmp && timeout 60 python3 -m tokenspeed_kernel bench $op --host --quiet --json $W/host-$op.json \
    --md $W/host-$op.md > $W/host-$op.txt 2>&1); echo "host $op rc $?"; grep "^|" $W/host-$op.md | cut -c1-200
done; snap
(cd /tmp && timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_gemv.py > $W/t-gemv.txt 2>&1)
echo "tests gemv rc $? | $(tail -1 $W/t-gemv.txt)"; grep -E "^(FAILED|ERROR)" $W/t-gemv.txt | cut -c1-250 | head -4; snap
S="--skip-ops --layers 24 --decode-configs full+prepared --rounds 3"
timeout 100 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s26-call2/step_gemv.py $W/moe_gemv_probe.json $S \
  --out $W/step-gemv > $W/step-gemv.txt 2>&1; echo "step gemv rc $?"
grep -E "^tokens|GEMV_TILES|^full|proxy|^plans.*moe" $W/step-gemv.txt | cut -c1-200; snap
