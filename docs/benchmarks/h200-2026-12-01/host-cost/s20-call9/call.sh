#!/usr/bin/env bash
# session 20, call 9 (issue 13): launch plans rebuild frozen-dataclass results, so moe_dispatch (a MoEDispatchResult)
# is served by a recorded plan. Its launch test (cached vs JIT, graph replay, a recorded plan), and bench --host
# moe_dispatch after and before (.anchors/before, 7c09426), alternated.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "moe_dispatch or moe_combine" > $W/tests-launch.txt 2>&1)
echo "tests launch rc $?"; grep -E "FAILED|ERROR" $W/tests-launch.txt | cut -c1-300 | head -5; tail -1 $W/tests-launch.txt
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after1 before1 after2 before2; do
  site=/tmp/site; [ "${run#before}" != "$run" ] && site=/tmp/site-before
  (cd /tmp && PYTHONPATH=$site timeout 60 python3 -m tokenspeed_kernel bench moe_dispatch --host \
    --json $W/host-$run.json > $W/host-$run.txt 2>&1); echo "host $run rc $?"
  grep -E "^moe_dispatch " $W/host-$run.txt | cut -c1-230
done
tar czf $OUT/r.tgz -C $W .
