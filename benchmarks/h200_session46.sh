#!/bin/bash
# Session 46's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=e   (carry .whl_lerobot) session 45's part e unchanged: vlaperf compare --accelerate for libero-pi0 and
#            libero-pi05 (its predictions in benchmarks/h200_session45.sh).
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
a | b | c | d | e) exec bash benchmarks/h200_session45.sh ;;
esac
source benchmarks/lanes.sh  # $R, lane, finish, $V
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lrsite .whl_lerobot/*.whl
case "$PART" in
g)
  lane A 0 40 <<EOT &
420 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 6 -m gpu tests/test_guidance.py tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s46g_guidance.log | tail -30
EOT
  ;;
esac
finish
