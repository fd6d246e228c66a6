#!/bin/bash
# Session 44's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only). Session 44 itself was lent no machine:
# this is the plan for the next session that is, written and tested on the CPU (tiny) where it could be.
#   PART=a   (1) benchmarks/graph_context_probe.py: why the cumulative matrix's graph row reads 29.0 ms against
#            32.1-32.8 ms everywhere else (perf-notes, "Next, after session 43", item 2). Predictions: g1 (captured
#            first) 32.1-32.8 ms in phase A, as bench reads. Then one of: g2 (captured after the eager rows) ~29 ms
#            and g1 still ~32.5 in phase C: the capture chose other kernels after the eager calls, and the kernel
#            diff names them; or g1 ~29 in C as well: the same kernels ran faster, the GPU's state; or both ~32.5 in
#            C and ~29 in E: the compiled rows' build changed something, and the switches say whether it was a
#            process-wide setting. My guess, weakly held: the second (a capture after the eager rows), since
#            cuBLAS's heuristics and cuDNN's SDPA plans are the only state the eager rows leave.
#            (2) bench --mode policy --levers best --processes 4 (item 3): the served figure with its process
#            spread. Prediction: medians within 13.4-14.3 ms, spread 2-8%, the first process's first call the
#            cold one (9-20 s), the others 3.5-5 s.
#   PART=d   breakdown --mode policy --levers best --processes 4: session 43's host stages with their spread in one
#            run. Prediction: the host stage sum 1.1-1.8 ms with a spread of 20-50% per host stage, the GPU stages'
#            spread under 1%.
#   PART=b   gpu_suite s44: the whole suite on the GPU (session 43's part b, never run). Prediction: all pass.
#   PART=c   (carry .whl_lerobot) tests/test_compare_lerobot.py in full with the real LeRobot 0.6.1, 420 s.
#            Prediction: all pass, the bfloat16 checkpoint case and the full-size gpu tests among them.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session44.sh, carry [".whl"]
# TAG (default s44) names the result files, so a later session's plan can run these parts as its own.
set -u
T=${TAG:-s44}
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, gpu_suite
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
300 python3 benchmarks/graph_context_probe.py --workload libero-pi0 --json $R/graph_context_probe_libero-pi0-$T.json
280 $V bench --workload libero-pi0 --mode policy --levers best --processes 4 $B --json $R/bench_libero-pi0_best-$T-4proc_policy.json
EOT
  ;;
d)
  lane A 0 60 <<EOT &
400 $V breakdown --workload libero-pi0 --levers best --mode policy --iters 50 --no-progress --processes 4 --json $R/breakdown_libero-pi0_best_policy-$T-4proc.json
EOT
  ;;
b)
  gpu_suite $T &
  ;;
c)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
480 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 8 tests/test_compare_lerobot.py 2>&1 | tee $R/pytest_gpu_${T}c_lerobot.log | tail -30
EOT
  ;;
esac
finish
