#!/bin/bash
# Session 57's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=a   on an H200 only, the headline first: libero-pi0 `best` in model mode in four fresh processes
#            (session 52's part h). Session 48 (H200, d16c947): medians 12.77-12.93 ms, the file 12.86 ms.
#            Prediction: 12.7-13.0 ms, spread under 2%: nothing on the model's path changed since session 48
#            (the commits since touch serving, the rollout, the matrix's idle options and timing's records).
#            Then, on either card, the broad part of the GPU suite (lanes.sh gpu_suite's steps 3 and 4: every test
#            file but the kernel/engine/world-action ones, then the quiet_gpu tests alone on the GPU). It last ran in
#            session 48 (bdb51fb, all passed); since then sessions 49-56 added the keep-warm server, the cadence
#            forecast, the rollout's overrun records and matrix --idle-ms, each tested on the CPU machine only.
#            Prediction: all pass; the serve tests' timing-based ones (keep-warm's quiet window) hold on the GPU
#            host, whose calls are real CUDA calls of ~0.1-1 ms on tiny.
#   PART=b   gpu_suite's steps 1 and 2 (the kernels and the CUDA engine; the world-action model, the engine and
#            UniPC). Engine, kernels and models are unchanged since session 48 but for the matrix's idle options
#            (eff2a50). Prediction: all pass, skips as session 48's (11 in step 1).
#   Written after part a on an H100 (e7fc8f5): steps 3 and 4 passed but for two keep-warm timing tests in
#   test_serve.py (the control of the steady-client test: 3 of 8 requests waited, >= 5 asserted; the late-loop
#   test told of the replies: 4 of 24 waited, <= 1 asserted), each beside 13 other test processes on 16 cores. They
#   assert when the server's threads wake, so they are marked quiet_host and run alone in step 4 from now on.
#   PART=c   step 4 (quiet_gpu and quiet_host), three times over. Prediction: all pass each time (on the CPU
#            machine, alone, these tests passed in every CI run since they were written).
#   Written after the audits' changes (the batcher's turns, the frozen heap, idle timeouts, keep-warm's 20 ms limit,
#   the CLI's fixes; each tested on the CPU machine): part a again at the session's last code, steps 3 and 4 on
#   either card and the headline on an H200. Predictions: all pass, none failing in step 3 now that the quiet_host
#   tests run in step 4; the headline as above (12.7-13.0 ms; the model's path is untouched).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session57.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
I="--ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "${PART:-a}" in
a)
  {
    if echo "$GPU_NAME" | grep -q H200; then
      echo "200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s57-4proc_model.json"
    fi
    echo "250 $P -q -n 14 --timeout 220 --durations 5 -m \"not quiet_gpu and not quiet_host\" $I 2>&1 | tee $R/pytest_gpu_s57a3.log | grep -v \"^\\\\.*\\\\[\""
    echo "90 $P -q --timeout 80 -m \"quiet_gpu or quiet_host\" $I 2>&1 | tee $R/pytest_gpu_s57a4.log | tail -5"
  } | lane A 0 40 &
  ;;
b)
  lane A 0 40 <<EOT &
170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s57b1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s57b2.log | grep -v "^\\.*\\["
EOT
  ;;
c)
  lane A 0 40 <<EOT &
200 for i in 1 2 3; do $P -q --timeout 80 -m "quiet_gpu or quiet_host" $I > $R/pytest_gpu_s57c\$i.log 2>&1; tail -n 4 $R/pytest_gpu_s57c\$i.log; done
EOT
  ;;
esac
finish
