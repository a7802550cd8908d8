#!/usr/bin/env bash
# Session 29, call 1 (issue 13): the replays' C allocations and the served calls' checks (this session) on the GPU,
# in order:
# 1. test_launch_gpu.py (cached launch against JIT bit for bit, a captured graph of each op replays);
# 2. alloc_probe.py: torch's C allocation against empty_like / empty_strided, the two new checks, torch's ops;
# 3. bench --host of rmsnorm, argmax and moe_gate after and before (before = 7186e83's launch.py and core/op.py,
#    carried as .anchors/s29/launch_before.py and op_before.py: git show 7186e83:packages/tokenspeed-kernel-core/src/
#    tokenspeed_kernel/launch.py, and .../core/op.py), one process each, alternated;
# 4. the anchor's host table (.anchors/host_cost.py: cp ../shared/tools/anchors/host_cost.py .anchors/);
# 5. the GPT-OSS-20B decode step, eager and graph (host_probe --skip-ops, 24 layers), after and before;
# 6. stage 3 again, before first; stage 5 again, before first;
# 7. tools/host_breakdown.py for rmsnorm and moe_gate (where the public call's time goes).
# QUICK=1 (a small budget): stages 1-5 only.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s29-call1/call.sh", carry=[".whl", ".anchors"])
# Ran with QUICK=1 on an H100 (README.md beside this file: what ran, and the commands run by hand after it).
rm -rf /tmp/site /tmp/site-before /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
cp -r /tmp/site /tmp/site-before; cp $R/.anchors/s29/launch_before.py /tmp/site-before/tokenspeed_kernel/launch.py
cp $R/.anchors/s29/op_before.py /tmp/site-before/tokenspeed_kernel/core/op.py
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $W/t-launch.txt 2>&1)
echo "tests launch rc $? | $(tail -1 $W/t-launch.txt)"; grep -E "^(FAILED|ERROR)" $W/t-launch.txt | cut -c1-250 | head -4; snap
timeout 60 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s29-call1/alloc_probe.py $W > $W/alloc.txt 2>&1
echo "alloc rc $?"; cat $W/alloc.txt; snap
bench() {  # round, version
  local S=/tmp/site; [ $2 = before ] && S=/tmp/site-before
  for op in rmsnorm argmax moe_gate; do
    (cd /tmp && PYTHONPATH=$S timeout 40 python3 -m tokenspeed_kernel bench $op --host --quiet \
      --json $W/host-$op-$1-$2.json --md $W/host-$op-$1-$2.md > $W/host-$op-$1-$2.txt 2>&1)
    echo "host $op $1 $2 rc $?"; grep "^|" $W/host-$op-$1-$2.md | tail -n +3 | cut -c1-200
  done; snap
}
step() {  # run, version
  local S=/tmp/site; [ $2 = before ] && S=/tmp/site-before
  PYTHONPATH=$S timeout 80 python3 tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared \
    --rounds 3 --out $W/step-$1-$2 > $W/step-$1-$2.txt 2>&1
  echo "step $1 $2 rc $? | $(grep -E '^host proxy|^full' $W/step-$1-$2.txt | cut -c1-150 | tr '\n' '|')"; snap
}
bench 1 after; bench 1 before
(mkdir -p $W/anchor && cd $W/anchor && timeout 80 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1)
echo "anchor rc $?"; tail -9 $W/anchor/host-anchor.log | cut -c1-200; snap
step 1 after; step 1 before
[ -n "${QUICK:-}" ] && exit 0
bench 2 before; bench 2 after
step 2 before; step 2 after
timeout 120 python3 tools/host_breakdown.py --ops rmsnorm,moe_gate --out $W/breakdown > $W/breakdown.txt 2>&1
echo "breakdown rc $?"; cut -c1-200 $W/breakdown.txt | tail -8; snap
