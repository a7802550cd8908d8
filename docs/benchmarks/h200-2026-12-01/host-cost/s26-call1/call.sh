#!/usr/bin/env bash
# Session 26, call 1: NOT RUN (no machine could be started; call 2 ran these tests). Session 25 wrote a longer
# version; this one has only the GPU tests session 25's calls
# missed. Its call 1 gave pytest -k twice, and the second replaced the first, so the appending decode's bit test
# against the two calls (test_gpu_decode_append_gptoss), the GPT-OSS model and compile GPU tests did not run; its
# call 3 did not run the router's GPU tests on NVIDIA's new rows. One -k a pytest here. The gate probe, the step with
# --sites and py-spy on op_spin were cut to keep device time for the MoE decode work of session 26.
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s26-call1/call.sh", carry=[".whl"])
# .whl: ../shared/tools/gpu-wheels.sh .whl, then the same with tokenspeed-triton-kernels (tokenspeed-fa3 left out).
rm -rf /tmp/site /tmp/w
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/w; mkdir -p $W
snap() { tar czf $OUT/r.tgz -C /tmp w; }
nvidia-smi --query-gpu=name --format=csv,noheader
T=$R/packages/tokenspeed-kernel-triton/tests; C=$R/packages/tokenspeed-kernel-core/tests
t() {  # name, then pytest arguments
  local n=$1; shift
  (cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu "$@" > $W/t-$n.txt 2>&1)
  echo "tests $n rc $? | $(tail -1 $W/t-$n.txt)"; grep -E "^(FAILED|ERROR)" $W/t-$n.txt | cut -c1-250 | head -4
}
t append $T/test_attention.py -k append
t gate $T/test_moe.py -k gate
t model $C/test_gpt_oss_model.py $C/test_compile.py
t launch $T/test_launch_gpu.py -k "append or moe_gate or rmsnorm"
snap
