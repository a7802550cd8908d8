#!/usr/bin/env bash
# session 23, call 1 (issue 13): the GPU tests of hopper.moe_apply with session 22's decode table (scales six K
# blocks ahead, a 4-deep gate/up ring at 1, 3 and 4 tokens), in three pytest processes at once (compiles are
# CPU-bound); then moe_apply against the triton_kernels peer (wheel tokenspeed-triton-kernels carried) and the
# anchor .anchors/tk_moe.py at decode sizes (GPT-OSS-120B layer); then the GPT-OSS-20B decode step, eager against
# its CUDA graph, with the new table.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; nproc
T=$R/packages/tokenspeed-kernel-nvidia/tests
start=$(date +%s)
(cd /tmp && PYTHONPATH=/tmp/site timeout 250 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $T/test_hopper_moe.py -k "reference and canonical" > $W/tests-a.txt 2>&1; echo "a rc $?" >> $W/tests-a.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 250 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $T/test_hopper_moe.py -k "reference and packed" > $W/tests-b.txt 2>&1; echo "b rc $?" >> $W/tests-b.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 250 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $T/test_hopper_moe.py $T/test_hopper_moe_pdl.py -k "not reference" > $W/tests-c.txt 2>&1; echo "c rc $?" >> $W/tests-c.txt) &
wait
echo "tests took $(( $(date +%s) - start )) s"
for f in a b c; do grep -E "FAILED|ERROR" $W/tests-$f.txt | cut -c1-250 | head -4; tail -2 $W/tests-$f.txt; done
export PYTHONPATH=/tmp/site
timeout 120 python3 tools/hopper_moe_h200.py --out $W/moe --tokens 1,2,4,8,64 --skip-numerics --skip-breakdown \
  --budget-s 100 > $W/moe.txt 2>&1
echo "moe rc $?"; grep -E "bench" $W/moe.txt | cut -c1-260
timeout 100 python3 .anchors/tk_moe.py --out $W/tk --tokens 1,8,64 --iters 20 --batch-reps 0 > $W/tk.txt 2>&1
echo "tk rc $?"; tail -6 $W/tk.txt | cut -c1-250
timeout 70 python3 tools/host_probe.py --out $W/step --skip-ops --layers 24 --decode-configs full+prepared \
  --rounds 2 > $W/step.txt 2>&1
echo "step rc $?"; grep -E "^full|proxy|graph" $W/step.txt | cut -c1-200 | head -8
