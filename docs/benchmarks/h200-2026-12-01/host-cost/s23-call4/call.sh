#!/usr/bin/env bash
# session 23, call 4 (issue 13): the post-attention norm inside moe_gate (GPT-OSS: 7 op calls a decode layer, was 8).
# GPU tests (the fused router against the two calls it replaces; the launch/graph test of moe_gate's cases, the norm
# ones included; the GPT-OSS model's GPU tests), verify of triton.moe_gate on the GPU set; then the 24-layer prepared
# decode step with the code before session 23 (wheels of 8729716, .anchors/pre-s23), with the norm in moe_gate only
# (wheels of b883557, .anchors/s23-norm) and with the decode buffers too (this checkout, 5034a85), in alternated
# processes; the in-situ table of the last; bench --host of moe_gate; the anchor host table (.anchors/host_cost.py).
rm -rf /tmp/site /tmp/site-before /tmp/site-norm
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/pre-s23/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-norm .whl/*.whl .anchors/s23-norm/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
start=$(date +%s)
(cd /tmp && PYTHONPATH=/tmp/site timeout 220 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_moe.py -k gate $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py \
  > $W/tests-a.txt 2>&1; echo "a rc $?" >> $W/tests-a.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 220 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "moe_gate or rmsnorm" > $W/tests-b.txt 2>&1; echo "b rc $?" >> $W/tests-b.txt) &
(cd /tmp && PYTHONPATH=/tmp/site timeout 220 python3 -m tokenspeed_kernel verify triton.moe_gate --set gpu > $W/verify.txt 2>&1; echo "verify rc $?" >> $W/verify.txt) &
wait
echo "tests took $(( $(date +%s) - start )) s"
for f in tests-a tests-b; do grep -E "FAILED|ERROR" $W/$f.txt | cut -c1-250 | head -4; tail -2 $W/$f.txt; done
grep -E "^(FAIL|ERROR)" $W/verify.txt | cut -c1-250 | head -4; tail -2 $W/verify.txt | cut -c1-200
P="tools/host_probe.py --skip-ops --layers 24 --decode-configs full+prepared --rounds 3"
for run in before1 norm1 after1 before2 norm2 after2; do
  site=/tmp/site; [ "${run:0:6}" = before ] && site=/tmp/site-before; [ "${run:0:4}" = norm ] && site=/tmp/site-norm
  PYTHONPATH=$site timeout 80 python3 $P --out $W/$run > $W/step-$run.txt 2>&1
  echo "$run rc $? | $(grep -E '^host proxy|^full' $W/step-$run.txt | cut -c1-150 | tr '\n' '|')"
done
grep "^plans" $W/step-after1.txt | cut -c1-160
PYTHONPATH=/tmp/site timeout 80 python3 $P --out $W/sites --sites > $W/sites.txt 2>&1
echo "sites rc $?"; grep -v -E "^plans|^hopper" $W/sites.txt | tail -12 | cut -c1-200
(cd /tmp && PYTHONPATH=/tmp/site timeout 100 python3 -m tokenspeed_kernel bench --host moe_gate --quiet \
  --json $W/host.json --md $W/host.md > $W/host.txt 2>&1); echo "host rc $?"; grep -v "^$" $W/host.md | tail -8
(mkdir -p $W/anchor && cd $W/anchor && PYTHONPATH=/tmp/site timeout 80 python3 $R/.anchors/host_cost.py > host-anchor.log 2>&1)
echo "anchor rc $?"; tail -9 $W/anchor/host-anchor.log | cut -c1-200
