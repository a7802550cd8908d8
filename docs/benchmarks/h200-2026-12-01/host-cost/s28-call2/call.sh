#!/usr/bin/env bash
# Session 28, call 2 (issue 13): the replay's kept stream-buffer addresses (this session) before / after, in order:
# 1. bench --host of argmax, moe_gate and rmsnorm after and before (before = e4d1cf8's launch.py, carried as
#    .anchors/s28/launch_before.py: git show e4d1cf8:packages/tokenspeed-kernel-core/src/tokenspeed_kernel/launch.py),
#    one process each, alternated;
# 2. test_launch_gpu.py (cached launch against JIT bit for bit, a captured graph of each op replays);
# 3. stage 1 again, before first.
# QUICK=1 (a small budget): argmax and moe_gate only, one round, then the tests.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s28-call2/call.sh", carry=[".whl", ".anchors"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
cp -r /tmp/site /tmp/site-before; cp $R/.anchors/s28/launch_before.py /tmp/site-before/tokenspeed_kernel/launch.py
bench() {  # round, version
  local S=/tmp/site; [ $2 = before ] && S=/tmp/site-before
  for op in ${OPS:-argmax moe_gate rmsnorm}; do
    (cd /tmp && PYTHONPATH=$S timeout 40 python3 -m tokenspeed_kernel bench $op --host --quiet \
      --json $W/host-$op-$1-$2.json --md $W/host-$op-$1-$2.md > $W/host-$op-$1-$2.txt 2>&1)
    echo "host $op $1 $2 rc $?"; grep "^|" $W/host-$op-$1-$2.md | tail -n +3 | cut -c1-200
  done; snap
}
[ -n "${QUICK:-}" ] && OPS="argmax moe_gate"
bench 1 after; bench 1 before
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $W/t-launch.txt 2>&1)
echo "tests launch rc $? | $(tail -1 $W/t-launch.txt)"; grep -E "^(FAILED|ERROR)" $W/t-launch.txt | cut -c1-250 | head -4; snap
[ -z "${QUICK:-}" ] && { bench 2 before; bench 2 after; }
