#!/usr/bin/env bash
# session 18, call 6 (issue 13): stale in-place graphs give their place to recurring address sets (graphs.py); the
# GPT-OSS model GPU tests; the 24-layer decode step with launch plans on / replays off alternated in one process,
# and the Hopper MoE eager graph's calls by path.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short \
  $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py > $W/model-tests.txt 2>&1); echo "model tests rc $?"
grep -E "FAILED|ERROR" $W/model-tests.txt | cut -c1-300 | head; tail -1 $W/model-tests.txt
timeout 120 python3 tools/host_probe.py --out $W/ab --skip-ops --layers 24 --decode-configs full+prepared,full --rounds 3 \
  --ab-plans > $W/ab.txt 2>&1; echo "ab rc $?"; grep -E "eager|proxy|graph calls" $W/ab.txt | cut -c1-250
tar czf $OUT/r.tgz -C $W .
