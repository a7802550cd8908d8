#!/usr/bin/env bash
# session 6, call 2: the decode kernels with the activations through the ring: GPU tests, tile sweep at
# 1-4 tokens, bench against the old code (.anchors/before, commit 89c0c14) and the peer
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; mkdir -p $OUT/r; cd /tmp
PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py 2>&1 | tee $OUT/r/gpu-tests.log | tail -4
TILES="32,8,1,4,4;16,8,1,4,4;16,8,1,6,4;32,8,2,4,4;32,8,2,6,2;64,8,4,4,4;64,8,4,3,4;64,8,4,4,2;64,8,4,4,3;64,8,4,6,1;128,8,8,4,4;128,8,8,4,2"
PYTHONPATH=/tmp/site timeout 260 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/new --skip-numerics --skip-breakdown --sweep --sweep-tokens 1,2,4 --sweep-tiles "$TILES" --tokens 1,2,4,8 --budget-s 400 > $OUT/r/new.log 2>&1; echo "new rc $?"
grep -E "tiles used|^ *[0-9]+ \|" $OUT/r/new.log | head; tail -12 $OUT/r/new.log
PYTHONPATH=/tmp/site-before timeout 100 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/old --skip-numerics --skip-breakdown --tokens 1,2,4,8 > $OUT/r/old.log 2>&1; echo "old rc $?"
tail -8 $OUT/r/old.log
cd $OUT && tar czf r.tgz r && rm -rf r
