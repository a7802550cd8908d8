#!/usr/bin/env bash
# session 19, call 7 (issue 13): decode attention's partials in the stream's scratch. The decode tests on CUDA (graph
# replays included), the launch GPU test of decode attention, then the anchor's host table twice.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR|Error|assert" $W/tests-$name.txt | cut -c1-400 | head -12
  tail -1 $W/tests-$name.txt; }
T=$R/packages/tokenspeed-kernel-triton/tests
t decode 70 $T/test_attention.py -k "decode"
t launch 60 -m gpu $T/test_launch_gpu.py -k "mha_decode_with_kvcache"
for run in after1 after2; do
  (mkdir -p $W/anchor-$run && cd $W/anchor-$run && timeout 40 python3 $R/.anchors/host_cost.py > log.txt 2>&1)
  echo "anchor $run rc $?"; grep -E "rms|mha|torch.mm" $W/anchor-$run/log.txt | grep -v direct | cut -c1-120
done
tar czf $OUT/r.tgz -C $W .
