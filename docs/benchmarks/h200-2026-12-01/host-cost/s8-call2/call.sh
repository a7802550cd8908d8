#!/usr/bin/env bash
# session 8, call 2: the sampler's eager graph and cached per-row constants (GPU tests, bench --host of
# top_k_top_p_sample: this code and b0394ea's core + triton wheels (.anchors/before) in alternating processes),
# then the decode stream probe again (its whole-layer rows)
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .anchors/before/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-triton/tests/test_sampling.py \
  "$R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py" -k "sample or argmax" > $OUT/r/tests.log 2>&1; echo "tests rc $?"; tail -4 $OUT/r/tests.log
for n in 1 2; do
  for v in before after; do
    if [ $v = before ]; then PP=/tmp/site-before:/tmp/site; else PP=/tmp/site; fi
    PYTHONPATH=$PP timeout 100 python3 -m tokenspeed_kernel bench --host top_k_top_p_sample --json $OUT/r/host-$v-$n.json \
      --md $OUT/r/host-$v-$n.md > $OUT/r/host-$v-$n.log 2>&1; echo "host $v $n rc $? $(date +%T)"; grep "^| top_k" $OUT/r/host-$v-$n.md
  done
done
timeout 200 python3 $R/tools/decode_stream_probe.py --out $OUT/r/probe > $OUT/r/probe.log 2>&1; echo "probe rc $?"; grep -E "layer|stream_1024|pattern_32rows_4|gemm" $OUT/r/probe.log | cut -c1-150
cd $OUT && tar czf r.tgz r && rm -rf r
