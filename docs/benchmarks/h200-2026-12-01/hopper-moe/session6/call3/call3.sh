#!/usr/bin/env bash
# session 6, call 3: the prefill path's sort in one launch (sort_pairs): GPU tests, the sort alone, the layer
# against the old code (.anchors/before, 89c0c14) and the peer, same routing draws
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -2 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; mkdir -p $OUT/r; cd /tmp
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_prefill.py $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_w4a8.py 2>&1 | tee $OUT/r/gpu-tests.log | tail -4
T=8,16,64,256,512,1024,2048
PYTHONPATH=/tmp/site timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/new --skip-numerics --skip-breakdown --sort-bench 32,256,1024,2048,4096,8192,16384 --tokens $T > $OUT/r/new.log 2>&1; echo "new rc $?"
grep "sort {\|bench {" $OUT/r/new.log
PYTHONPATH=/tmp/site-before timeout 110 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/old --skip-numerics --skip-breakdown --tokens $T > $OUT/r/old.log 2>&1; echo "old rc $?"
grep "bench {" $OUT/r/old.log
cd $OUT && tar czf r.tgz r && rm -rf r
