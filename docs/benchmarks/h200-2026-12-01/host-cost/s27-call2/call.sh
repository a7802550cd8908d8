#!/usr/bin/env bash
# Session 27, call 2 (issue 13): NOT RUN (no machine; then too little device time left to start one): s27-call1's first three stages only (call 1 found no machine in eight
# tries and the device time left no longer fits it): alloc_probe.py; bench --host of rmsnorm, moe_gate and argmax
# after and before the replay change (before = .anchors/s27/launch_before.py, git show 6cf0e01:...launch.py); the
# launch GPU tests (cached launch against JIT, graph replay).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s27-call2/call.sh", carry=[".whl", ".anchors"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 40 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/alloc_probe.py $W > $W/alloc.txt 2>&1; echo "alloc rc $?"; cat $W/alloc.txt; snap
bench() {  # round, version
  local S=/tmp/site; [ $2 = before ] && S=/tmp/site-before
  for op in rmsnorm argmax moe_gate; do
    (cd /tmp && PYTHONPATH=$S timeout 35 python3 -m tokenspeed_kernel bench $op --host --quiet \
      --json $W/host-$op-$1-$2.json --md $W/host-$op-$1-$2.md > $W/host-$op-$1-$2.txt 2>&1)
    echo "host $op $1 $2 rc $?"; grep "^|" $W/host-$op-$1-$2.md | tail -n +3 | cut -c1-200
  done; snap
}
cp -r /tmp/site /tmp/site-before; cp $R/.anchors/s27/launch_before.py /tmp/site-before/tokenspeed_kernel/launch.py
bench 1 after; bench 1 before
(cd /tmp && timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $W/t-launch.txt 2>&1)
echo "tests launch rc $? | $(tail -1 $W/t-launch.txt)"; grep -E "^(FAILED|ERROR)" $W/t-launch.txt | cut -c1-250 | head -4; snap
bench 2 after; bench 2 before
