#!/bin/bash
# Session 66's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
# Carry [".whl", ".whl_lerobot"]: the working tree then passes the tool's 64 MiB unless docs/report/ (25 MiB, not
# needed on the device) is moved out of it for the call and back after.
#   PART=a   on an H200: libero-pi0 `best` in policy mode and in model mode, four fresh processes each, then a policy
#               breakdown. Predictions: policy 14.0-14.4 ms (session 48: 14.05-14.34), model 12.7-13.0 ms (session 60:
#               12.72); breakdown: the staged call matches the untimed one exactly, coverage 0.95-1.05, host stages
#               1.4-1.8 ms (session 48's H200 host), first_call_s 2-5 s (the benches before it fill the compile caches;
#               session 65: 2.6 s).
#            on any card, after it: the LeRobot-gated tests that are neither slow nor gpu, with the real LeRobot 0.6.1
#               (no GPU run has had LeRobot for them since session 45; session 65's part h was taken back).
#               Prediction: all pass.
#            on a card other than the H200, then: `check --levers all` of libero-pi0 in float32 (22975e5: a variant that
#               raises when it runs is a row that says why; session 65 saw the command end at the megakernel). Predictions:
#               each lever alone within float32's 1e-4 except `triton_kernels` (uncertain: suffix_attention's tl.dot takes
#               Triton's default TF32 for float32 operands, ~1e-3 rel per dot, so likely over 1e-4) and `megakernel`
#               (could not run: 393,216 B of shared memory against 232,448, naming float32); `best` (compile + graph,
#               no kernels) passes at ~1e-6 (session 65's bench: 1.2e-6); exit 1 if triton_kernels fails, else 2.
#            and tests/test_profile_syncs.py (cb85899 adds F.normalize, F.local_response_norm and F.embedding to the
#               mode, with 5 syncing and 4 non-syncing cases in the referee test against CUDA's sync debug mode).
#               Prediction: all pass; the least sure case is embedding(max_norm=1.0) as not syncing on CUDA.
#   PART=b   the float32 check alone (for an H200 that ran part a's headline). Predictions as above.
#            Outcome (H100, 11:57-11:59): syncs 39 passed, the referee test with its 9 new cases among them; LeRobot-gated
#               83 passed, 5 skipped (4 by design where LeRobot and CUDA are present, 1 LeRobot's eval script without
#               `datasets`); the float32 check, exit 1: every lever alone 2.5e-7..1.0e-6, best 1.19e-6, megakernel
#               "could not run" naming float32 (393216 B against 232448), fuse_projections+triton_kernels FAILED at
#               7.92e-4 (max abs 2.7e-3): as predicted. The cause: suffix_attention's two dots took Triton's TF32.
#   PART=c   after the fix (suffix_attention's dots in full precision for float32 operands; bfloat16 unchanged),
#            in this order (failed starts left ~890 s of the budget): 2), 1); 3) dropped at 457 s left.
#               1) tests/test_kernels.py on the GPU. Prediction: all pass (bfloat16 unchanged: PRECISION None there).
#               2) check --dtype float32 of fuse_projections+triton_kernels and of graph + compile + triton_kernels
#               ($G). Prediction: both pass, rel L2 <= 1e-5 (IEEE dots, as small_m_matmul's already were).
#               3) matrix --dtype float32 --variants "best;$G", model mode: is `best` right to leave the kernels out
#               in float32? Prediction: $G 1.1-2x slower than best (the kernels' IEEE dots run on FMA units, where
#               torch's float32 matmuls take cuBLAS's SGEMM; the tiles were tuned for bfloat16).
#            Outcome: no machine came for it (six failed starts and seven refusals in cool-downs, 12:05-13:01).
#   PART=d   part c's first check alone, fuse_projections+triton_kernels (262 s of the budget left). Prediction: passes,
#               rel L2 <= 1e-5. Outcome: refused, too little device time left to start a machine (13:11). Not run on a
#               GPU; on the CPU the kernel compiled for sm_90 (Triton 3.9) gives FMA dots in float32 and a bfloat16 PTX
#               identical to the old source's but for debug info (tests/test_kernels.py, docs/perf-notes.md).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session66.sh, carry [".whl", ".whl_lerobot"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $GPU_NAME"
case "${PART:-a}" in
a)
  install_wheels .whl_lerobot /tmp/lrsite
  L="PYTHONPATH=/tmp/lrsite:\$PYTHONPATH"
  {
    case "$GPU_NAME" in
      *H200*)
        echo "190 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s66-4proc_policy.json"
        echo "170 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s66-4proc_model.json"
        echo "90 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s66_policy.json"
        ;;
      *) echo "0 echo 'not an H200 ($GPU_NAME): no headline'" ;;
    esac
    echo "60 $P -q -n 4 --timeout 55 tests/test_profile_syncs.py 2>&1 | tee $R/pytest_gpu_s66s.log | tail -8"
    echo "130 $L $P -q -n 6 --timeout 120 -m 'not slow and not gpu' tests/test_compare_lerobot.py tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s66a.log | tail -8"
    case "$GPU_NAME" in
      *H200*) ;;
      *) echo "300 $V check --workload libero-pi0 --dtype float32 --json $R/check_libero-pi0_fp32-s66.json; echo exit=\$?" ;;
    esac
  } | lane A 0 40 &
  ;;
b)
  echo "300 $V check --workload libero-pi0 --dtype float32 --json $R/check_libero-pi0_fp32-s66.json; echo exit=\$?" | lane A 0 40 &
  ;;
c)
  {
    echo "200 $V check --workload libero-pi0 --dtype float32 --levers 'fuse_projections,triton_kernels;$G' --json $R/check_libero-pi0_fp32_kernels-s66.json; echo exit=\$?"
    echo "120 $P -q -n 4 --timeout 110 tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s66c1.log | tail -6"
  } | lane A 0 40 &
  ;;
d)
  echo "150 $V check --workload libero-pi0 --dtype float32 --levers fuse_projections,triton_kernels --json $R/check_libero-pi0_fp32_kernels-s66.json; echo exit=\$?" | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
