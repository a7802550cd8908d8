#!/usr/bin/env bash
# session 20, call 1 (issue 13): eager scores. bench mm with --graph --eager on GPT-OSS's dense GEMMs (M 1..8192) ->
# an H100 measured table (oracle build); the GPU tests of what changed (a captured graph takes the captured pick,
# cached launch vs JIT for mm); bench --host mm/rmsnorm/decode attention with the new table.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
(cd /tmp && timeout 300 python3 -m tokenspeed_kernel bench mm --shapes $R/docs/benchmarks/h100-2026-12-06/sel/mm-cases.json \
  --graph --eager --no-ceilings --quiet --warmup-ms 10 --rep-ms 40 --json $W/mm-h100.json --md $W/mm-h100.md \
  --oracle-out $W/h100-table.json > $W/bench.txt 2>&1); echo "bench rc $?"; tail -5 $W/bench.txt | cut -c1-200
python3 - <<'PY'
import json
d = json.load(open("/tmp/r/mm-h100.json"))
for r in d["results"]:
    e = {x["name"]: x for x in r["entries"] if x.get("median_us")}
    print(r["label"], *(f"{k.split('.')[0]}:g{v['graph_median_us'] or 0:.1f}/e{v['eager_us'] or 0:.1f}" for k, v in e.items()), r["error"][:80])
PY
t oracle 60 -m gpu $R/packages/tokenspeed-kernel-core/tests/test_oracle.py
t launch 100 -m gpu $R/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py -k "mm and not moe"
export TOKENSPEED_KERNEL_ORACLE=$W/h100-table.json
(cd /tmp && timeout 120 python3 -m tokenspeed_kernel bench mm --host --json $W/host-mm.json --md $W/host-mm.md \
  > $W/host-mm.txt 2>&1); echo "host rc $?"; cut -c1-250 $W/host-mm.txt | tail -4
tar czf $OUT/r.tgz -C $W .
