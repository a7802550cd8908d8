#!/usr/bin/env bash
# Session 28, call 1b: run by hand after s27-call1 with SHORT=1, on the same warm machine (/tmp/site kept), at e4d1cf8
# (tools/moe_gemv_probe.py was removed after this call: read it at e4d1cf8). Outputs: s28-call1/r/.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site; ls /tmp/site >/dev/null || bash tools/gpu_session.sh > $OUT/setup.log 2>&1
W=$OUT/w; mkdir -p $W
timeout 90 python3 tools/moe_gemv_probe.py --out $W --tokens 1 --rounds 2 --budget-s 50 \
  --gemv "16,16,4/8,8,4;32,16,8/8,16,8;64,8,8/16,8,8;128,8,8/8,16,8" > $W/gemv.txt 2>&1
echo "gemv probe rc $?"; grep -E "^(apply|layer)" $W/gemv.txt | cut -c1-160; grep -E "^numerics" $W/gemv.txt | head -4
timeout 60 python3 tools/gate_tile_probe.py --out $W --experts 32 --tokens 1 --rounds 2 --host \
  --tiles "table;1,1024,0" > $W/gate.txt 2>&1; echo "gate probe rc $?"; cut -c1-220 $W/gate.txt | tail -12
