#!/bin/bash
# Session 62's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=a   1) the test modules changed in session 61 after its last GPU run (15480dc: compile_switched reads
#               torch's dynamo config only where the process already loaded it), on the GPU.
#               Prediction: all pass, including test_fp_fusion_forced_off_...[3.6], which failed three times on
#               session 61's H100 before that fix.
#               Added after the session's CPU fixes: their modules too (test_serve, test_serve_rtc, test_inputs,
#               test_engine, test_model, test_profile_breakdown/_processes/_markers), and the CUDA engine and the
#               kernels (test_engine_cuda, test_kernels), whose
#               graphs and step kernels read the static KV cache that 9b468cf keys by prefix length as well as shape.
#               Prediction: all pass; the headline below unchanged (the standard presets' prefix lengths never shared
#               a cache length, so they get the same buffers as before).
#            2) libero-pi0 `best` in policy mode, four fresh processes.
#               Prediction on an H200: 14.0-14.4 ms (session 48: 14.05-14.34 at the same kernels).
#               Prediction on an H100: 13.9-14.3 ms (session 61: 14.06, medians 14.01-14.13).
#            3) model mode in four fresh processes on the same card.
#               Prediction: 12.7-13.0 ms on an H200 (session 60: 12.72), 13.2-13.5 on an H100 (session 61: 13.33).
#            4) added after the breakdown fixes (5447b39: the process's first call is the untimed one, timed alone; the
#               check now runs the untimed path, graph capture included, before the staged one; 8676408: the copy back
#               as the served call does it): a policy-mode breakdown of `best`.
#               Prediction: the staged call matches the untimed one exactly; coverage 0.95-1.05; first_call_s now a
#               cold call, 2-3 s as bench's (before: a warm call's ~0.02 s); host stages 0.5-0.7 ms on an H100
#               (session 61: 0.59), 1.4-1.8 ms on an H200 (session 48).
# Run order (after 800 s of the budget went to failed starts): the tests, 4), 3), then 2), so that a call cut short
# by its time limit loses the figures that were measured last session first.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session62.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $GPU_NAME"
T="tests/test_profile_syncs.py tests/test_profile_doctor.py tests/test_broker.py tests/test_conventions.py"
T="$T tests/test_timing.py tests/test_profile_scaling.py tests/test_normalize.py tests/test_checkpoints.py"
T="$T tests/test_unipc.py tests/test_serve.py tests/test_serve_rtc.py tests/test_inputs.py tests/test_engine.py"
T="$T tests/test_model.py tests/test_profile_breakdown.py tests/test_profile_processes.py tests/test_profile_markers.py"
case "${PART:-a}" in
a)
  {
    echo "150 $P -q -n 8 --timeout 140 $T 2>&1 | tee $R/pytest_gpu_s62.log | tail -15"
    echo "170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s62k.log | tail -15"
    echo "120 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s62_policy.json"
    echo "180 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s62-4proc_model.json"
    echo "200 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s62-4proc_policy.json"
  } | lane A 0 40 &
  ;;
b)
  # PART=b: what the budget left after the failed starts (374 s) can hold: the CUDA engine's and the kernels' tests
  # (the static cache's new key), then the policy breakdown (the check's call order). Predictions as in a) 1) and 4).
  {
    echo "170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s62k.log | tail -15"
    echo "100 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s62_policy.json"
  } | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
