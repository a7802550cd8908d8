#!/usr/bin/env bash
# Session 26, call 2 (ran 2026-12-06 23:30 UTC on an H100, commit 41d3076; outputs in r/): the CUDA-core MoE path (hopper/moe/gemv.py) against the MMA decode path, and the GPU tests
# session 25 missed (s26-call1, which found no machine).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s26-call2/call.sh", carry=[".whl"])
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 tools/moe_gemv_probe.py --out $W --tokens 1,2,4 --rounds 2 --budget-s 120 \
  --gemv "16,16,4/8,8,4;32,8,4/4,16,4;32,16,8/8,16,8;16,8,4/8,8,4" > $W/gemv.txt 2>&1
echo "gemv probe rc $?"; cut -c1-160 $W/gemv.txt | grep -v Warning; snap
T=$R/packages/tokenspeed-kernel-triton/tests; C=$R/packages/tokenspeed-kernel-core/tests
t() {  # name, then pytest arguments
  local n=$1; shift
  (cd /tmp && timeout 90 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu "$@" > $W/t-$n.txt 2>&1)
  echo "tests $n rc $? | $(tail -1 $W/t-$n.txt)"; grep -E "^(FAILED|ERROR)" $W/t-$n.txt | cut -c1-250 | head -4
}
t gemv $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_gemv.py
snap
# The decode step (24 layers, prepared calls): the MMA decode path, then the CUDA-core path where the probe found it
# faster (step_gemv.py sets GEMV_TILES from the probe's layer times).
S="--skip-ops --layers 24 --decode-configs full+prepared --rounds 3"
timeout 150 python3 tools/host_probe.py $S --out $W/step-mma > $W/step-mma.txt 2>&1; echo "step mma rc $?"
grep -E "^full|proxy|^plans.*moe" $W/step-mma.txt | cut -c1-200; snap
timeout 150 python3 $R/docs/benchmarks/h200-2026-12-01/host-cost/s26-call2/step_gemv.py $W/moe_gemv_probe.json $S \
  --out $W/step-gemv > $W/step-gemv.txt 2>&1; echo "step gemv rc $?"
grep -E "^tokens|GEMV_TILES|^full|proxy|^plans.*moe" $W/step-gemv.txt | cut -c1-200; snap
t append $T/test_attention.py -k append
t gate $T/test_moe.py -k gate
t model $C/test_gpt_oss_model.py $C/test_compile.py
snap
