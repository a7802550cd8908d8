#!/usr/bin/env bash
# session 19, call 6 (issue 13): the 24-layer decode step's CUDA-graph time (device time, stable across processes)
# with this checkout and with the session's starting wheels (.anchors/before, ed0fb33), default selection (full) and
# every op forced to Triton (the portable path: the dense GEMV and one-launch decode attention show there).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after before; do
  site=/tmp/site; [ $run = before ] && site=/tmp/site-before
  PYTHONPATH=$site timeout 120 python3 tools/host_probe.py --out $W/probe-$run --skip-ops --layers 24 \
    --decode-configs full,triton --rounds 1 > $W/probe-$run.txt 2>&1; echo "probe $run rc $?"
  grep -E "eager|proxy" $W/probe-$run.txt | cut -c1-200
done
tar czf $OUT/r.tgz -C $W .
