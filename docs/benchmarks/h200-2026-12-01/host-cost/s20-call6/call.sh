#!/usr/bin/env bash
# session 20, call 6 (issue 13): call 5's argmax counters test used vocabularies of one chunk on a GPU (4096 logits a
# chunk there); now 3-5 chunks a row. The argmax GPU tests, and every core GPU test with the shipped H100 table.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
t argmax 120 $R/packages/tokenspeed-kernel-triton/tests/test_sampling.py -k argmax
t core 200 -m gpu $R/packages/tokenspeed-kernel-core/tests
tar czf $OUT/r.tgz -C $W .
