#!/usr/bin/env bash
# session 16, call 3: why call 2's Hopper graph-replay GPU tests failed (call 2's pytest was cut by its timeout before it
# printed the failures): the test alone (-x, full tracebacks) on the failing cases, then in call 2's order.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
T=$R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py::test_gpu_matches_the_reference_and_replays_in_a_graph
timeout 150 python3 -m pytest -v -x -m gpu -p no:cacheprovider -rfEs --tb=long "$T" -k "120b_T1- or T64_decode_tiles-packed" > $OUT/r/alone.log 2>&1
echo "alone rc $?"; grep -E "PASSED|FAILED|Error|assert" $OUT/r/alone.log | cut -c1-300 | head -30
timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider -rfEs --tb=short $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py "$T" > $OUT/r/ordered.log 2>&1
echo "ordered rc $?"; tail -40 $OUT/r/ordered.log | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r
