#!/usr/bin/env bash
# session 20, call 3 (issue 13): call 2's decode step failed to capture: its warm-up ran the eager pick (the GEMV)
# only, so cuBLAS (the captured pick) created its handle inside the capture. Now the first eager call of a selection
# or prepared call also runs the captured pick once. Set C: mm without bias at small M on the QKV/O shapes (set A
# measured no bias at M <= 64 on the unembedding only). The H100 table from sets A + B + C; GPU tests; the anchor
# alternated with the session's starting wheels (.anchors/before, 7c09426: no H100 table); the decode step.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W; S=$R/docs/benchmarks/h100-2026-12-06/sel
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; (cd /tmp && timeout $lim python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "$@" \
  > $W/tests-$name.txt 2>&1); echo "tests $name rc $?"; grep -E "FAILED|ERROR" $W/tests-$name.txt | cut -c1-300 | head -8
  tail -1 $W/tests-$name.txt; }
(cd /tmp && timeout 200 python3 -m tokenspeed_kernel bench mm --shapes $S/mm-cases-C.json \
  --graph --eager --no-ceilings --quiet --warmup-ms 10 --rep-ms 40 --json $W/mm-C.json --md $W/mm-C.md \
  > $W/bench.txt 2>&1); echo "bench rc $?"
(cd /tmp && python3 -m tokenspeed_kernel oracle build $S/mm-A.json $S/mm-B.json $W/mm-C.json -o $W/h100.json \
  > $W/oracle.txt 2>&1); echo "oracle rc $?"; tail -1 $W/oracle.txt
python3 - <<'PY'
import json
d = json.load(open("/tmp/r/mm-C.json"))
for r in d["results"]:
    e = {x["name"]: x for x in r["entries"] if x.get("median_us")}
    print(r["label"], *(f"{k.split('.')[0]}:g{v['graph_median_us'] or 0:.1f}/e{v['eager_us'] or 0:.1f}" for k, v in e.items()), r["error"][:80])
PY
t oracle 60 -m gpu $R/packages/tokenspeed-kernel-core/tests/test_oracle.py
export TOKENSPEED_KERNEL_ORACLE=$W/h100.json
t model 100 -m gpu $R/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py
mkdir -p /tmp/site-before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-before .whl/*.whl .anchors/before/*.whl
for run in after1 before1 after2 before2 after3 before3; do
  site=/tmp/site; tab=$W/h100.json; [ "${run#before}" != "$run" ] && site=/tmp/site-before tab=
  (mkdir -p $W/anchor-$run && cd $W/anchor-$run && TOKENSPEED_KERNEL_ORACLE=$tab PYTHONPATH=$site timeout 40 \
    python3 $R/.anchors/host_cost.py > log.txt 2>&1)
  echo "anchor $run rc $?"; cut -c1-160 $W/anchor-$run/log.txt | grep -v "'direct_us'"
done
for run in after before; do
  site=/tmp/site; tab=$W/h100.json; cfg=full,full+prepared; [ $run = before ] && site=/tmp/site-before tab= cfg=full
  TOKENSPEED_KERNEL_ORACLE=$tab PYTHONPATH=$site timeout 120 python3 tools/host_probe.py --out $W/probe-$run --skip-ops \
    --layers 24 --decode-configs $cfg --rounds 2 > $W/probe-$run.txt 2>&1; echo "probe $run rc $?"
  grep -E "eager|proxy|Error|error" $W/probe-$run.txt | cut -c1-250 | head -12
done
tar czf $OUT/r.tgz -C $W .
