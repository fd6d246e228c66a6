#!/usr/bin/env bash
# One device call: equivalence on the full-size model, reference baselines (model and
# policy mode), the best variant, and the cumulative matrix, all on libero-pi0.
# Results are tarred into $OUT/results.tgz (the device returns at most 8 files).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,utilization.gpu,memory.used --format=csv
run() { echo "== $*"; timeout ${STEP_TIMEOUT:-300} "$@" 2>&1 | tail -40; }
run $V check --workload libero-pi0 --levers all --seeds 1 --no-progress --json "$R/check_libero-pi0.json"
run $V bench --workload libero-pi0 --mode model --no-progress --json "$R/bench_libero-pi0_reference_model.json"
run $V bench --workload libero-pi0 --mode policy --no-progress --json "$R/bench_libero-pi0_reference_policy.json"
run $V bench --workload libero-pi0 --mode model --levers best --no-progress --json "$R/bench_libero-pi0_best_model.json"
run $V bench --workload libero-pi0 --mode policy --levers best --no-progress --json "$R/bench_libero-pi0_best_policy.json"
run $V matrix --workload libero-pi0 --variants cumulative --no-progress --json "$R/matrix_libero-pi0_cumulative.json"
if [ "${WITH_GRID:-0}" = 1 ]; then
  run $V matrix --workload libero-pi0 --variants grid --no-progress --json "$R/matrix_libero-pi0_grid.json"
fi
tar czf "$OUT/results.tgz" -C "$OUT" results
