#!/usr/bin/env bash
# session 20, call 8 (issue 13): moe_route's served call against its prepared call and its wrapper (probe_route.py).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 120 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s20-call8/probe_route.py) 2>&1 | tee $OUT/probe.txt | tail -60
