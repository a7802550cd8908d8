#!/usr/bin/env bash
# One GPU call on the lent H200 (see docs/benchmarks/README.md): install the carried
# wheels and this checkout's packages into /tmp/site, then run the named stages. A warm
# machine keeps /tmp/site between calls: the wheels install once, the packages again
# whenever a hash of their sources changed (else a call after a code change would run
# the code an earlier call installed).
#   tools/gpu_session.sh STAGE [STAGE ...]
# Stages: tests (GPU-marked tests of every package), verify, bench-prefill,
#         bench-triton-attention, bench-triton-moe, bench-triton-dense, gpt-oss, demo,
#         tk-tests (triton_kernels wrapper GPU tests), selection (tools/selection_h200.py bench),
#         selection-report (table + regret), e2e-selection (GPT-OSS-20B with and without the new table),
#         tk-anchor (the triton_kernels MoE anchor, .anchors/tk_moe.py carried beside the checkout),
#         amd-moe (the AMD MoE's portable twin: GPU tests, tools/bench_amd_moe_twin.py),
#         gdn (linear attention: GPU tests, verify of the Triton kernels, bench of both ops with fla),
#         hopper-moe (hopper.moe_apply: GPU tests, tools/hopper_moe_h200.py $HOPPER_ARGS), hopper-moe-tests (the tests only),
#         host-bench (bench --host: default selection, Triton forced, hopper.moe_apply forced),
#         attention-tests (Triton attention + GPT-OSS model GPU tests, attention plans included),
#         launch-tests (cached launch vs JIT, graph replay, every in-tree kernel), host-anchor (.anchors/host_cost.py), host-probe (tools/host_probe.py: where an eager call's host time goes).
# WHL_DIR: the folder of carried wheels (default .whl).
# Everything a stage writes goes under $OUT (or ./out when OUT is unset).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHL_DIR:-.whl}"/*.whl || exit 1
  touch /tmp/site/.wheels
fi
# The checkout's packages, again whenever their sources changed (a warm machine keeps /tmp/site between calls).
stamp=$(find packages \( -path '*/src/*' -o -name pyproject.toml \) -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' | sort | xargs cat | sha1sum | cut -c1-16)
if [ "$(cat /tmp/site/.installed 2>/dev/null)" != "$stamp" ]; then
  export PYTHONPATH=/tmp/site
  for p in core triton nvidia amd; do
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site \
      "packages/tokenspeed-kernel-$p" || exit 1
  done
  echo "$stamp" > /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site
cd /tmp  # import the installed packages, not the checkout's sources
repo=$OLDPWD
python3 -c "import torch, triton, tokenspeed_kernel as tk; print(torch.__version__, triton.__version__, tk.current_platform().describe()); print({k: (v.status, len(v.kernels)) for k, v in tk.plugin_reports().items()})"
rc=0
for stage in "$@"; do
  echo "=== stage $stage ($(date +%T))"
  case "$stage" in
    tests)
      for p in core triton nvidia amd; do
        python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-$p/tests" \
          --junitxml="$OUT/gpu-tests-$p.xml" 2>&1 | tee "$OUT/gpu-tests-$p.log" | tail -25
        s=${PIPESTATUS[0]}; [ "$s" = 0 ] || [ "$s" = 5 ] || rc=1
      done ;;
    verify) python3 -m tokenspeed_kernel verify --json "$OUT/verify.json" 2>&1 | tee "$OUT/verify.log" | tail -40 || rc=1 ;;
    bench-prefill) python3 "$repo/tools/gpu_bench.py" --out "$OUT" || rc=1 ;;
    bench-triton-attention) python3 "$repo/tools/bench_triton_attention.py" --out "$OUT" || rc=1 ;;
    bench-triton-moe) python3 "$repo/tools/bench_triton_moe.py" --out "$OUT" || rc=1 ;;
    bench-triton-dense) python3 "$repo/tools/bench_triton_dense.py" --out "$OUT" || rc=1 ;;
    gpt-oss) python3 "$repo/tools/gpt_oss_throughput.py" --out "$OUT" || rc=1 ;;
    demo) python3 -m tokenspeed_kernel demo 2>&1 | tee "$OUT/demo.log" || rc=1 ;;
    tk-tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-nvidia/tests/test_triton_kernels.py" \
        2>&1 | tee "$OUT/tk-tests.log" | tail -15 || rc=1 ;;
    selection) python3 "$repo/tools/selection_h200.py" bench --out "$OUT/sel" ${SELECTION_ARGS:-} || rc=1 ;;
    selection-report)
      python3 "$repo/tools/selection_h200.py" report --runs "$OUT/sel" --table "$OUT/sel/h200.json" \
        --md "$OUT/sel/selection.md" > "$OUT/sel/report.log" 2>&1 || rc=1; tail -3 "$OUT/sel/report.log" ;;
    e2e-selection)
      for oracle in none "$OUT/sel/h200.json"; do
        name=$([ "$oracle" = none ] && echo priority || echo measured)
        TOKENSPEED_KERNEL_ORACLE=$oracle python3 "$repo/tools/gpt_oss_throughput.py" --out "$OUT/e2e-$name" \
          --configs full ${E2E_ARGS:---prefill 8x2048 --decode-batches 1,64} 2>&1 | tail -12 || rc=1
      done ;;
    amd-moe)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-amd/tests/test_gpu_moe_twin.py" \
        2>&1 | tee "$OUT/amd-moe-tests.log" | tail -15; s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1
      python3 "$repo/tools/bench_amd_moe_twin.py" --out "$OUT" ${AMD_MOE_ARGS:-} 2>&1 | tee "$OUT/amd-moe-bench.log" | tail -12 || rc=1 ;;
    gdn)
      timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-triton/tests/test_linear_attention.py" \
        2>&1 | tee "$OUT/gdn-tests.log" | tail -8; s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1
      for op in gdn_chunk_prefill gdn_decode; do
        timeout 150 python3 -m tokenspeed_kernel verify "triton.$op" --set gpu --json "$OUT/verify-$op.json" 2>&1 \
          | tee "$OUT/verify-$op.log" | tail -3 || rc=1
      done
      timeout 200 python3 -m tokenspeed_kernel bench gdn_chunk_prefill --no-ceilings --json "$OUT/bench-gdn_chunk_prefill.json" \
        --md "$OUT/bench-gdn_chunk_prefill.md" 2>&1 | tee "$OUT/bench-gdn_chunk_prefill.log" | tail -20 || rc=1
      timeout 100 python3 -m tokenspeed_kernel bench gdn_decode --peers --graph --no-ceilings --json "$OUT/bench-gdn_decode.json" \
        --md "$OUT/bench-gdn_decode.md" 2>&1 | tee "$OUT/bench-gdn_decode.log" | tail -20 || rc=1 ;;
    gdn-tune)
      timeout 150 python3 "$repo/tools/gdn_h200.py" probe --out "$OUT" 2>&1 | tee "$OUT/gdn-probe.log" | tail -6 || rc=1
      timeout 260 python3 "$repo/tools/gdn_h200.py" sweep --out "$OUT" 2>&1 | tee "$OUT/gdn-sweep.log" | tail -60 || rc=1 ;;
    hopper-moe)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py" \
        2>&1 | tee "$OUT/gpu-tests-hopper-moe.log" | tail -15
      s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1
      python3 "$repo/tools/hopper_moe_h200.py" --out "$OUT" ${HOPPER_ARGS:-} 2>&1 | tee "$OUT/hopper_moe.log" | tail -60 || rc=1 ;;
    hopper-moe-tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-nvidia/tests/test_hopper_moe.py" \
        2>&1 | tee "$OUT/gpu-tests-hopper-moe.log" | tail -15
      s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1 ;;
    attention-tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-triton/tests/test_attention.py" \
        "$repo/packages/tokenspeed-kernel-core/tests/test_gpt_oss_model.py" "$repo/packages/tokenspeed-kernel-core/tests/test_attention_plan.py" \
        2>&1 | tee "$OUT/gpu-tests-attention.log" | tail -25
      s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1 ;;
    launch-tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "$repo/packages/tokenspeed-kernel-triton/tests/test_launch_gpu.py" ${LAUNCH_ARGS:-} \
        2>&1 | tee "$OUT/gpu-tests-launch.log" | tail -25
      s=${PIPESTATUS[0]}; [ "$s" = 0 ] || rc=1 ;;
    host-bench)
      mkdir -p "$OUT/host"
      python3 -m tokenspeed_kernel bench --host --quiet --json "$OUT/host/default.json" --md "$OUT/host/default.md" || rc=1
      TOKENSPEED_KERNEL_OVERRIDE=triton python3 -m tokenspeed_kernel bench --host --quiet \
        --json "$OUT/host/triton.json" --md "$OUT/host/triton.md" || rc=1
      TOKENSPEED_KERNEL_OVERRIDE="moe_apply=hopper.moe_apply" python3 -m tokenspeed_kernel bench --host moe_apply \
        --quiet --json "$OUT/host/hopper.moe_apply.json" --md "$OUT/host/hopper.moe_apply.md" || rc=1
      cat "$OUT"/host/*.md | grep -v "^$" | tail -80 ;;
    host-before|host-after)
      # The decode step eager vs graph and the anchor's host table, with this checkout's packages (after)
      # or with the wheels in .anchors/before (built from an older commit; installed beside the carried ones).
      site=/tmp/site
      if [ "$stage" = host-before ]; then
        site=/tmp/site-before
        if [ ! -f $site/.installed ]; then
          python3 -m pip install -q --no-index --no-deps --no-compile --target $site "$repo/${WHL_DIR:-.whl}"/*.whl \
            "$repo"/.anchors/before/*.whl || exit 1
          touch $site/.installed
        fi
      fi
      dir="$OUT/$stage.$(date +%H%M%S)"  # a stage may run more than once (before/after alternated)
      mkdir -p "$dir"
      (cd "$dir" && PYTHONPATH=$site python3 "$repo/.anchors/host_cost.py") 2>&1 | tail -8 || rc=1
      PYTHONPATH=$site python3 "$repo/tools/host_probe.py" --out "$dir" --skip-ops ${PROBE_ARGS:-} 2>&1 \
        | tee "$dir/probe.log" | tail -6 || rc=1 ;;
    host-anchor) (cd "$OUT" && python3 "$repo/.anchors/host_cost.py") 2>&1 | tee "$OUT/host-anchor.log" | tail -12 || rc=1 ;;
    host-probe) python3 "$repo/tools/host_probe.py" --out "$OUT/probe" ${PROBE_ARGS:-} 2>&1 | tee "$OUT/host-probe.log" | tail -60 || rc=1 ;;
    tk-anchor) python3 "$repo/.anchors/tk_moe.py" --out "$OUT" ${ANCHOR_ARGS:-} 2>&1 | tail -12 || rc=1 ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
done
exit $rc
