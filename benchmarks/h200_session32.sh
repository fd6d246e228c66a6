#!/bin/bash
# Session 32's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the whole test suite with the GPU visible, as a user with a GPU runs the README's test command:
#            websockets and openpi-client carried as wheels (.whl, not in the machine's image) so the server's
#            tests run too; 8 pytest-xdist workers, a 400 s limit a test; the full log in $R/pytest_gpu_s32.log
#            (the first run was cut at 560 s, at ~98%, before pytest's summary named its 9 failures)
#   PART=b   the same with 14 workers and -v, so each test's outcome is in the log as it ends (cut at 95%: 7 failed)
#   PART=c   part b's seven failures alone, with their tracebacks
#   PART=d   the fixes: tests/test_engine_cuda.py (the GPU variants in bf16) and tests/test_kernels.py
# Usage (device tool, carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session32.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-a}" in
a)
  lane A 0 70 <<EOT &
560 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 400 -rfEs --durations 30 2>&1 | tee $R/pytest_gpu_s32.log
EOT
  ;;
b)
  lane A 0 70 <<EOT &
470 python3 -m pytest -p no:cacheprovider -n 14 -v --timeout 300 -rfE --tb=short 2>&1 | tee $R/pytest_gpu_s32b.log | grep -E "FAILED|ERROR|passed|failed"
EOT
  ;;
c)
  lane A 0 400 <<EOT &
200 python3 -m pytest -q -p no:cacheprovider -n 7 --timeout 150 -rfE --tb=short tests/test_kernels.py -k "pdl_only or small_m_matmul_matches or rope_qkv_kernel_matches or suffix_attention_matches_eager or lever_matches_reference_in_the or without_copies_of_the_whole" tests/test_report_render.py::test_html_from_h200_results 2>&1 | tee $R/pytest_gpu_s32c.log
EOT
  ;;
d)
  lane A 0 60 <<EOT &
240 python3 -m pytest -q -p no:cacheprovider -n 4 --timeout 200 -rfEs --tb=short tests/test_engine_cuda.py tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s32d.log
EOT
  ;;
esac
finish
