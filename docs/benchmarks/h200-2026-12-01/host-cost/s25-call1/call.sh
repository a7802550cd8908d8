#!/usr/bin/env bash
# session 25, call 1 (issue 13): session 24's planned first call (s24-call1/call.sh, not run there), unchanged below its
# header. Carried: .whl (hatchling, trove-classifiers, editables, tokenspeed-triton-kernels; no FA3: the 64 MiB carry),
# .anchors (host_cost.py, tk_moe.py, and .anchors/s23: wheels of 44b1a7f, session 23's end), made as session 24
# wrote (its s24-call1/call.sh was this script, not run):
# Before it, here (the ignored, carried folders):
#   ../shared/tools/gpu-wheels.sh .whl; pip download tokenspeed-triton-kernels into .whl (see the device README)
#   cp ../shared/tools/anchors/{host_cost.py,tk_moe.py} .anchors/
#   git worktree add /tmp/s23 44b1a7f   # session 23's end: 7 op calls a layer, one-program router
#   for p in core triton nvidia amd; do pip wheel --no-deps --no-build-isolation -w .anchors/s23 \
#     /tmp/s23/packages/tokenspeed-kernel-$p; done
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s25-call1/call.sh", carry=[".whl", ".anchors"])
# What it did not do as written (the report's Session 25): pytest's -k is given twice in stage 1, so the second (gate)
# replaced the first (append) and deselected the model and compile tests; bench --host takes one target, so stage
# 3 stopped at its argument error (rc 2).
# 1. GPU tests of session 23-24's kernels: the appending decode against the two calls it replaces (bits, CUDA graph),
#    the router (split experts, the norm's one-tile pass) against the two calls, the launch/graph test of every case of
#    the three ops, the GPT-OSS model and compile tests; verify of the two Triton kernels on the GPU sets.
# 2. moe_gate's decode tiles side by side (tools/gate_tile_probe.py: split against one program, flushed graphs).
# 3. bench --host of the decode layer's attention calls (the graph column is the device time) and moe_gate.
# 4. The 24-layer prepared decode step, session 23's end (.anchors/s23) against this checkout, alternated processes.
# 5. The anchor host table.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/s23/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
T=$R/packages/tokenspeed-kernel-triton/tests; C=$R/packages/tokenspeed-kernel-core/tests
(cd /tmp && PYTHONPATH=/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $T/test_attention.py -k append $T/test_moe.py -k gate $C/test_gpt_oss_model.py $C/test_compile.py \
  > $W/tests-a.txt 2>&1; echo "a rc $?" >> $W/tests-a.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $T/test_launch_gpu.py -k "append or moe_gate or rmsnorm" > $W/tests-b.txt 2>&1; echo "b rc $?" >> $W/tests-b.txt) &
(cd /tmp && for k in mha_decode_append_kvcache moe_gate; do PYTHONPATH=/tmp/site timeout 110 python3 -m tokenspeed_kernel \
  verify triton.$k --set gpu; echo "verify $k rc $?"; done > $W/verify.txt 2>&1) &
wait
for f in tests-a tests-b; do grep -E "FAILED|ERROR" $W/$f.txt | cut -c1-250 | head -4; tail -2 $W/$f.txt; done
grep -E "^(FAIL|ERROR)|^verify|passed" $W/verify.txt | cut -c1-200
PYTHONPATH=/tmp/site timeout 120 python3 tools/gate_tile_probe.py --out $W --tokens 1,2,8 --rounds 2 > $W/gate.txt 2>&1
echo "gate probe rc $?"; cut -c1-220 $W/gate.txt
(cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m tokenspeed_kernel bench --host mha_decode_append_kvcache \
  apply_rotary_and_store mha_decode_with_kvcache moe_gate --quiet --json $W/host.json --md $W/host.md > $W/host.txt 2>&1)
echo "host rc $?"; grep "^|" $W/host.md | cut -c1-230
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --rounds 3"
for run in before1 after1 before2 after2; do
  site=/tmp/site; [ "${run:0:6}" = before ] && site=/tmp/site-before
  PYTHONPATH=$site timeout 80 python3 $P --out $W/$run > $W/step-$run.txt 2>&1
  echo "$run rc $? | $(grep -E '^host proxy|^full' $W/step-$run.txt | cut -c1-150 | tr '\n' '|')"
done
grep "^plans" $W/step-after1.txt | cut -c1-160
(mkdir -p $W/anchor && cd $W/anchor && PYTHONPATH=/tmp/site timeout 80 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1)
echo "anchor rc $?"; tail -9 $W/anchor/host-anchor.log | cut -c1-200
