#!/bin/bash
# Session 61's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
# Session 60's part h step 2, which did not run (its call got an H100), on whichever card comes:
#   PART=a   1) libero-pi0 `best` in policy mode (the served call in-process: transform, pinned upload, device
#               preprocess, the graph, the copy back), four fresh processes.
#               Prediction on an H200: 14.0-14.4 ms, as session 48's 14.05-14.34 at the same kernels and host stages
#               (its model-mode headline then 12.86 ms, session 60's 12.72).
#               Prediction on an H100: 14.5-15.1 ms, its model-mode headline (13.36 ms, session 57) plus the
#               ~1.1-1.7 ms of host stages the policy breakdowns measured (session 48: 1.47-1.72 ms on the H200's host).
#            2) on the same card, model mode in four fresh processes beside it, so the two modes' gap comes from one
#               machine. Prediction: 12.7-13.0 ms on an H200, 13.2-13.6 on an H100; policy mode 1.1-1.7 ms above it.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session61.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "${PART:-a}" in
a)
  {
    echo "240 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s61-4proc_policy.json"
    echo "200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s61-4proc_model.json"
  } | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
