#!/bin/bash
# Session 17's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): the world-action model (wam-761).
#   PART=a   the GPU tests of the world-action model and UniPC; `vlaperf check` of exact / graph / best on wam-761 at every
#            sparsity mode; benches of the reference and of best (model mode), best with drop_middle
#   PART=b   seed 000's questions, each table interleaved in one process: the grid {reference, exact, + compile default,
#            + compile reduce-overhead, graph, best} x {none, drop_middle, mae_middle} on the policy call; the cumulative
#            table (which of the runner's overheads costs what); one forward at batch 1 and 8 x the three sparsity modes.
#            As run in session 17 (the device time was nearly spent): the forwards first (at c06fce5), then the grid and
#            the cumulative table (at d5cd353, after the reduce-overhead fix), with these round counts; batch 4 not run
#   PART=next (prepared for the next session, not run: its code was built after the device time was spent) the kernel
#            table of best's call (what its 3.1x over the floor is) at none and drop_middle; batch 4 and guidance; the
#            breakdown (exact) and T(N) of reference / best; the served model under loadgen (graph); one forward at batch 8
#            again with the kernel table's view (the compiled forward that did not shorten with drop_middle)
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
next)
  lane A 0 40 <<EOT &
120 python3 benchmarks/profile_kernels.py $W --levers best --rows 30 --sequence $R/kernel_sequence_wam-761_best.txt > $R/kernels_wam-761_best.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_best.txt
120 python3 benchmarks/profile_kernels.py $W --levers best --sparsity drop_middle --rows 30 > $R/kernels_wam-761_best_drop.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_best_drop.txt
100 $V bench $W --levers best --batch 4 --compile-cache /tmp/fcW $B --json $R/bench_wam-761-b4_best_model.json
100 $V bench $W --levers best --cfg-scale 3 --compile-cache /tmp/fcW $B --json $R/bench_wam-761_best_cfg_model.json
120 $V breakdown $W --levers exact --sparsity drop_middle --iters 20 --warmup 3 --no-progress --json $R/breakdown_wam-761_exact_drop.json
200 $V scaling $W --levers "reference;best" --steps 2,5,10,20 --iters 8 --warmup 2 --no-progress --compile-cache /tmp/fcW --json $R/scaling_wam-761.json
180 bash -c 'setsid $V serve $W --levers graph --port 8765 --warmup-batches 1,4 > $R/serve_wam-761.log 2>&1 & for i in \$(seq 120); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 120 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4 --requests 20 --warmup 2 --json $R/loadgen_wam-761_graph.json; pkill -TERM -f "vlaperf.cli serve"'
EOT
  ;;
esac
finish
