#!/bin/bash
# Session 46's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=e   (carry .whl_lerobot) session 45's part e with --rtc: vlaperf compare --accelerate --rtc for libero-pi0
#            and libero-pi05 (bfloat16, full size, random weights, LeRobot's compile left out). The plain rows'
#            predictions are session 45's (benchmarks/h200_session45.sh). New, the RTC rows: LeRobot's guided
#            predict 5-20% slower than its unguided one (RTC's wrapper runs autograd.grad once a step, through
#            x1 = x_t - t v alone: ten small backward graphs, ~1-3 ms each launched from Python against a ~260 ms
#            call); vlaperf's guided call within 0.3 ms of its unguided one (five elementwise kernels a step inside
#            the graph, ~3 us each, plus the leftover's copy into the graph's input); its rel L2 from LeRobot's
#            guided call within 20% of the unguided row's; guidance_moves 0.1-1 (LeRobot's default weight 10 on
#            a 25-action leftover of the same chunk).
#   PART=g   (carry .whl_lerobot) the GPU tests of real-time chunking in the engine (new this session):
#            tests/test_guidance.py's CUDA-graph test (`graph` and `best`: the guidance tensors are graph inputs, one
#            capture, each call's values replayed) and tests/test_compare_accelerate.py's gpu tests (full-size
#            libero-pi0 in bfloat16 through LeRobot 0.6.1 with `best`, plain and with LeRobot's RTC on).
#            Predictions: all pass; the guided `best` within 3e-2 of LeRobot's guided call (the guidance is
#            elementwise float32 after the step's head, so its error is the unguided call's, ~6e-3 to 1e-2), one
#            capture for both leftovers.
#   PART=a, b, c, d: session 45's (session 44's) parts, its file names.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=g bash benchmarks/h200_session46.sh, carry [".whl", ".whl_lerobot"]
set -u
case "${PART:-e}" in
a | b | c | d) exec bash benchmarks/h200_session45.sh ;;
esac
source benchmarks/lanes.sh  # $R, lane, finish, $V
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
install_wheels .whl_lerobot /tmp/lrsite
case "$PART" in
e)
  lane A 0 40 <<EOT &
290 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi0 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated.json
290 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi05 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi05_lerobot_accelerated.json
EOT
  ;;
g)
  lane A 0 40 <<EOT &
420 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 6 -m gpu tests/test_guidance.py tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s46g_guidance.log | tail -30
EOT
  ;;
esac
finish
