#!/usr/bin/env bash
# RAN at 21:33 UTC on an H100 (16-core host): the call asked for the default kind and the device tool lent an H100.
# session 25, call 2 (issue 13), carried as call 1 (.whl, .anchors). The code of call 1 plus host_probe's new --parts
# cases (the appending decode against apply_rotary_and_store + mha_decode_with_kvcache, moe_gate with the norm against
# rmsnorm + moe_gate; device time in CUDA graphs, host time only).
# 0. moe_gate's split tiles against other splits (tools/gate_tile_probe.py);
# 1. host_probe --parts, then the 24-layer prepared step with --sites (in-situ host time per op call);
# 2. the anchor host table (.anchors/host_cost.py) in 2 processes;
# 3. bench --host over every op (public, direct, graph, torch).
# Everything lands in /tmp/w and is packed into $OUT/r.tgz after each stage (the device returns only a few files).
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site timeout 90 python3 tools/gate_tile_probe.py --out $W --tokens 1,2,8 --rounds 2 \
  --tiles "table;1,1024,2;1,2048,4;1,1024,4;2,512,2" > $W/gate.txt 2>&1; echo "gate probe rc $?"; cut -c1-250 $W/gate.txt; snap
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared"
PYTHONPATH=/tmp/site timeout 170 python3 $P --out $W/parts --rounds 3 --parts --sites > $W/parts.txt 2>&1
echo "parts rc $?"; grep -E "^parts|^full|proxy|^ *[a-z_]+ +[0-9.]+ calls" $W/parts.txt | cut -c1-200; snap
for i in 1 2; do
  (mkdir -p $W/anchor$i && cd $W/anchor$i && PYTHONPATH=/tmp/site timeout 60 python3 $R/.anchors/host_cost.py > log 2>&1)
  echo "anchor$i rc $?"; grep -o "'op': '[^']*', 'public_us': [0-9.]*" $W/anchor$i/log | cut -c1-90 | tr '\n' ';'; echo
done; snap
(cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m tokenspeed_kernel bench --host --quiet --json $W/host.json \
  --md $W/host.md > $W/host.txt 2>&1); echo "host rc $?"; grep "^|" $W/host.md | cut -c1-200; tail -3 $W/host.txt; snap
