#!/bin/bash
# Session 21's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   programmatic dependent launch for inductor's kernels (change_ab.py --change inductor_pdl) at batch 1
#            and 4, each in one process against the same levers without it; then libero-pi0-b4 with the step
#            kernel (`megakernel=batched`) against `best` (the layers), each in a fresh process (session 20's
#            "Next" item 2: sessions 13-16 changed the kernel since session 7 measured it slower at batch 4)
#   PART=b   programmatic dependent launch for the engine's own Triton kernels (change_ab.py --change kernel_pdl) at
#            batch 1 and 4, inductor's PDL (now a compile option the engine sets, on in both engines) again at batch 1
#            (inductor_pdl, engine A built without it); libero-pi0 best in a fresh process
#   PART=c   with kernel PDL off (launch.PDL then, PDL_KERNELS empty now; part b: 0.997x) and inductor's PDL on: where a served call's time goes
#            beyond the model call (served_path_probe.py), then the closing benches of every pi0-family workload in
#            fresh processes (c: libero-pi0 in model and policy mode, b4, b8; d: libero-pi05, libero-shallow6,
#            aloha-pi0) and the equivalence checks of best at batch 1 and 4 (d); the probe runs in d (carry .whl:
#            its first try in c found no websockets on the image)
#   PART=e   the policy path's host <-> device pieces alone (upload_probe.py): where the served path probe's 0.59 ms
#            upload and 0.24 ms copy to the host go
#   PART=f   (carry .whl) the served-path probe again with the server's event loop polling for results (every 0.2 ms)
#            against sleeping until the inference thread wakes it; libero-pi0 best's kernel table and sequence with
#            inductor's PDL (the gaps between kernels against session 16's sequence)
#   PART=g   libero-pi0 best's kernel table and sequence with and without our kernels' PDL, one instance, to place
#            version 94's loss
#   PART=h   PDL for the denoise loop's kernels alone (launch.DENOISE_LOOP_KERNELS: the step kernel and the heads
#            between its launches), change_ab.py --change kernel_pdl, libero-pi0. Prepared, not run: the session's
#            device time was spent
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session21.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  python3 -c "import torch, triton, torch._inductor.config as c; print(torch.__version__, triton.__version__, 'enable_pdl' in dir(c.triton), hasattr(triton.language.extra.cuda, 'gdc_wait'))"
  lane A 0 30 <<EOT &
200 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_pdl1 python3 benchmarks/change_ab.py --change inductor_pdl --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_inductor_pdl.json
200 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_pdl4 python3 benchmarks/change_ab.py --change inductor_pdl --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_inductor_pdl.json
120 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s21_model.json
150 $V bench --workload libero-pi0-b4 --levers $G,compile_layers,megakernel=batched $B --json $R/bench_libero-pi0-b4_megakernel-batched-s21_model.json
EOT
  ;;
b)
  lane A 0 30 <<EOT &
200 python3 benchmarks/change_ab.py --change kernel_pdl --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_kernel_pdl.json
200 python3 benchmarks/change_ab.py --change kernel_pdl --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_kernel_pdl.json
200 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_pdl1b python3 benchmarks/change_ab.py --change inductor_pdl --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_inductor_pdl_option.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s21b_model.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s21_model.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s21_policy.json
100 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s21c_model.json
120 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s21_model.json
EOT
  ;;
d)
  # (carry .whl: websockets, which the image lacks, for the probe's server and client)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 40 <<EOT &
150 python3 benchmarks/served_path_probe.py --workload libero-pi0 --levers best --json $R/served_path_libero-pi0_best.json
100 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s21_model.json
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s21_model.json
100 $V bench --workload aloha-pi0 --levers best $B --json $R/bench_aloha-pi0_best-s21_model.json
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s21.json
150 $V check --workload libero-pi0-b4 --levers best --seeds 1 --json $R/check_libero-pi0-b4_best_s21.json
EOT
  ;;
e)
  lane A 0 40 <<EOT &
100 python3 benchmarks/upload_probe.py --json $R/upload_probe_libero-pi0.json
EOT
  ;;
f)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 40 <<EOT &
150 python3 benchmarks/served_path_probe.py --workload libero-pi0 --levers best --json $R/served_path_libero-pi0_best_polls.json
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --levers best --rows 30 --sequence $R/kernel_sequence_best_s21.txt > $R/kernels_best_s21.txt 2>&1; tail -10 $R/kernels_best_s21.txt
EOT
  ;;
g)
  lane A 0 12 <<EOT &
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --levers best --kernel-pdl none --rows 30 --sequence $R/kernel_sequence_best_s21g.txt > $R/kernels_best_s21g.txt 2>&1; tail -10 $R/kernels_best_s21g.txt
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --levers best --kernel-pdl all --rows 30 --sequence $R/kernel_sequence_best_kernel-pdl_s21g.txt > $R/kernels_best_kernel-pdl_s21g.txt 2>&1; tail -10 $R/kernels_best_kernel-pdl_s21g.txt
EOT
  ;;
h)
  lane A 0 12 <<EOT &
200 python3 benchmarks/change_ab.py --change kernel_pdl --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_kernel_pdl_loop.json
EOT
  ;;
esac
finish
