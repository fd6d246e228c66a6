#!/bin/bash
# Session 45's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only). Session 45 was lent no machine either:
# parts a-d are session 44's plan unchanged (its predictions in benchmarks/h200_session44.sh); part e is new.
#   PART=a, b, d: run by h200_session44.sh with TAG=s45 (its files named s45): graph_context_probe and bench
#            --processes 4 (a), the whole suite on the GPU (b), breakdown --processes 4 (d).
#   PART=c   (carry .whl_lerobot) tests/test_compare_lerobot.py (480 s) and tests/test_compare_accelerate.py (400 s) in
#            full with the real LeRobot 0.6.1. Prediction: all pass, accelerate_lerobot's slow tests and its full-size
#            `best` GPU test among them (its first call 20-40 s: compile, capture and LeRobot's eager check); the
#            lerobot-eval and openpi tests skip (no dataset extra, gym-pusht or openpi there).
#   PART=e   (carry .whl_lerobot) vlaperf compare --accelerate for libero-pi0 and libero-pi05 (bfloat16, full size,
#            random weights, LeRobot's compile left out: 338 s here): LeRobot's own predict_action_chunk as shipped
#            and with accelerate_lerobot installed, interleaved with the core-level rows. Predictions: lerobot_predict
#            within 1-3% of lerobot (its pre-processing of 224 x 224 frames is a few elementwise kernels against a
#            ~260 ms call); vlaperf_in_lerobot_predict 0.2-1.5 ms above vlaperf_best (the masks' one read, the stack
#            of the camera list, LeRobot's [0, 1] -> [-1, 1] mapping launched from Python), so ~17-19x over
#            lerobot_predict for pi0 at today's best (12.9-14 ms) and ~20-24x for pi0.5; its check rel L2 within
#            10% of the core-level `best` row's (the same engine on the same inputs: 9.7e-3 pi0, 4.1e-3 pi0.5 in the
#            last files); vs_lerobot_core 0 or ~1e-7 (the frames' round trip).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session45.sh, carry [".whl"] (c, e:
# [".whl", ".whl_lerobot"])
set -u
case "${PART:-a}" in
a | b | d) TAG=s45 exec bash benchmarks/h200_session44.sh ;;  # session 44's parts, its result files named s45
esac
source benchmarks/lanes.sh  # $R, lane, finish, $V
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
install_wheels .whl_lerobot /tmp/lrsite
case "$PART" in
c)
  lane A 0 40 <<EOT &
480 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 8 tests/test_compare_lerobot.py 2>&1 | tee $R/pytest_gpu_s45c_lerobot.log | tail -30
400 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 8 tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s45c_accelerate.log | tail -30
EOT
  ;;
e)
  lane A 0 40 <<EOT &
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi0 --accelerate --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated.json
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi05 --accelerate --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi05_lerobot_accelerated.json
EOT
  ;;
esac
finish
