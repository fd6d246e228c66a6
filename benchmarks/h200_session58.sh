#!/bin/bash
# Session 58's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=a   on an H200 only, the headline first: libero-pi0 `best` in model mode in four fresh processes (as
#            session 57's part a). Session 48 (H200, d16c947): medians 12.77-12.93 ms, the file 12.86 ms.
#            Prediction: 12.7-13.0 ms, spread under 2%: nothing on the model's path changed since session 48.
#            Then, on either card, the whole GPU suite (lanes.sh gpu_suite, steps 1-4). Session 57 ran it on an H100
#            at e7fc8f5: steps 1, 2 and 4 passed, step 3 had two keep-warm timing failures beside 13 other test
#            processes, since marked quiet_host and moved to step 4 (which then passed three times). Session 57's
#            audits then changed serving (the batcher's turns, the frozen heap, idle timeouts, keep-warm's 20 ms
#            limit) and the CLI, tested on the CPU machine only. Prediction: every step passes; skips as session 57's
#            (11 in step 1, the Triton >= 3.9 CPU checks; ray's in steps 3-4).
#   PART=d   on either card: the served model batching several robots, the GPU check of session 57's serving changes.
#            `serve --workload libero-pi0 --levers best --max-batch 8 --warmup-batches 1,4,8`, then
#            `loadgen --clients 1,4,8 --requests 40 --warmup 3` (closed-loop clients, one request in flight each, so
#            the batcher's turns change nothing here: each connection has at most one job queued).
#            Predictions (the bench files' batch figures, model mode, plus ~1-3 ms of the policy's and the socket's
#            work per call):
#              1 client:  batch 1.0; round trip 14.5-16 ms (session 51's H100 loadgen at --max-batch 1: 14.67 ms;
#                         the batcher stops waiting at once when every open connection has a job in the batch).
#              4 clients: batch mean >= 3.8; H200: round trip 30-36 ms, 110-130 chunks/s (bench libero-pi0-b4, s36:
#                         28.31 ms); H100: 32-42 ms, 95-125 chunks/s (no H100 batch-4 file; its bandwidth is 0.7x).
#              8 clients: batch mean >= 7.5; H200: round trip 52-60 ms, 135-155 chunks/s (bench libero-pi0-b8, s36:
#                         50.20 ms); H100: 56-72 ms, 110-145 chunks/s.
#              No errors, no lost or misrouted replies in any phase; the server's log ends with a clean SIGTERM.
#   Written after five calls found no machine (each failed start cost 90-180 s of the budget, 959 s left):
#   PART=e   the three in one call, most needed first: the headline (H200 only), part d's loadgen, then the suite's
#            steps 3 and 4 (steps 1 and 2, the kernels and the engine, are untouched since they passed in session 57).
#            Predictions as above.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session58.sh, carry [".whl"]; TAG=sNN names
# the files of a later session's run (default s58)
set -u
T=${TAG:-s58}
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P, $I, gpu_suite
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "${PART:-a}" in
a)
  if echo "$GPU_NAME" | grep -q H200; then
    lane H 0 40 <<EOT
200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-${T}-4proc_model.json
EOT
  fi
  gpu_suite ${T}a &
  ;;
d)
  lane A 0 60 <<EOT &
300 bash -c 'setsid $V serve --workload libero-pi0 --levers best --max-batch 8 --port 8765 --warmup-batches 1,4,8 > $R/serve_libero-pi0_best-${T}d.log 2>&1 & SP=\$!; for i in \$(seq 240); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 150 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4,8 --requests 40 --warmup 3 --json $R/loadgen_libero-pi0_best-${T}d-maxbatch8.json; kill -TERM \$SP; wait \$SP; tail -8 $R/serve_libero-pi0_best-${T}d.log'
EOT
  ;;
e)
  {
    if echo "$GPU_NAME" | grep -q H200; then
      echo "200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-${T}-4proc_model.json"
    fi
    echo "240 bash -c 'setsid $V serve --workload libero-pi0 --levers best --max-batch 8 --port 8765 --warmup-batches 1,4,8 > $R/serve_libero-pi0_best-${T}d.log 2>&1 & SP=\$!; for i in \$(seq 200); do python3 -c \"import urllib.request as u; u.urlopen(\\\"http://127.0.0.1:8765/healthz\\\", timeout=2)\" 2>/dev/null && break; sleep 1; done; timeout 120 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4,8 --requests 40 --warmup 3 --json $R/loadgen_libero-pi0_best-${T}d-maxbatch8.json; kill -TERM \$SP; wait \$SP; tail -8 $R/serve_libero-pi0_best-${T}d.log'"
    echo "200 $P -q -n 14 --timeout 180 --durations 5 -m \"not quiet_gpu and not quiet_host\" $I 2>&1 | tee $R/pytest_gpu_${T}e3.log | grep -v \"^\\\\.*\\\\[\""
    echo "80 $P -q --timeout 70 -m \"quiet_gpu or quiet_host\" $I 2>&1 | tee $R/pytest_gpu_${T}e4.log | tail -5"
  } | lane A 0 60 &
  ;;
esac
finish
