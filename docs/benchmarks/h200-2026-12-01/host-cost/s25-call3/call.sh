#!/usr/bin/env bash
# RAN at 21:37 UTC on an H100 (16-core host). Its pytest line gives -k twice: the second (moe_gate) replaced the first, so
# only the launch/graph test of moe_gate ran (1 passed), not test_moe.py's router GPU tests. verify and the probe ran.
# session 25, call 3 (issue 13): NVIDIA's new moe_gate rows (a program a token, K step 2048, up to 8 tokens), carried
# as call 1. The router's GPU tests (against the reference and the calls it replaces, CUDA graph), the launch/graph
# test of moe_gate's cases, verify on the GPU set, and the table against session 24's row (1,1024,4).
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
T=$R/packages/tokenspeed-kernel-triton/tests
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_moe.py -k gate \
  $T/test_launch_gpu.py -k moe_gate > $W/tests.txt 2>&1; echo "tests rc $?" >> $W/tests.txt)
grep -E "FAILED|ERROR" $W/tests.txt | cut -c1-250 | head -4; tail -2 $W/tests.txt
(cd /tmp && timeout 60 python3 -m tokenspeed_kernel verify triton.moe_gate --set gpu > $W/verify.txt 2>&1; echo "verify rc $?")
grep -E "passed" $W/verify.txt | cut -c1-200
timeout 60 python3 tools/gate_tile_probe.py --out $W --tokens 1,2,8 --rounds 2 --tiles "table;1,1024,4" > $W/gate.txt 2>&1
echo "gate probe rc $?"; cut -c1-250 $W/gate.txt
tar czf $OUT/r.tgz -C /tmp w
