#!/bin/bash
# Session 60's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
# Session 59's part f, which never ran (no machine came in five tries this session by 20:15), with one step added:
#   PART=f   1) ws_echo_probe.py on the GPU machine's host: a bare websockets echo (asyncio both ends, a 300 KB
#               request, one long-lived worker thread) whose reply comes after a 15 ms wait, as a policy call's, and
#               with no wait; three rounds, the two interleaved. On the CPU machine (session 60, 2 cores) the echo
#               spent 2.05-2.50 ms outside its 15 ms wait and 1.08-1.40 ms with none, while the served tiny call's
#               overhead + queue was 1.66-1.95 ms in loadgen runs interleaved with it: the host's own stack, not
#               vlaperf's code, sets the time outside the policy there. Prediction here: the echo's time outside the
#               15 ms wait within 0.3 ms of 2)'s overhead + queue (or above it, as on the CPU machine), at whatever
#               level this host gives (session 51's H100 host: 0.57 ms of overhead; session 59's: 1.59).
#            2) one robot on `serve --max-batch 1` against `--max-batch 8`, A B A B, as session 59's part f planned
#               (each server warmed up at batch 1 only, one compile cache; loadgen --clients 1 --requests 200
#               --warmup 10). Prediction (session 59's): the two settings' round trips within 0.3 ms of each other.
#            3) the test modules the last sessions changed (cli, serve, normalize, checkpoints, hub) on the GPU
#               machine. Prediction: all pass; test_hub's tests that need huggingface_hub skip (none there).
#            4) on an H200 only, the headline: libero-pi0 `best` in four processes (prediction 12.7-13.0 ms, as
#               session 48's 12.86). Last, so that a call cut by its limit loses this one first.
#   PART=g   1) to 3) only (a budget of ~450 s).
#   Session 60, after part f ran on an H200 (20:17-20:23, at a169692; all five steps; test_hub's two failures fixed
#   in d839a6e: huggingface_hub 1.33 there asks the Hub for a pinned commit's file list offline, and a test lacked
#   --workload tiny):
#   PART=h   1) tests/test_hub.py and tests/test_checkpoints.py on the GPU machine. Prediction: all pass (the Hub
#               tests now read the cache with local_files_only where the Hub is offline; reproduced and passing on
#               the CPU machine under huggingface_hub 1.33.0).
#            2) on an H200 only, libero-pi0 `best` in policy mode (the served call in-process), four processes.
#               Prediction: 14.0-14.4 ms, as session 48's 14.05-14.34 at the same kernels and host stages.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=f bash benchmarks/h200_session60.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P, serve_loadgen
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "${PART:-f}" in
f|g)
  {
    echo "90 python3 benchmarks/ws_echo_probe.py --work-ms 0,15 --rounds 3 --calls 300 --json $R/ws_echo_probe_s60.json"
    echo "120 serve_loadgen s60-maxbatch1a 1"
    echo "60 serve_loadgen s60-maxbatch8a 8"
    echo "60 serve_loadgen s60-maxbatch1b 1"
    echo "60 serve_loadgen s60-maxbatch8b 8"
    echo "150 $P -q -n 14 --timeout 140 -m \"not quiet_gpu and not quiet_host\" tests/test_cli.py tests/test_serve.py tests/test_normalize.py tests/test_checkpoints.py tests/test_hub.py 2>&1 | tee $R/pytest_gpu_s60f3.log | tail -5"
    if [ "${PART:-f}" = f ] && echo "$GPU_NAME" | grep -q H200; then
      echo "200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s60-4proc_model.json"
    fi
  } | lane A 0 60 &
  ;;
h)
  {
    echo "120 $P -q -n 8 --timeout 110 tests/test_hub.py tests/test_checkpoints.py 2>&1 | tee $R/pytest_gpu_s60h1.log | tail -5"
    if echo "$GPU_NAME" | grep -q H200; then
      echo "240 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s60-4proc_policy.json"
    fi
  } | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
