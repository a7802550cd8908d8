#!/usr/bin/env bash
# session 20, call 4 (issue 13): the H100 table shipped in the nvidia package (no TOKENSPEED_KERNEL_ORACLE). GPU tests;
# bench --host over the decode step's ops; the 24-layer decode step with the eager GEMV against mm forced to cuBLAS
# (the dense GEMMs as the session began), alternated in one process, plain and prepared; two anchor processes.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
t oracle 60 $R/packages/tokenspeed-kernel-core/tests/test_oracle.py $R/packages/tokenspeed-kernel-nvidia/tests/test_measured_table.py
t model 100 -m gpu $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py
t launch 100 -m gpu $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "mm and not moe"
(cd /tmp && timeout 150 python3 -m tokenspeed_kernel bench --host --json $W/host.json --md $W/host.md \
  > $W/host.txt 2>&1); echo "host rc $?"; cut -c1-250 $W/host.txt | grep -v "^\s*$" | tail -16
timeout 200 python3 tools/host_probe.py --out $W/probe --skip-ops --layers 24 \
  --decode-configs full,mm=cublas.mm_bf16,full+prepared,mm=cublas.mm_bf16+prepared --rounds 3 > $W/probe.txt 2>&1
echo "probe rc $?"; grep -E "eager|proxy|Error|error" $W/probe.txt | cut -c1-250 | head -12
for run in after1 after2; do
  (mkdir -p $W/anchor-$run && cd $W/anchor-$run && timeout 40 python3 $R/.anchors/host_cost.py > log.txt 2>&1)
  echo "anchor $run rc $?"; cut -c1-160 $W/anchor-$run/log.txt | grep -v "'direct_us'"
done
tar czf $OUT/r.tgz -C $W .
