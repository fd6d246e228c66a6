#!/bin/bash
# Session 28's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   float8 (e4m3, row-wise scales) against bf16 on libero-pi0's GEMM shapes: the prefix's (compute-bound)
#            and the expert step's (M = 51, weight-bound), cuBLAS through torch._scaled_mm against F.linear, with the
#            activations' quantization timed apart (benchmarks/fp8_gemm_probe.py)
#   PART=b   the headline of docs/performance.md at today's code, every run a fresh process: reference, graph and
#            best on libero-pi0 (model mode; graph and best in policy mode too), graph and best on libero-pi05,
#            libero-shallow6, libero-pi0-b4 and -b8
#   PART=c   seed 004's cumulative table on libero-pi0 at today's code (one process, interleaved)
#   PART=d   seed 000's grid on libero-pi0 at today's code (one process, interleaved)
#   PART=e   part d again under a 300 s limit, to see a matrix stopped by SIGTERM keep its rows (first calls,
#            equivalence) in its file (the grid's compile modes do not fit without a warm compile cache)
#   PART=f   (prepared, not run) seed 000's grid with a compile cache: a first pass fills it (cut by its limit, it
#            writes the rows it has), a second process runs the grid on the warm cache; one call of ~10 minutes
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session28.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 60 <<EOT &
240 python3 benchmarks/fp8_gemm_probe.py --json $R/fp8_gemm_probe.json
EOT
  ;;
b)
  lane A 0 12 <<EOT &
120 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s28_model.json
60 $V bench --workload libero-pi0 --levers graph $B --json $R/bench_libero-pi0_graph-s28_model.json
90 $V bench --workload libero-pi0 --levers reference --warmup 5 --iters 20 --no-progress --json $R/bench_libero-pi0_reference-s28_model.json
120 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s28_policy.json
60 $V bench --workload libero-pi0 --levers graph --mode policy $B --json $R/bench_libero-pi0_graph-s28_policy.json
120 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s28_model.json
60 $V bench --workload libero-pi05 --levers graph $B --json $R/bench_libero-pi05_graph-s28_model.json
120 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s28_model.json
60 $V bench --workload libero-shallow6 --levers graph $B --json $R/bench_libero-shallow6_graph-s28_model.json
120 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s28_model.json
60 $V bench --workload libero-pi0-b4 --levers graph $B --json $R/bench_libero-pi0-b4_graph-s28_model.json
150 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s28_model.json
90 $V bench --workload libero-pi0-b8 --levers graph $B --json $R/bench_libero-pi0-b8_graph-s28_model.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
300 $V matrix --workload libero-pi0 --variants cumulative --iters 30 --warmup 5 --no-progress --json $R/matrix_libero-pi0_cumulative_s28.json
EOT
  ;;
d)
  lane A 0 40 <<EOT &
360 $V matrix --workload libero-pi0 --variants grid --iters 20 --warmup 3 --no-progress --json $R/matrix_libero-pi0_grid_s28.json
EOT
  ;;
e)
  lane A 0 40 <<EOT &
300 $V matrix --workload libero-pi0 --variants grid --iters 20 --warmup 3 --no-progress --json $R/matrix_libero-pi0_grid_s28e.json
EOT
  ;;
f)
  lane A 0 40 <<EOT &
240 $V matrix --workload libero-pi0 --variants grid --iters 3 --warmup 2 --no-progress --compile-cache /tmp/grid_cache --json $R/matrix_libero-pi0_grid_s28f_fill.json
330 $V matrix --workload libero-pi0 --variants grid --iters 20 --warmup 3 --no-progress --compile-cache /tmp/grid_cache --json $R/matrix_libero-pi0_grid_s28f.json
EOT
  ;;
esac
finish
