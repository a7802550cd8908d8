#!/usr/bin/env bash
# session 20, call 7 (issue 13): which public calls are served (probe_served.py): moe_route's public call cost 19.0 us
# in call 4's bench --host against 11.5 us for its prepared call.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 120 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s20-call7/probe_served.py) 2>&1 | tail -30
