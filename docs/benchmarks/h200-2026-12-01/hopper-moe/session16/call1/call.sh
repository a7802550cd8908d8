#!/usr/bin/env bash
# session 16, call 1: session 15 call 2 again (its raw results were lost with that session; same kernels, bedee67), issue 11 "must show": (1) verify of every moe_apply kernel on the GPU
# shapes; (2) the triton_kernels wrapper's GPU tests; (3) the table: route + apply of every moe_apply kernel
# (the peer among them) and the bf16 torch._grouped_mm column, CUDA graph, L2 flushed; (4) the anchor script
# .anchors/tk_moe.py at the same token counts, in the same call.
# (5) issue 13: the GPT-OSS-20B decode step (24 layers, prepared calls) eager vs graph, with a cProfile table of it.
export WHL_DIR=.whl-moe; rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; mkdir -p $OUT/r; cd /tmp
timeout 150 python3 -m tokenspeed_kernel verify moe_apply --set gpu --json $OUT/r/verify.json > $OUT/r/verify.log 2>&1
echo "verify rc $?"; grep -cE "PASS" $OUT/r/verify.log; grep -E "FAIL|SKIP" $OUT/r/verify.log | cut -c1-200 | head -12; tail -2 $OUT/r/verify.log
timeout 80 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs $R/packages/tokenspeed-kernel-nvidia/tests/test_triton_kernels.py \
  > $OUT/r/tk-tests.log 2>&1; echo "tk-tests rc $?"; tail -2 $OUT/r/tk-tests.log
timeout 150 python3 $R/tools/hopper_moe_h200.py --out $OUT/r/table --skip-numerics --skip-breakdown --grouped-mm \
  --tokens 1,8,64,512,4096,16384 > $OUT/r/table.log 2>&1; echo "table rc $?"; grep "bench {" $OUT/r/table.log | cut -c1-500
timeout 80 python3 $R/.anchors/tk_moe.py --out $OUT/r/anchor --tokens 1,8,64,512,4096,16384 > $OUT/r/anchor.log 2>&1
echo "anchor rc $?"; tail -12 $OUT/r/anchor.log | cut -c1-200
echo; cd /tmp; timeout 100 python3 $R/tools/host_probe.py --out $OUT/r/probe --skip-ops --layers 24 --decode-configs full+prepared --rounds 3 --profile > $OUT/r/probe.log 2>&1; echo "probe rc $?"; tail -3 $OUT/r/probe.log
cd $OUT && tar czf r.tgz r && rm -rf r
