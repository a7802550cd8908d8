#!/usr/bin/env bash
# session 20, call 2 (issue 13): bench mm without bias at M 32..8192 (set B; set A of call 1 measured no bias only at
# M <= 64, so the table's nearest bucket would have ranked large-M calls by M = 64); the H100 table from sets A + B;
# the anchor's host table alternated with the session's starting wheels (.anchors/before, 7c09426: no H100 table),
# the new table through TOKENSPEED_KERNEL_ORACLE; the 24-layer decode step eager vs graph, after and before.
rm -rf /tmp/site
bash tools/gpu_session.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
R=$PWD; W=/tmp/r; rm -rf $W; mkdir -p $W; S=$R/docs/benchmarks/h100-2026-12-06/sel
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp && timeout 200 python3 -m tokenspeed_kernel bench mm --shapes $S/mm-cases-B.json \
  --graph --eager --no-ceilings --quiet --warmup-ms 10 --rep-ms 40 --json $W/mm-B.json --md $W/mm-B.md \
  > $W/bench.txt 2>&1); echo "bench rc $?"
(cd /tmp && python3 -m tokenspeed_kernel oracle build $S/mm-A.json $W/mm-B.json -o $W/h100.json > $W/oracle.txt 2>&1)
echo "oracle rc $?"; tail -2 $W/oracle.txt
python3 - <<'PY'
import json
d = json.load(open("/tmp/r/mm-B.json"))
for r in d["results"]:
    e = {x["name"]: x for x in r["entries"] if x.get("median_us")}
    print(r["label"], *(f"{k.split('.')[0]}:g{v['graph_median_us'] or 0:.1f}/e{v['eager_us'] or 0:.1f}" for k, v in e.items()), r["error"][:80])
PY
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
  TOKENSPEED_KERNEL_ORACLE=$tab PYTHONPATH=$site timeout 110 python3 tools/host_probe.py --out $W/probe-$run --skip-ops \
    --layers 24 --decode-configs $cfg --rounds 2 > $W/probe-$run.txt 2>&1; echo "probe $run rc $?"
  grep -E "eager|proxy|graph calls" $W/probe-$run.txt | cut -c1-250
done
tar czf $OUT/r.tgz -C $W .
