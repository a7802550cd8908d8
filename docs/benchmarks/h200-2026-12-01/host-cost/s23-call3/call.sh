#!/usr/bin/env bash
# NOT RUN: the device had no machine for this call (session 23); its question (where the step's host time goes now) is open.
# session 23, call 3 (issue 13): where the eager decode step's host time goes now. py-spy (installed apart: the
# packages' --upgrade install replaces /tmp/site/bin, which is why call 2's py-spy was missing) samples the 24-layer
# prepared step spinning (host_probe.py --spin): Python frames; native frames; native frames with idle samples kept.
rm -rf /tmp/site /tmp/spy
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
W=$OUT/r; mkdir -p $W
SPY=/tmp/spy/bin/py-spy
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --spin 8"
timeout 100 $SPY record -r 1000 -f raw -o $W/spy-py.txt -- python3 $P --out $W/spin-py > $W/spy-py.log 2>&1
echo "spy py rc $?"; tail -1 $W/spy-py.log
timeout 100 $SPY record --native -r 250 -f raw -o $W/spy-native.txt -- python3 $P --out $W/spin-native \
  > $W/spy-native.log 2>&1; echo "spy native rc $?"; tail -1 $W/spy-native.log
timeout 100 $SPY record --native --idle -r 250 -f raw -o $W/spy-idle.txt -- python3 $P --out $W/spin-idle \
  > $W/spy-idle.log 2>&1; echo "spy idle rc $?"; tail -1 $W/spy-idle.log
gzip -f $W/spy-*.txt; ls -la $W
