#!/usr/bin/env bash
# Session 31, call 2 (issue 13): the tensor-core GEMV with its chunk loop unrolled by four (four chunks of codes in
# flight a warp, no register moves), against the fp32 GEMV: 1. numerics + each kernel alone; 2. the TC GPU tests;
# 3. moe_apply alone at 1 and 2 tokens (20B) and the TC tile sweep; 4. the public call eager (fp32 GEMV, TC).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s31-call2/call.sh", carry=[".whl", ".anchors"])
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; rm -rf $W; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
TC="t1,4/t1:2"
(cd /tmp && timeout 130 python3 $R/tools/moe_gemv_probe.py --out $W --stages numerics,kernels --experts 32 \
  --gemv-tiles "$TC" --kernel-gate-up "1,8,1;t1,4;t1,8;t2,4;t1,2" \
  --kernel-down "1,4;t1:1;t1:2;t1:4;t2:2;t2:1" --tag=-kernels --budget-s 100 > $W/kernels.txt 2>&1)
echo "kernels rc $?"; grep -E "^(numerics|kernel)" $W/kernels.txt | cut -c1-200; grep -iE "error|Traceback" $W/kernels.txt | head -5; snap
T=$R/packages/tokenspeed-kernel-nvidia/tests
(cd /tmp && timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu $T/test_hopper_moe.py \
  -k "tc_tiles" > $W/t-moe.txt 2>&1)
echo "tests moe rc $? | $(tail -1 $W/t-moe.txt)"; grep -E "^(FAILED|ERROR|E  )" $W/t-moe.txt | cut -c1-300 | head -8; snap
(cd /tmp && timeout 110 python3 $R/tools/moe_gemv_probe.py --out $W --stages apply,sweep --experts 32 \
  --tokens 1,2 --gemv-tiles "$TC" --gate-up "t1,4;t1,8;t2,4" --down "t1:2;t1:4;t2:2;t2:1" \
  --budget-s 90 > $W/probe.txt 2>&1)
echo "probe rc $?"; grep -E "^(apply|best)" $W/probe.txt | cut -c1-250
grep "^sweep" $W/probe.txt | tr '\n' '|'; echo; snap
BEST=$(python3 -c "import json;print(json.load(open('$W/moe_gemv_probe.json')).get('best','$TC'))")
(cd /tmp && timeout 50 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv \
  --tag=-fp32gemv --experts 32 > $W/eager-fp32gemv.txt 2>&1)
echo "eager fp32 gemv rc $? $(grep ^eager $W/eager-fp32gemv.txt | cut -c1-200 | tr '\n' '|')"
(cd /tmp && timeout 50 python3 $R/tools/moe_gemv_probe.py --out $W --stages eager --default-gemv --gemv-tiles "$BEST" \
  --tag=-tc --experts 32 > $W/eager-tc.txt 2>&1)
echo "eager tc rc $? $(grep ^eager $W/eager-tc.txt | cut -c1-200 | tr '\n' '|')"; snap
