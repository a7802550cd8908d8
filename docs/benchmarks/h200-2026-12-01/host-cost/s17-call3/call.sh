#!/usr/bin/env bash
# session 17, call 3 (issue 13): the Hopper MoE's eager graph keyed by one int per weights object and activation, its
# in-place graph writing a new output where it is (no clone): the Hopper graph-replay GPU tests and the model's; then
# --parts, the decode step's in-situ op times, and the eager rounds alternated with rounds under gc.freeze() (--gc).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
N=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py \
  "$N/test_hopper_moe.py::test_gpu_matches_the_reference_and_replays_in_a_graph" -k "not split and not decode_tiles" \
  > $OUT/r/tests.log 2>&1); echo "tests rc $?"; grep -E "FAILED|ERROR" $OUT/r/tests.log | cut -c1-200 | head; tail -1 $OUT/r/tests.log
timeout 170 python3 tools/host_probe.py --out $OUT/r --skip-ops --parts --gc --sites --layers 24 \
  --decode-configs full+prepared+plan,full+prepared,full --rounds 3 > $OUT/r/probe.log 2>&1; echo "probe rc $?"
cut -c1-180 $OUT/r/probe.log
# What ran: this script's tests stage hit its 150 s timeout after 14 passes and no failure (r/tests-timed-out.log: the
# 3 model GPU tests, then 11 Hopper cases); the probe crashed in --parts (it cloned a copying graph's output, and the
# in-place graphs now hold none: r/probe-first-crashed.log). On the warm machine, with the tree of this commit:
# 3b/3c: the probe fixed (a copying graph looked for, its replay/clone timed only when one exists), then
#   export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site; timeout 190 python3 tools/host_probe.py --out $OUT/r --skip-ops \
#     --parts --gc --sites --layers 24 --decode-configs full+prepared+plan,full+prepared,full --rounds 3
#   (3b stopped at the same clone: the 1-layer setup has no copying graph; 3c ran: r/probe.log, r/host_probe.json)
# 3d: the Hopper graph-replay cases alone (r/hopper-tests.txt): 12 passed.
