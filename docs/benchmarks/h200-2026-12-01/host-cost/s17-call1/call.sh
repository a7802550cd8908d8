#!/usr/bin/env bash
# session 17, call 1 (issue 13; the code as session 16 left it, plus the probe's --sites): where a GPT-OSS-20B decode
# step's host time goes, each op call timed where the model makes it (24 layers, batch 1, context 2000), prepared and
# plain; the in-process A/B of session 16 (never run on a GPU); the anchor's host table.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $OUT/r && timeout 100 python3 $R/.anchors/host_cost.py > anchor.log 2>&1); echo "anchor rc $?"; tail -8 $OUT/r/anchor.log
timeout 300 python3 tools/host_probe.py --out $OUT/r --skip-ops --ab --sites --layers 24 \
  --decode-configs full+prepared,full --rounds 3 > $OUT/r/probe.log 2>&1; echo "probe rc $?"
cat $OUT/r/probe.log | cut -c1-200
