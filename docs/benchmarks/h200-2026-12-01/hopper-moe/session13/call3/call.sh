#!/usr/bin/env bash
# session 13, call 3 (the final table): (1) the selection bench of moe_apply (sets A F B, the measured table's
# source); (2) each prefill launch alone at 1024 / 2048 tokens; (3) verify of hopper.moe_apply_packed on its
# GPT-OSS shapes; (4) GPT-OSS-20B end to end with this checkout (after) and with f475d3b's wheels (before:
# .anchors/before), same process order.
export WHL_DIR=.whl-moe; rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl-moe/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 $R/tools/selection_h200.py bench --out $OUT/r/sel --ops moe_apply --sets A F B > $OUT/r/sel.log 2>&1
echo "selection rc $?"; tail -3 $OUT/r/sel.log
timeout 120 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/breakdown --skip-numerics --skip-breakdown \
  --prefill-breakdown 1024,2048 --tokens 2048 > $OUT/r/breakdown.log 2>&1; echo "breakdown rc $?"
grep "prefill breakdown\|bench {" $OUT/r/breakdown.log | cut -c1-400
timeout 120 python3 -m tokenspeed_kernel verify hopper.moe_apply_packed --dtype bf16 --no-reference --json $OUT/r/verify.json \
  > $OUT/r/verify.log 2>&1; echo "verify rc $?"; tail -8 $OUT/r/verify.log | cut -c1-250
E2E="--configs full --prefill 1x2048,8x2048 --decode-batches 1,64 --decode-steps 16 --eager-decode-steps 0 --no-op-times --prefill-iters 3"
timeout 150 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e-after $E2E > $OUT/r/e2e-after.log 2>&1; echo "e2e after rc $?"
PYTHONPATH=/tmp/site-before timeout 150 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e-before $E2E > $OUT/r/e2e-before.log 2>&1
echo "e2e before rc $?"
for d in e2e-after e2e-before; do echo "== $d"; grep -E "plan|prefill|decode" $OUT/r/$d.log | tail -6 | cut -c1-250; done
cd $OUT && tar czf r.tgz r && rm -rf r
