#!/bin/bash
# Session 65's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=a   0) the test modules changed since session 64's one call (at ceb213c), none yet run on a GPU: the two
#               fixed in bb37afd for that machine's set-up (test_profile_doctor: Triton stand-in after torch._dynamo;
#               test_timing: CC/CXX unset for the empty-PATH compiler case), syncs from the ops' schemas (torch's
#               private schema API: 2.11 there, 2.13 here), report/diff without torch, compare's first-call times and
#               LeRobot check, wam's flash dtypes and UniPC's shift guard, diff/processes/breakdown, cli, serve, hub,
#               normalize. Prediction: all pass.
#            1) libero-pi0 `best` in policy mode, four fresh processes.
#               Prediction: 14.0-14.4 ms on an H200 (session 48: 14.05-14.34 at the same kernels), 13.9-14.3 on an
#               H100 (session 63: 14.12).
#            2) a policy-mode breakdown of `best`. Prediction: the staged call matches the untimed one exactly;
#               coverage 0.95-1.05; host stages 1.4-1.8 ms on an H200 (session 48), 0.5-0.7 ms on an H100 (session 63:
#               0.70); first_call_s a cold call, ~11 s (session 63's H100: 11.4 s).
#            3) libero-pi0 `best` in model mode, four fresh processes.
#               Prediction: 12.7-13.0 ms on an H200 (session 60: 12.72), 13.2-13.6 on an H100 (session 64: 13.40).
#            Outcome (H100, 08:35-08:41): 0) 1063 passed, 23 skipped; 1) medians 14.06-14.16 ms, file 14.15; 2) exact,
#               coverage 1.013, host stages 0.82 ms (miss: above 0.5-0.7), first_call_s 2.6 s (miss: the bench before it
#               had filled the compile caches); 3) medians 13.33-13.40 ms, file 13.35.
#   PART=b/c the whole GPU suite, last run in session 57 (sessions 58-64 changed syncs, doctor, compare, report, serve,
#               hub, wam, the static cache, ...): lanes.sh gpu_suite's steps 1, 2 and 4 (b), then step 3 (c).
#               Prediction: all pass (session 57: 48 passed 11 skipped; 339 passed; 2 passed + the quiet_host tests;
#               step 3 more than its 1207, with only LeRobot/openpi/ray and CPU-only skips).
#            Outcome (H100, 08:40-08:44): b) 48 passed 11 skipped; 365 passed; 11 passed 1 skipped (ray). c) 1339
#               passed, 1 failed, 40 skipped: test_performance_md, since 6de81bd committed the new result files without
#               regenerating docs/performance.md (done in 3c68d24). Otherwise as predicted.
#   PART=d   on an H200 only: libero-pi0 `best` in policy mode and in model mode, four fresh processes each, then a
#               policy breakdown. Prediction: policy 14.0-14.4 ms (session 48: 14.05-14.34), model 12.7-13.0 ms
#               (session 60: 12.72); breakdown exact, coverage 0.95-1.05, host stages 1.4-1.8 ms (session 48's H200).
#   PART=e   (carry .whl and .whl_lerobot) 0) tests/test_profile_syncs.py on the GPU, with the new referee test: the
#               mode's flags against CUDA's sync debug mode, call by call (masked_fill/index_fill with a device value,
#               one_hot without num_classes, interpolate(size=n), tensor_split(x, [n, 4]) among them). Prediction:
#               all pass (the helper's reading of torch's sources: each of those syncs on CUDA with torch 2.11).
#            1) compare libero-pi0 --accelerate --rtc against the real LeRobot 0.6.1 (time_lerobot restructured to
#               record a refusal; first_call_s now each path's first call in the process). Predictions (H100, session
#               51's file): lerobot 205-225 ms, vlaperf_best 13.2-13.8, vlaperf_in_lerobot_predict 13.8-14.4,
#               all rows' rel L2 < 3e-2 as before (~1e-2); no `refused`; vlaperf_best's first_call_s a cold compile
#               and capture, 8-15 s (was 0.014 s, a warm call).
#            2) tests/test_compare_accelerate.py's real-LeRobot cases (slow and gpu marks). Prediction: all pass.
#            Outcome (H100, 09:08-09:11): 0) 38 passed, the referee test among them: as predicted. 1) lerobot 212.12,
#               vlaperf_best 13.48 (first call 10.90 s), vlaperf_in_lerobot_predict 14.07, rel L2 9.8e-3, no refusal:
#               as predicted. 2) 8 passed, 2 skipped (gym_pusht; openpi): as predicted.
#   PART=f   (carry .whl and .whl_lerobot) 1) the same compare for libero-pi05. Predictions (session 51's H100 file):
#               lerobot 225-240 ms, vlaperf_best 12.8-13.3, vlaperf_in_lerobot_predict 13.3-13.9, rel L2 < 3e-2, no
#               refusal, vlaperf_best's first call 3-15 s (the compile caches warm from part e's pi0 run if the machine
#               is the same, not shared between presets' kernels otherwise).
#            2) tests/test_compare_lerobot.py's real-LeRobot cases (slow and gpu marks; the first-call test changed in
#               session 64). Prediction: all pass.
#            Outcome (H100, 09:11-09:14): 1) lerobot 237.06, vlaperf_best 13.14 (first call 8.18 s),
#               vlaperf_in_lerobot_predict 13.72, rel L2 3.6e-3, no refusal: as predicted but lerobot 1% over the range.
#               2) 8 passed, **2 failed**: test_full_size_lerobot_equals_vlaperf_fp32[pi0, pi05]. pi0: `best` of a
#               float32 model took the megakernel, whose float32 tiles asked for 393216 B of shared memory (limit
#               232448): a product fault, on any Hopper. pi05: CUDA out of memory beside pi0's worker (-n 2, two
#               full-size float32 pairs): the step's set-up. Fixed: `best` takes the kernels for bfloat16 models only.
#   PART=g   (carry .whl and .whl_lerobot) 1) the two float32 cases again, one at a time. Prediction: both pass, rel
#               L2 within float32's 1e-4 against LeRobot (session 2: within 1e-4). 2) bench libero-pi0 --dtype float32
#               --levers best, model mode: it runs (compile + graph, no kernels) and passes its check; 50-90 ms (the
#               prefix's ~2.8 TFLOP at IEEE float32's ~50 TFLOP/s achieved, ~56 ms, plus ten steps reading ~1.2 GB of
#               float32 expert weights each at ~3 TB/s, ~4 ms).
#            Outcome (H100, 09:20-09:23): 1) 4 passed; 2) 92.93 ms, rel L2 1.2e-6 (3% over the range).
#   PART=h   (carry .whl and .whl_lerobot) after the float32 fixes (best by dtype; every kernel's resource error names
#               a float32 model where its bfloat16 tiles would fit; scaling and the Ray matrix resolve by dtype):
#               1) the kernels, the CUDA engine and the guidance tests (the guidance GPU tests now name bfloat16's
#               best levers). 2) the LeRobot-gated tests that are neither slow nor gpu, with the real LeRobot (no GPU
#               run has had LeRobot for them since session 45). 3) the GPU suite's step 3 less LeRobot.
#               Prediction: all pass.
#            Outcome: the machine was taken back mid-call (105 s of the budget); nothing came back.
#   PART=i   part h's steps 1 and 3 only (387 s of budget left; the LeRobot step needs the larger carry). Prediction:
#               all pass. Outcome (H100, asked as nvidia-h200 after an H100 start failed, 10:06-10:09): kernels, CUDA
#               engine and guidance 72 passed, 11 skipped (Triton < 3.9); step 3 1361 passed, 40 skipped: as predicted.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session65.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $GPU_NAME"
T="tests/test_cli.py tests/test_compare_lerobot.py tests/test_hub.py tests/test_normalize.py"
T="$T tests/test_profile_breakdown.py tests/test_profile_commands.py tests/test_profile_diff.py"
T="$T tests/test_profile_doctor.py tests/test_profile_processes.py tests/test_profile_syncs.py"
T="$T tests/test_report_render.py tests/test_serve.py tests/test_timing.py tests/test_unipc.py tests/test_wam.py"
case "${PART:-a}" in
a)
  {
    echo "150 $P -q -n 12 --timeout 140 $T 2>&1 | tee $R/pytest_gpu_s65.log | tail -15"
    echo "200 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s65-4proc_policy.json"
    echo "100 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s65_policy.json"
    echo "180 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s65-4proc_model.json"
  } | lane A 0 40 &
  ;;
b)
  cat <<EOT | lane A 0 40 &
170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s65b1.log | grep -v "^\\.*\\["
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s65b2.log | grep -v "^\\.*\\["
120 $P -q --timeout 80 -m "quiet_gpu or quiet_host" $I 2>&1 | tee $R/pytest_gpu_s65b4.log | tail -5
EOT
  ;;
c)
  echo "400 $P -q -n 14 --timeout 220 --durations 5 -m \"not quiet_gpu and not quiet_host\" $I 2>&1 | tee $R/pytest_gpu_s65c3.log | grep -v \"^\\.*\\[\"" | lane A 0 40 &
  ;;
d)
  case "$GPU_NAME" in *H200*) ;; *) echo "PART=d is for an H200; this is $GPU_NAME"; exit 3 ;; esac
  {
    echo "200 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s65-4proc_policy.json"
    echo "180 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s65-4proc_model.json"
    echo "100 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s65_policy.json"
  } | lane A 0 40 &
  ;;
e)
  install_wheels .whl_lerobot /tmp/lrsite
  L="PYTHONPATH=/tmp/lrsite:\$PYTHONPATH"
  {
    echo "100 $P -q -n 4 --timeout 90 tests/test_profile_syncs.py 2>&1 | tee $R/pytest_gpu_s65e0.log | tail -8"
    echo "300 $L $V compare --workload libero-pi0 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated-s65.json"
    echo "400 $L $P -q -n 2 --timeout 390 -m 'slow or gpu' tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s65e2.log | tail -12"
  } | lane A 0 40 &
  ;;
f)
  install_wheels .whl_lerobot /tmp/lrsite
  L="PYTHONPATH=/tmp/lrsite:\$PYTHONPATH"
  {
    echo "200 $L $V compare --workload libero-pi05 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi05_lerobot_accelerated-s65.json"
    echo "330 $L $P -q -n 2 --timeout 320 -m 'slow or gpu' tests/test_compare_lerobot.py 2>&1 | tee $R/pytest_gpu_s65f2.log | tail -12"
  } | lane A 0 40 &
  ;;
g)
  install_wheels .whl_lerobot /tmp/lrsite
  L="PYTHONPATH=/tmp/lrsite:\$PYTHONPATH"
  {
    echo "300 $L $P -q --timeout 290 -k fp32 tests/test_compare_lerobot.py 2>&1 | tee $R/pytest_gpu_s65g1.log | tail -12"
    echo "150 $V bench --workload libero-pi0 --dtype float32 --levers best --mode model --no-progress --iters 20 --warmup 5 --json $R/bench_libero-pi0_best-fp32-s65_model.json"
  } | lane A 0 40 &
  ;;
h)
  install_wheels .whl_lerobot /tmp/lrsite
  L="PYTHONPATH=/tmp/lrsite:\$PYTHONPATH"
  {
    echo "90 $P -q -n 4 --timeout 80 tests/test_kernels.py tests/test_engine_cuda.py tests/test_guidance.py 2>&1 | tee $R/pytest_gpu_s65h1.log | tail -6"
    echo "150 $L $P -q -n 6 --timeout 140 -m 'not slow and not gpu' tests/test_compare_lerobot.py tests/test_compare_accelerate.py 2>&1 | tee $R/pytest_gpu_s65h2.log | tail -8"
    echo "180 $P -q -n 14 --timeout 170 -m 'not quiet_gpu and not quiet_host' $I 2>&1 | tee $R/pytest_gpu_s65h3.log | tail -8"
  } | lane A 0 40 &
  ;;
i)
  {
    echo "80 $P -q -n 4 --timeout 75 tests/test_kernels.py tests/test_engine_cuda.py tests/test_guidance.py 2>&1 | tee $R/pytest_gpu_s65i1.log | tail -6"
    echo "170 $P -q -n 14 --timeout 160 -m 'not quiet_gpu and not quiet_host' $I 2>&1 | tee $R/pytest_gpu_s65i3.log | tail -8"
  } | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
