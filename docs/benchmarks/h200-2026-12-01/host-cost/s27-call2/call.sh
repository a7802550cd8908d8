#!/usr/bin/env bash
# Session 27, call 2 (issue 13): NOT RUN (no machine; then too little device time left to start one). s27-call1
# without its stages 4-5 (the CUDA-core MoE probe, the gate probe), for a smaller budget: alloc_probe.py; bench --host
# of rmsnorm, moe_gate and argmax after and before the replay change (before = .anchors/s27/launch_before.py,
# git show 6cf0e01:packages/tokenspeed-kernel-core/src/tokenspeed_kernel/launch.py); the launch GPU tests; bench again.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s27-call2/call.sh", carry=[".whl", ".anchors"])
SHORT=1 exec bash docs/benchmarks/h200-2026-12-01/host-cost/s27-call1/call.sh
