#!/usr/bin/env bash
# session 13, call 5 (the two-launch sort above 2048 pairs): (1) the GPU tests whose calls sort more than 2048 pairs
# (prefill both layouts, PDL on/off bit equality, W4A8); (2) the sort alone: sort_pairs, the two-launch sort and the
# torch sort it replaced; (3) the layer bench (route + apply, every moe_apply kernel, the peer among them).
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
N=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -k "T600 or T3000 or T4096_table or T2048" \
  $N/test_hopper_moe_prefill.py $N/test_hopper_moe_pdl.py $N/test_hopper_moe_w4a8.py > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/r/gpu-tests.log
timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/bench --skip-numerics --skip-breakdown \
  --sort-bench 1024,2048,2049,4096,8192,16384,65536 --tokens 1024,2048,4096,16384 > $OUT/r/bench.log 2>&1; echo "bench rc $?"
grep "sort {\|bench {" $OUT/r/bench.log | cut -c1-420
cd $OUT && tar czf r.tgz r && rm -rf r
