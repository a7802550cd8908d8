#!/usr/bin/env bash
# session 12, call 1 (a1ec667): where each decode-step op's host time goes
# (tools/host_breakdown.py), and a cProfile of the GPT-OSS-20B decode step (24 layers)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 200 python3 $R/tools/host_breakdown.py --out $OUT/r/breakdown > $OUT/r/breakdown.log 2>&1; echo "breakdown rc $?"; cat $OUT/r/breakdown.log | cut -c1-250
timeout 200 python3 $R/tools/host_probe.py --out $OUT/r/probe --skip-ops --layers 24 --decode-configs full --rounds 3 --profile > $OUT/r/probe.log 2>&1; echo "probe rc $?"; tail -4 $OUT/r/probe.log
cd $OUT && tar czf r.tgz r && rm -rf r
