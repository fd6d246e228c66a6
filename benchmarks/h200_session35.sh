#!/bin/bash
# Session 35's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   `vlaperf report` of benchmarks/results/h200 with its figures drawn in this process (--jobs 1) and
#            in worker processes (the default: the cores, at most 8), then the GPU-heavy test modules
#   PART=b   every other test module (14 workers), the report tests among them
# Each failure's traceback is printed as it happens (benchmarks/pytest_report_now.py).
# Usage (device tool, carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session35.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD
P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
# the wall time of a command: walltime CMD...
walltime() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "wall $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s, rc $rc"; }
export -f walltime
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
120 walltime $V report benchmarks/results/h200 -o /tmp/rep1/h200.md --jobs 1 2>&1 | tail -2 | tee $R/report_jobs1_s35.log
120 walltime $V report benchmarks/results/h200 -o /tmp/rep8/h200.md 2>&1 | tail -2 | tee $R/report_jobs8_s35.log
20 diff <(grep -v '^_generated ' /tmp/rep1/h200.md) <(grep -v '^_generated ' /tmp/rep8/h200.md) && diff -r -q /tmp/rep1/h200_files /tmp/rep8/h200_files && echo "reports identical" | tee -a $R/report_jobs8_s35.log
150 $P -q -n 4 --timeout 140 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s35a1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s35a2.log | grep -v "^\\.*\\["
EOT
  ;;
b)
  lane A 0 40 <<EOT &
400 $P -q -n 14 --timeout 250 --durations 10 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py 2>&1 | tee $R/pytest_gpu_s35b.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
