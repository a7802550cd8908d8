#!/usr/bin/env bash
# session 8, call 4: the per-stream sampling constants (41c0ac9): the core and Triton sampling GPU tests, then
# bench --host top_k_top_p_sample twice (the stream lookup is on every call now)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-core/tests/test_reference_sampling.py \
  $R/packages/tokenspeed-kernel-triton/tests/test_sampling.py > $OUT/r/tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/r/tests.log
for n in 1 2; do
  timeout 100 python3 -m tokenspeed_kernel bench --host top_k_top_p_sample --json $OUT/r/host-$n.json --md $OUT/r/host-$n.md \
    > $OUT/r/host-$n.log 2>&1; echo "host $n rc $?"; grep "^| top_k" $OUT/r/host-$n.md
done
cd $OUT && tar czf r.tgz r && rm -rf r
