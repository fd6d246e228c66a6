#!/bin/bash
# Session 33's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   what session 32 could not run: tests/test_engine_cuda.py (the GPU variants in bfloat16, one capture per
#            prompt bucket, a moved model and a left-padded prompt refused on the GPU) and tests/test_kernels.py (the
#            Triton-3.9 skips); then `check` and `bench` of libero-pi0 `best` at today's code
#   PART=b   the rest of the suite with the GPU visible (14 workers, -v, a 300 s limit a test), with the report tests
#            that failed under this load in session 32, so that pytest's summary names why
#   PART=c   the report tests alone, with their durations
#   PART=d   part b's two failures (the HTML report, inductor's run-time compile cache), whose tracebacks part b's cut
#            summary lost: the cache test alone, then both among the heavy files under 14 workers, each failure's
#            traceback printed as it happens (benchmarks/pytest_report_now.py)
# Usage (device tool, carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session33.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-a}" in
a)
  lane A 0 60 <<EOT &
240 python3 -m pytest -q -p no:cacheprovider -n 4 --timeout 200 -rfEs --tb=short tests/test_engine_cuda.py tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s33a.log
140 $V check --workload libero-pi0 --levers best --no-progress --json $R/check_libero-pi0_best_s33.json
150 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s33_model.json
EOT
  ;;
b)
  lane A 0 70 <<EOT &
540 python3 -m pytest -p no:cacheprovider -n 14 -v --timeout 300 -rfE --tb=short --durations 15 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py 2>&1 | tee $R/pytest_gpu_s33b.log | grep -E "FAILED|ERROR|passed|failed|[0-9]s (call|setup)"
EOT
  ;;
c)
  lane A 0 40 <<EOT &
200 python3 -m pytest -q -p no:cacheprovider -n 2 --timeout 180 -rfE --tb=short --durations 6 tests/test_report_render.py 2>&1 | tee $R/pytest_gpu_s33c.log
EOT
  ;;
d)
  lane A 0 400 <<EOT &
100 python3 -m pytest -q -p no:cacheprovider --timeout 90 -rfE --tb=short --durations 3 tests/test_cli.py -k compile_cache_set_at_run_time 2>&1 | tail -12
380 PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -q -p no:cacheprovider -p pytest_report_now -n 14 --timeout 300 tests/test_report_render.py tests/test_cli.py tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_serve.py 2>&1 | tee $R/pytest_gpu_s33d.log | grep -v "^\\.*\\[" | tail -300
EOT
  ;;
esac
finish
