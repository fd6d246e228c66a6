#!/bin/bash
# Session 34's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): the whole test suite with the GPU
# visible, in two calls by module, under tests/conftest.py's per-worker thread share (session 33's item 2).
#   PART=a   the GPU-heavy modules: test_kernels + test_engine_cuda (4 workers), then test_wam + test_engine +
#            test_unipc (12 workers)
#   PART=c   part a's one failure again, after its mend: test_engine.py under 12 workers
#   PART=d   the whole suite again after the session's new tests (parts a and b in one call)
#   PART=b   every other module (14 workers), the report tests among them (they timed out under 14 workers at
#            torch's default thread count in session 33)
# Each failure's traceback is printed as it happens (benchmarks/pytest_report_now.py), and
# tests/test_suite_setup.py checks the thread share inside every xdist run.
# Usage (device tool, carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session34.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD
P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
250 $P -q -n 4 --timeout 200 --durations 5 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s34a1.log | grep -v "^\\.*\\["
320 $P -q -n 12 --timeout 280 --durations 8 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s34a2.log | grep -v "^\\.*\\["
EOT
  ;;
b)
  lane A 0 60 <<EOT &
560 $P -q -n 14 --timeout 300 --durations 15 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py 2>&1 | tee $R/pytest_gpu_s34b.log | grep -v "^\\.*\\["
EOT
  ;;
c)
  lane A 0 40 <<EOT &
200 $P -q -n 12 --timeout 200 tests/test_engine.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s34c.log | grep -v "^\\.*\\["
EOT
  ;;
d)
  lane A 0 40 <<EOT &
150 $P -q -n 4 --timeout 140 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s34d1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s34d2.log | grep -v "^\\.*\\["
280 $P -q -n 14 --timeout 250 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py 2>&1 | tee $R/pytest_gpu_s34d3.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
