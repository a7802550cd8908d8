#!/usr/bin/env bash
# session 11, call 4: with the rebuilt measured table (moe_plan now picks hopper.moe_apply_packed for bf16
# activations): the GPT-OSS model GPU tests, then GPT-OSS-20B end to end, once with the table's choice and
# once with moe_apply forced to the canonical kernel (same process order, same machine).
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; cd /tmp
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py \
  > $OUT/model-tests.log 2>&1; echo "model tests rc $?"; tail -2 $OUT/model-tests.log
E2E="--configs full --prefill 8x2048 --decode-batches 1,64 --eager-decode-steps 0 --no-op-times"
timeout 130 python3 $R/tools/gpt_oss_throughput.py --out $OUT/e2e-table $E2E > $OUT/e2e-table.log 2>&1; echo "e2e table rc $?"
TOKENSPEED_KERNEL_OVERRIDE="moe_apply=hopper.moe_apply|triton.moe_apply" timeout 130 python3 $R/tools/gpt_oss_throughput.py \
  --out $OUT/e2e-canonical $E2E > $OUT/e2e-canonical.log 2>&1; echo "e2e canonical rc $?"
for d in e2e-table e2e-canonical; do echo "== $d"; grep -E "plan|prefill|decode" $OUT/$d.log | tail -6 | cut -c1-250; done
