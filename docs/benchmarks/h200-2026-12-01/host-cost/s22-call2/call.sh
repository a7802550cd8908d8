#!/usr/bin/env bash
# session 22, call 2 (issue 13): the one-token decode GEMMs of hopper.moe_apply timed against K and N
# (tools/moe_kscan_probe.py): what their K loop costs per K block, and what does not scale with K.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 tools/moe_kscan_probe.py --out $W > $W/kscan.txt 2>&1
echo "kscan rc $?"; grep -E "^(kscan|tiny)" $W/kscan.txt | awk '{printf "%s | ", $0} END {print ""}'; tail -2 $W/kscan.txt | cut -c1-300
