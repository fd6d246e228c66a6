#!/bin/bash
# Session 22's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   (carry .whl: websockets for the served-path probe) where a replayed libero-pi0 call waits for the host
#            (launch_probe.py: the call's GPU span with the GPU idle at its start against queued behind a sleep kernel,
#            the pieces of GraphCache.run, graphs of 1..2000 kernels); session 21's part h (PDL for the denoise loop's
#            kernels alone, change_ab.py --change kernel_pdl); the served-path probe with its front end split into
#            the client's side, the worker's wake-up and the server's rest, and run with the event loop spinning and
#            with idle-priority spinners on every CPU (whether the ~0.7-1.0 ms lost after a ~13 ms wait is CPUs waking
#            from idle); SigLIP's patch matmul in TF32 (change_ab.py --change patch_tf32)
#   PART=b   (carry .whl) part a's launch probe with what separates the causes (a kernel, one small memcpy, the six
#            copies as one multi-tensor kernel, each before the replay; two replays; the graph's nodes by type; the
#            engine built without inductor's PDL), the served-path probe with the client in a child process
#   PART=c   the closing benches, each in a fresh process, with SigLIP's patch matmul in TF32 (now in best): libero-pi0
#            in model and policy mode, b4, b8, libero-pi05, libero-shallow6, aloha-pi0 in model and policy mode (its
#            channels-first upload, session 21's version 98, on the H200 for the first time), and the equivalence
#            checks of best at batch 1 and 4 and for aloha-pi0; first the upload probe for libero-pi0 and aloha-pi0,
#            now with the upload timed right after 13 ms of GPU work, host sleep or host work; last the launch probe
#            with the graphs kept (GraphCache.keep_graphs), so it can count their nodes and edges by type
#   PART=d   (prepared, not run: the device time was spent) the launch probe with graphs of 600 kernels of each kind
#            the engine's graph holds (memset nodes, Triton kernels, Triton kernels with PDL): which keeps it off the
#            driver's constant-time launch; the upload probe with a 4-byte transfer issued after the pause, ahead of
#            the upload (whether a tiny transfer ahead takes the after-pause cost off it), and the upload's pieces and a
#            fixed Python loop after a pause (whether the host's own work or the transfer slows down); run in session 23
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session22.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 40 <<EOT &
150 python3 benchmarks/launch_probe.py --workload libero-pi0 --levers best --json $R/launch_probe_libero-pi0_best.json
200 python3 benchmarks/change_ab.py --change kernel_pdl --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_kernel_pdl_loop.json
200 python3 benchmarks/change_ab.py --change patch_tf32 --workload libero-pi0 --rounds 100 --json $R/change_ab_libero-pi0_patch_tf32.json
200 python3 benchmarks/served_path_probe.py --workload libero-pi0 --levers best --json $R/served_path_libero-pi0_best_s22.json
EOT
  ;;
b)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 60 <<EOT &
200 python3 benchmarks/launch_probe.py --workload libero-pi0 --levers best --without-inductor-pdl --json $R/launch_probe_libero-pi0_best_b.json
240 python3 benchmarks/served_path_probe.py --workload libero-pi0 --levers best --json $R/served_path_libero-pi0_best_s22b.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
100 python3 benchmarks/upload_probe.py --rounds 100 --json $R/upload_probe_libero-pi0_s22.json
100 python3 benchmarks/upload_probe.py --workload aloha-pi0 --rounds 100 --json $R/upload_probe_aloha-pi0_s22.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s22_model.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s22_policy.json
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s22.json
100 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s22_model.json
120 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s22_model.json
100 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s22_model.json
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s22_model.json
100 $V bench --workload aloha-pi0 --levers best $B --json $R/bench_aloha-pi0_best-s22_model.json
100 $V bench --workload aloha-pi0 --levers best --mode policy $B --json $R/bench_aloha-pi0_best-s22_policy.json
150 $V check --workload libero-pi0-b4 --levers best --seeds 1 --json $R/check_libero-pi0-b4_best_s22.json
150 $V check --workload aloha-pi0 --levers best --seeds 1 --json $R/check_aloha-pi0_best_s22.json
150 python3 benchmarks/launch_probe.py --workload libero-pi0 --levers best --without-inductor-pdl --rounds 100 --json $R/launch_probe_libero-pi0_best_c.json
EOT
  ;;
d)
  lane A 0 60 <<EOT &
150 python3 benchmarks/launch_probe.py --workload libero-pi0 --levers best --rounds 100 --json $R/launch_probe_libero-pi0_best_d.json
100 python3 benchmarks/upload_probe.py --rounds 100 --json $R/upload_probe_libero-pi0_s22d.json
EOT
  ;;
esac
finish
