#!/usr/bin/env bash
# session 23, call 2 (issue 13): where the eager decode step's moe_apply time goes. The GPT-OSS-20B step (24 layers,
# prepared calls) with the Hopper MoE's eager graphs and without them: in one process, rounds alternated
# (host_probe.py --ab-eager-graphs: no_eager_graphs() around the other rounds); and in separate processes with
# TOKENSPEED_KERNEL_EAGER_GRAPHS=1 / 0 and --sites (in-situ host time per op); then py-spy --native --idle on the
# default step (idle samples kept: a host blocked in a driver call shows up).
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared"
timeout 90 python3 $P --out $W/ab --rounds 3 --ab-eager-graphs > $W/ab.txt 2>&1
echo "ab rc $?"; grep -E "^full|proxy|^eager graphs|^plans.*moe" $W/ab.txt | cut -c1-220
for g in 1 0 1 0; do
  TOKENSPEED_KERNEL_EAGER_GRAPHS=$g timeout 80 python3 $P --out $W/sites$g --rounds 2 --sites >> $W/sites$g.txt 2>&1
  echo "sites graphs=$g rc $?"; grep -E "^full|proxy|^plans.*moe" $W/sites$g.txt | tail -3 | cut -c1-220
done
for g in 1 0; do echo "== graphs=$g"; grep -v -E "^plans|^host proxy|^full|^hopper" $W/sites$g.txt | tail -14 | cut -c1-200; done
timeout 100 /tmp/site/bin/py-spy record --native --idle -r 250 -f raw -o $W/spy-idle.txt -- python3 $P --out $W/spin \
  --spin 8 > $W/spy.log 2>&1; echo "spy rc $?"; tail -2 $W/spy.log
gzip -f $W/spy-idle.txt
