#!/bin/bash
# Session 29's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   seed 000's grid on libero-pi0 at today's code with a compile cache: a first pass fills it (cut at 250 s
#            if it has not finished, which is also the GPU check of a matrix stopped by SIGTERM: its file keeps the
#            prepared rows with `interrupted: true`, and the lane log's next step starts at once), then a second
#            process runs the grid on the warm cache
#   PART=b   the checks session 28 could not run on the GPU: a matrix SIGTERMed 45 s in, during its first compile
#            (the step's end time in the lane log shows whether it left at once); `vlaperf bench --ceilings measure`
#            on libero-pi0 best (this H200's own rates against perf-facts' 780 TFLOP/s and 4.23 TB/s); the mended
#            float8 GEMM probe (kernel_timing's capture and replay)
#   PART=c   wam-761 at today's code, each a fresh process: best, graph and reference (the last on record were
#            session 18's, and no graph file)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session29.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
250 $V matrix --workload libero-pi0 --variants grid --iters 3 --warmup 2 --no-progress --compile-cache /tmp/grid_cache --json $R/matrix_libero-pi0_grid_s29_fill.json; echo "exit \$? at \$(date +%T)"
300 $V matrix --workload libero-pi0 --variants grid --iters 20 --warmup 3 --no-progress --compile-cache /tmp/grid_cache --json $R/matrix_libero-pi0_grid_s29.json; echo "exit \$? at \$(date +%T)"
EOT
  ;;
b)
  lane A 0 40 <<EOT &
45 $V matrix --workload libero-pi0 --variants cumulative --iters 5 --warmup 2 --no-progress --json $R/matrix_libero-pi0_sigterm_s29.json; echo "exit \$? at \$(date +%T)"
150 $V bench --workload libero-pi0 --levers best --ceilings measure $B --json $R/bench_libero-pi0_best-s29-ceilings_model.json
120 python3 benchmarks/fp8_gemm_probe.py --json $R/fp8_gemm_probe_s29.json
EOT
  ;;
c)
  lane A 0 14 <<EOT &
120 $V bench --workload wam-761 --levers best $B --json $R/bench_wam-761_best-s29_model.json
90 $V bench --workload wam-761 --levers graph $B --json $R/bench_wam-761_graph-s29_model.json
90 $V bench --workload wam-761 --levers reference --warmup 3 --iters 15 --no-progress --json $R/bench_wam-761_reference-s29_model.json
EOT
  ;;
esac
finish
