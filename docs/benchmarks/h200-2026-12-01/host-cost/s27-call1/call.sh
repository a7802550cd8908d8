#!/usr/bin/env bash
# Session 27, call 1 (issue 13): not run in session 27 (no machine in 20 tries); session 28 ran it with SHORT=1
# (outputs: s28-call1/r/) and stages 4-5 by hand (s28-call1/probes.sh); stage 4's tool was removed after (run it at
# e4d1cf8). In order:
# 1. alloc_probe.py: what a launch plan's replay pays on the GPU host besides the launch (allocations, the capture
#    check, the stream), with F.rms_norm and torch.argmax;
# 2. bench --host of rmsnorm, moe_gate and argmax (public, prepared, graph, torch) after and before this session's
#    replay change (4013692; before = 6cf0e01's launch.py, carried as .anchors/s27/launch_before.py:
#    git show 6cf0e01:packages/tokenspeed-kernel-core/src/tokenspeed_kernel/launch.py), one process each;
# 3. test_launch_gpu.py: the replays on the GPU (cached launch against JIT bit for bit, graph replay);
# 4. the CUDA-core MoE path, software-pipelined (s26-call3's probe), against the MMA decode path at one token (its
#    GPU tests and the step with it wait for a probe that finds it faster);
# 5. moe_gate's split against one program, eager (gate_tile_probe --host): session 25's open question;
# 6. stage 2 again, before first.
# SHORT=1 leaves stages 4 and 5 out (s27-call2).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/call.sh", carry=[".whl", ".anchors"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 60 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/alloc_probe.py $W > $W/alloc.txt 2>&1; echo "alloc rc $?"; cat $W/alloc.txt; snap
bench() {  # round, version
  local S=/tmp/site; [ $2 = before ] && S=/tmp/site-before
  for op in rmsnorm moe_gate argmax; do
    (cd /tmp && PYTHONPATH=$S timeout 40 python3 -m tokenspeed_kernel bench $op --host --quiet \
      --json $W/host-$op-$1-$2.json --md $W/host-$op-$1-$2.md > $W/host-$op-$1-$2.txt 2>&1)
    echo "host $op $1 $2 rc $?"; grep "^|" $W/host-$op-$1-$2.md | tail -n +3 | cut -c1-200
  done; snap
}
# bench --host before (6cf0e01's launch.py: empty_strided for every output, a capture check a stream buffer) and
# after (4013692), processes alternated
cp -r /tmp/site /tmp/site-before; cp $R/.anchors/s27/launch_before.py /tmp/site-before/tokenspeed_kernel/launch.py
bench 1 after; bench 1 before
# the replays on the GPU: cached launch against JIT bit for bit, a captured graph of each replays
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py > $W/t-launch.txt 2>&1)
echo "tests launch rc $? | $(tail -1 $W/t-launch.txt)"; grep -E "^(FAILED|ERROR)" $W/t-launch.txt | cut -c1-250 | head -4; snap
if [ -z "${SHORT:-}" ]; then  # (s27-call2: without stages 4-5)
timeout 90 python3 tools/moe_gemv_probe.py --out $W --tokens 1 --rounds 2 --budget-s 50 \
  --gemv "16,16,4/8,8,4;32,16,8/8,16,8;64,8,8/16,8,8;128,8,8/8,16,8" > $W/gemv.txt 2>&1
echo "gemv probe rc $?"; grep -E "^(apply|layer)" $W/gemv.txt | cut -c1-160; grep -E "^numerics" $W/gemv.txt | head -4; snap
timeout 60 python3 tools/gate_tile_probe.py --out $W --experts 32 --tokens 1 --rounds 2 --host \
  --tiles "table;1,1024,0" > $W/gate.txt 2>&1; echo "gate probe rc $?"; cut -c1-220 $W/gate.txt | tail -12; snap
fi
bench 2 before; bench 2 after
# (the CUDA-core path's GPU tests and the step with it: only where the probe above finds it faster; a later call)
