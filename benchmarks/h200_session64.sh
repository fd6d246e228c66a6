#!/bin/bash
# Session 64's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=a   1) the test modules changed in sessions 62 and 63 that no GPU has run yet (session 63's one machine ran
#               only the CUDA engine's and the kernels' tests): syncs, doctor, broker, conventions, timing, scaling,
#               normalize, checkpoints, unipc, serve, serve_rtc, inputs, engine, model, cli, the breakdown/processes/
#               markers modules. Prediction: all pass.
#            2) libero-pi0 `best` in model mode, four fresh processes.
#               Prediction: 12.7-13.0 ms on an H200 (session 60: 12.72), 13.2-13.5 on an H100 (session 63: 13.36).
#            Outcome of 1) on an H100 (06:34): 9 failed of 1013, all the tests' own set-up on that machine. Its $CXX is
#               an absolute path, found without PATH (test_environment_record_no_compiler_on_empty_path); a doctor test
#               put a Triton stand-in in place before torch._dynamo first loaded, which then imports the stand-in.
#   PART=b   0) the two fixed modules (test_profile_doctor, test_timing), and those changed since: syncs (host reads now
#               from the ops' schemas, through torch's private schema API: torch 2.11 there, 2.13 here), report and
#               diff without torch (test_report_render), the CLI. Prediction: all pass.
#            3) libero-pi0 `best` in policy mode, four fresh processes.
#               Prediction: 14.0-14.4 ms on an H200 (session 48: 14.05-14.34 at the same kernels), 13.9-14.3 on an
#               H100 (session 63: 14.12).
#            4) a policy-mode breakdown of `best`. Prediction: the staged call matches the untimed one exactly;
#               coverage 0.95-1.05; host stages 1.4-1.8 ms on an H200 (session 48), 0.5-0.7 ms on an H100 (session 63:
#               0.70); first_call_s a cold call, ~11 s (session 63's H100: 11.4 s).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session64.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $GPU_NAME"
T="tests/test_profile_syncs.py tests/test_profile_doctor.py tests/test_broker.py tests/test_conventions.py"
T="$T tests/test_timing.py tests/test_profile_scaling.py tests/test_normalize.py tests/test_checkpoints.py"
T="$T tests/test_unipc.py tests/test_serve.py tests/test_serve_rtc.py tests/test_inputs.py tests/test_engine.py"
T="$T tests/test_model.py tests/test_cli.py tests/test_profile_breakdown.py tests/test_profile_processes.py"
T="$T tests/test_profile_markers.py"
case "${PART:-a}" in
a)
  {
    echo "200 $P -q -n 10 --timeout 180 $T 2>&1 | tee $R/pytest_gpu_s64.log | tail -15"
    echo "200 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s64-4proc_model.json"
  } | lane A 0 40 &
  ;;
b)
  {
    echo "120 $P -q -n 8 --timeout 110 tests/test_profile_doctor.py tests/test_timing.py tests/test_profile_syncs.py tests/test_report_render.py tests/test_hub.py 2>&1 | tee $R/pytest_gpu_s64b.log | tail -8"
    echo "220 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s64-4proc_policy.json"
    echo "120 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s64_policy.json"
  } | lane A 0 40 &
  ;;
c)
  # PART=c: what 360 s of budget can hold after the start (part a's start took ~280 s of held time): b's step 0 alone
  echo "120 $P -q -n 8 --timeout 110 tests/test_profile_doctor.py tests/test_timing.py tests/test_profile_syncs.py tests/test_report_render.py tests/test_hub.py 2>&1 | tee $R/pytest_gpu_s64b.log | tail -8" | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
