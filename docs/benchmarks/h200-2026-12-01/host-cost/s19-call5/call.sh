#!/usr/bin/env bash
# session 19, call 5 (issue 13), on call 4's warm machine, sent as one command line (this file is its readable form):
# the anchor's host table (.anchors/host_cost.py) six times in separate processes, alternating this checkout
# (after) and the session's starting wheels (before, ed0fb33). The anchor writes host_overhead.json to $OUT, so each
# run overwrote it; each run's rows are in its log.txt.
W=/tmp/r5; rm -rf $W; mkdir -p $W
[ -f /tmp/site/.installed ] || bash tools/gpu_session.sh > $W/setup.log 2>&1
[ -d /tmp/site-before/tokenspeed_kernel ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after1 before1 after2 before2 after3 before3; do
  site=/tmp/site; [ "${run#before}" != "$run" ] && site=/tmp/site-before
  (mkdir -p $W/$run && cd $W/$run && PYTHONPATH=$site timeout 40 python3 $OLDPWD/.anchors/host_cost.py > log.txt 2>&1)
  echo "$run rc $?"
done
tar czf $OUT/r.tgz -C $W .
