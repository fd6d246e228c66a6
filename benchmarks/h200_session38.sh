#!/bin/bash
# Session 38's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=b   `vlaperf bench` of libero-pi0 `best` in a fresh process at the session's code (the README's newest
#            figure is session 36's; nothing since touches its call: the figure checks that, within the ~2% that
#            two instances differ by)
#   PART=c   the whole test suite on the GPU machine at the session's last code, in three steps (the kernels and the
#            CUDA engine; the world-action model, engine and UniPC; the rest), with websockets and openpi-client
#            carried as wheels (carry [".whl"]: the serve tests need them)
#   PART=d   part c again (its logs named s38d)
# Usage (device tool, no carry; parts c and d: carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=b bash benchmarks/h200_session38.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-b}" in
b)
  lane A 0 40 <<EOT &
110 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s38_model.json
EOT
  ;;
c|d)
  gpu_suite s38${PART} &
  ;;
esac
finish
