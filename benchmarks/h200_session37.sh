#!/bin/bash
# Session 37's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   the step attention's key splits at a batch (the layers' path: libero-pi0-b4 / -b8), 1-8 splits on the
#            default tiles with the mask the engine passes (suffix_attention_bench.py --splits-only); where another
#            count is >2% faster than today's pick (suffix_attention.default_splits), that count in the whole `best`
#            call against today's rule, in one process (change_ab.py --change step_splits)
#   PART=b   `vlaperf bench` of `best` on the presets whose newest file predates versions 114-115 (libero-pi05,
#            libero-shallow6, droid-pi0, droid-pi05, aloha-pi05), so the README's table is of one code
#   PART=c   the whole test suite on the GPU machine at the session's last code, in three steps (the kernels and the
#            CUDA engine; the world-action model, engine and UniPC; the rest), with websockets and openpi-client
#            carried as wheels (carry [".whl"]: the serve tests need them)
#   PART=d   part c again at the session's last code (its logs named s37d)
# Usage (device tool, no carry; parts c and d: carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session37.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
120 cd benchmarks && python3 suffix_attention_bench.py --batch 4 --splits-only --json $R/kernel_suffix_attention_b4_s37.json
120 cd benchmarks && python3 suffix_attention_bench.py --batch 8 --splits-only --json $R/kernel_suffix_attention_b8_s37.json
150 cd benchmarks && n=\$(python3 pick_splits.py $R/kernel_suffix_attention_b4_s37.json 0.98) && python3 change_ab.py --change step_splits --step-splits \$n --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_step_splits_s37.json
180 cd benchmarks && n=\$(python3 pick_splits.py $R/kernel_suffix_attention_b8_s37.json 0.98) && python3 change_ab.py --change step_splits --step-splits \$n --workload libero-pi0-b8 --rounds 30 --json $R/change_ab_libero-pi0-b8_step_splits_s37.json
EOT
  ;;
b)
  lane A 0 40 <<EOT &
110 $V bench --workload aloha-pi05 --levers best $B --json $R/bench_aloha-pi05_best-s37_model.json
110 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s37_model.json
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s37_model.json
110 $V bench --workload droid-pi0 --levers best $B --json $R/bench_droid-pi0_best-s37_model.json
110 $V bench --workload droid-pi05 --levers best $B --json $R/bench_droid-pi05_best-s37_model.json
EOT
  ;;
c|d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  I="--ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py"
  lane A 0 40 <<EOT &
170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s37${PART}1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s37${PART}2.log | grep -v "^\\.*\\["
240 $P -q -n 14 --timeout 220 --durations 5 $I 2>&1 | tee $R/pytest_gpu_s37${PART}3.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
