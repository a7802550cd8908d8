#!/usr/bin/env bash
# session 22, call 3 (issue 13): hopper.moe_apply's decode GEMMs with the bias, routing weights and first scale bytes
# requested before the K loop (and before the grid wait), against the wheels of 7c09426 (the same decode path
# otherwise) in alternated processes; in the new code, scale bytes requested 3 or 6 K blocks ahead
# (tools/moe_ahead_probe.py; also a 4-deep gate/up ring, which fits 6 scale stages without spills); bits compared
# across every process and depth; each GEMM alone also after a clean (read) L2 flush; then the Hopper MoE GPU tests.
# Ran twice (try1/ at 7009b61, try2/ at 2070aee); the probe, then tools/moe_ahead_probe.py, is kept beside this script.
rm -rf /tmp/site /tmp/site-before
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
export PYTHONUNBUFFERED=1
R=$PWD; W=$OUT/r; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
for run in before1 after1; do
  site=/tmp/site; [ "${run:0:6}" = before ] && site=/tmp/site-before
  PYTHONPATH=$site timeout 150 python3 tools/moe_ahead_probe.py --out $W --tag $run --tokens 1,4,2 --rounds 1 --gate-up-alt 32,8,1,4,1 > $W/$run.txt 2>&1
  echo "$run rc $?"; grep -E "^(layer|gemm)" $W/$run.txt | cut -d' ' -f3- | awk '{printf "%s | ", $0} END {print ""}'
  tail -1 $W/$run.txt | cut -c1-200
done
PYTHONPATH=/tmp/site python3 - <<'PY'
import glob, os, torch
W = os.environ["OUT"] + "/r"
for t in (1, 2, 4):
    files = sorted(glob.glob(f"{W}/bits-*-t{t}.pt"))
    ref = torch.load(files[0])
    print("bits", t, {os.path.basename(f): bool(torch.equal(torch.load(f), ref)) for f in files})
PY
(cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
  $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py $R/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe_pdl.py > $W/tests-moe.txt 2>&1)
echo "tests moe rc $?"; grep -E "FAILED|ERROR" $W/tests-moe.txt | cut -c1-300 | head -5; tail -1 $W/tests-moe.txt
