#!/usr/bin/env bash
# session 18, call 5 (issue 13): the GPU tests of the nvidia and amd packages with public calls served by prepared
# calls (core's and the launch test ran in calls 3-4); the 24-layer decode step with launch plans on / replays off
# alternated in one process, and the Hopper MoE eager graph's calls by path (in place, copying, direct).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 tools/host_probe.py --out $W/ab --skip-ops --layers 24 --decode-configs full+prepared,full --rounds 3 \
  --ab-plans > $W/ab.txt 2>&1; echo "ab rc $?"; grep -E "eager|proxy|graph calls" $W/ab.txt | cut -c1-250
for p in nvidia amd; do
  (cd /tmp && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
    $R/packages/tokenspeed-kernel-$p/tests > $W/tests-$p.txt 2>&1); echo "$p tests rc $?"
  grep -E "FAILED|ERROR" $W/tests-$p.txt | cut -c1-300 | head; tail -1 $W/tests-$p.txt
done
tar czf $OUT/r.tgz -C $W .
