#!/usr/bin/env bash
# NOT RUN (written in session 25, out of device time): the next session's first call for issue 13. Carry .whl
# (../shared/tools/gpu-wheels.sh .whl, then the same with tokenspeed-triton-kernels and py-spy; leave tokenspeed-fa3
# out: the 64 MiB carry).
# run(command="bash docs/benchmarks/h200-2026-12-01/host-cost/s26-call1/call.sh", carry=[".whl"])
# 1. The GPU tests session 25's calls missed: its call 1 gave pytest -k twice, and the second replaced the first, so
#    the appending decode's bit test against the two calls (test_gpu_decode_append_gptoss), the GPT-OSS model and
#    compile GPU tests did not run; call 3 did not run the router's GPU tests on NVIDIA's new rows. One -k a pytest.
# 2. moe_gate's host cost by tile (gate_tile_probe --host): the shipped rows, session 24's split, one program.
# 3. The 24-layer prepared decode step, eager against graph, in-situ host time per op (--sites).
# 4. Where a call's host time goes: tools/op_spin.py under py-spy --native (moe_gate with the norm, apply_rotary,
#    rmsnorm: 31.7, 20.1 and 9.8 us a prepared call back to back in session 25's bench --host), tables by
#    tools/spy_table.py.
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
timeout 120 python3 tools/gate_tile_probe.py --out $W --experts 32,128 --tokens 1,8 --rounds 2 --host \
  --tiles "table;1,1024,4;1,1024,0" > $W/gate.txt 2>&1; echo "gate probe rc $?"; cut -c1-300 $W/gate.txt; snap
timeout 150 python3 tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --rounds 3 --sites \
  --out $W/step > $W/step.txt 2>&1
echo "step rc $?"; grep -E "^full|proxy|^ *[a-z_]+ +[0-9.]+ calls" $W/step.txt | cut -c1-200; snap
for c in moe_gate_norm apply_rotary rmsnorm; do
  timeout 40 /tmp/site/bin/py-spy record --native -r 250 -f raw -o $W/spy-$c.txt -- python3 tools/op_spin.py $c \
    --seconds 6 > $W/spin-$c.txt 2>&1; echo "spin $c rc $? | $(tail -1 $W/spin-$c.txt)"
  python3 tools/spy_table.py $W/spy-$c.txt --by function --top 25 > $W/spy-$c-fn.txt 2>&1
  python3 tools/spy_table.py $W/spy-$c.txt --by library --top 12 > $W/spy-$c-lib.txt 2>&1
  head -20 $W/spy-$c-fn.txt | cut -c1-160; head -10 $W/spy-$c-lib.txt | cut -c1-160
done; gzip -f $W/spy-*.txt 2>/dev/null; snap
