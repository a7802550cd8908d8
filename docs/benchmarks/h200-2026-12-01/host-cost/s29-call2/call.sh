#!/usr/bin/env bash
# Session 29, call 2 (issue 13): session 29's code once more, small (the budget left after call 1): bench --host of
# rmsnorm, argmax and moe_gate, the anchor's host table (.anchors/host_cost.py), the 24-layer decode step; after
# only (call 1 has the before / after pairs). Outputs under $OUT/w.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s29-call2/call.sh", carry=[".whl", ".anchors"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for op in rmsnorm argmax moe_gate; do
  (cd /tmp && timeout 40 python3 -m tokenspeed_kernel bench $op --host --quiet --json $W/host-$op.json \
    --md $W/host-$op.md > $W/host-$op.txt 2>&1)
  echo "host $op rc $?"; grep "^|" $W/host-$op.md | tail -n +3 | cut -c1-200
done
(mkdir -p $W/anchor && cd $W/anchor && timeout 80 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1)
echo "anchor rc $?"; tail -7 $W/anchor/host-anchor.log | cut -c1-200
timeout 60 python3 tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --rounds 3 \
  --out $W/step > $W/step.txt 2>&1
echo "step rc $? | $(grep -E '^host proxy|^full' $W/step.txt | cut -c1-150 | tr '\n' '|')"
