#!/usr/bin/env bash
# session 19, call 3 (issue 13): after call 2's two failures (a launch test of decode attention, whose message the
# timeout cut; test_decode_with_a_plan, fixed) and the counters made outside a recording: the launch GPU tests of the
# decode ops, the Hopper MoE's fused-epilogue tests (now on launch.stream_counters), the attention plan test; then
# the 24-layer decode step with this checkout and with the session's starting wheels (.anchors/before, ed0fb33).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR|Error|assert" $W/tests-$name.txt | cut -c1-400 | head -12
  tail -1 $W/tests-$name.txt; }
T=$R/packages/tokenspeed-kernel-triton/tests
t launch 150 -m gpu -x $T/test_launch_gpu.py -k "mha_decode_with_kvcache or rmsnorm or moe_gate or apply_rotary_and_store"
t hopper 100 -m gpu $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py -k fused
t plan 40 $T/test_attention.py -k "plan or counters"
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after before; do
  site=/tmp/site; [ $run = before ] && site=/tmp/site-before
  PYTHONPATH=$site timeout 100 python3 tools/host_probe.py --out $W/probe-$run --skip-ops --layers 24 \
    --decode-configs full+prepared,full --rounds 3 > $W/probe-$run.txt 2>&1; echo "probe $run rc $?"
  grep -E "eager|proxy" $W/probe-$run.txt | cut -c1-200
done
tar czf $OUT/r.tgz -C $W .
