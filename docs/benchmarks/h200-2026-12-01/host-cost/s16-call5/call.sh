#!/usr/bin/env bash
# session 16, call 5 (issue 13): in one process, alternated (calls 2 and 4 compared processes whose host speed drifts
# 2x): moe_apply at one token through its in-place eager graph and through the copying one, and a torch add + rmsnorm
# against rmsnorm(residual=), host time only (tools/host_probe.py --ab); then a 1-layer decode step (the device budget left was small).
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 110 python3 $R/tools/host_probe.py --out $OUT/r/ab --skip-ops --ab --layers 1 --decode-configs full+prepared --rounds 2 \
  > $OUT/r/ab.log 2>&1; echo "ab rc $?"; cut -c1-200 $OUT/r/ab.log | tail -12
