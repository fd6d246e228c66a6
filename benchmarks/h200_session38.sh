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
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  I="--ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py"
  lane A 0 40 <<EOT &
170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s38${PART}1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s38${PART}2.log | grep -v "^\\.*\\["
240 $P -q -n 14 --timeout 220 --durations 5 $I 2>&1 | tee $R/pytest_gpu_s38${PART}3.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
