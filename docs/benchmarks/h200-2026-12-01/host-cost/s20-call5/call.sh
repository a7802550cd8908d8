#!/usr/bin/env bash
# session 20, call 5 (issue 13): argmax in one launch (the row's last chunk reduces, counted on the stream's counters;
# partials in the stream's scratch). GPU tests (sampling, cached launch vs JIT with a recorded plan and graph replay);
# bench --host argmax against the session's starting wheels (.anchors/before, 7c09426: two launches, two
# temporaries), alternated in separate processes; the decode step (greedy: argmax every step).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
T=$R/packages/tokenspeed-kernel-triton/tests
t sampling 100 $T/test_sampling.py
t launch 100 -m gpu $T/test_launch_gpu.py -k argmax
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after1 before1 after2 before2 after3 before3; do
  site=/tmp/site; [ "${run#before}" != "$run" ] && site=/tmp/site-before
  (cd /tmp && PYTHONPATH=$site timeout 60 python3 -m tokenspeed_kernel bench argmax --host \
    --json $W/host-$run.json > $W/host-$run.txt 2>&1); echo "host $run rc $?"
  grep -E "^argmax " $W/host-$run.txt | cut -c1-230
done
timeout 150 python3 tools/host_probe.py --out $W/probe --skip-ops --layers 24 --decode-configs full,full+prepared \
  --rounds 3 > $W/probe.txt 2>&1; echo "probe rc $?"; grep -E "eager|proxy|Error|error" $W/probe.txt | cut -c1-250 | head
tar czf $OUT/r.tgz -C $W .
