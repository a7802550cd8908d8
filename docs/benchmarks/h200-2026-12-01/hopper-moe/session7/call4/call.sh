#!/usr/bin/env bash
# session 7, call 4: the decode-path GPU tests (every table tile), verify of hopper.moe_apply (1-2048 tokens: the
# decode and prefill paths against the reference), the table (route + apply, with the bf16 grouped GEMMs),
# end to end (GPT-OSS-20B, full vs triton)
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
T=$R/packages/tokenspeed-kernel-nvidia/tests
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $T/test_hopper_moe.py 2>&1 | tee $OUT/r/gpu-tests-decode.log | tail -2
timeout 100 python3 -m tokenspeed_kernel verify hopper.moe_apply --set gpu --json $OUT/r/verify.json > $OUT/r/verify.log 2>&1; echo "verify rc $?"; tail -9 $OUT/r/verify.log
timeout 120 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/table --skip-numerics --skip-breakdown --tokens 1,8,64,512,1024,4096,16384 --grouped-mm > $OUT/r/table.log 2>&1; echo "table rc $?"; grep "bench {" $OUT/r/table.log | cut -c1-260
timeout 150 python3 $R/tools/gpt_oss_throughput.py --out $OUT/r/e2e --configs full,triton --prefill 8x2048 --decode-batches 1,64 --eager-decode-steps 0 --no-op-times > $OUT/r/e2e.log 2>&1; echo "e2e rc $?"; tail -10 $OUT/r/e2e.log
cd $OUT && tar czf r.tgz r && rm -rf r
