#!/bin/bash
# Session 17's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): the world-action model (wam-761).
#   PART=a   the GPU tests of the world-action model and UniPC; `vlaperf check` of exact / graph / best on wam-761 at every
#            sparsity mode; benches of the reference and of best (model mode), best with drop_middle
#   PART=b   seed 000's questions, each table interleaved in one process: the grid {reference, exact, + compile default,
#            + compile reduce-overhead, graph, best} x {none, drop_middle, mae_middle} on the policy call; the cumulative
#            table (which of the runner's overheads costs what); one forward at batch 1 and 8 x the three sparsity modes.
#            As run in session 17 (the device time was nearly spent): the forwards first (at c06fce5), then the grid and
#            the cumulative table (at d5cd353, after the reduce-overhead fix), with these round counts; batch 4 not run
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session17.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
W="--workload wam-761"
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
150 python3 -m pytest -q -p no:cacheprovider tests/test_wam.py tests/test_unipc.py -k "gpu or cuda or sync" 2>&1 | tail -5
200 $V check $W --levers "exact;graph;best" --seeds 1 --compile-cache /tmp/fcW --json $R/check_wam-761_s17.json
60 $V bench $W --levers reference --no-progress --iters 20 --warmup 3 --json $R/bench_wam-761_reference_model.json
100 $V bench $W --levers best --compile-cache /tmp/fcW $B --json $R/bench_wam-761_best_model.json
100 $V bench $W --levers best --sparsity drop_middle --compile-cache /tmp/fcW $B --json $R/bench_wam-761_best_drop_model.json
EOT
  ;;
b)
  lane A 0 40 <<EOT &
250 $V matrix $W --variants grid --warmup 3 --iters 12 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_grid.json
150 $V matrix $W --variants cumulative --sparsity drop_middle --warmup 3 --iters 12 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_cumulative_drop.json
70 $V matrix $W --mode forward --variants "reference;best" --warmup 3 --iters 15 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_forward_b1.json
70 $V matrix $W --mode forward --batch 8 --variants "reference;best" --warmup 3 --iters 15 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_forward_b8.json
EOT
  ;;
esac
finish
