#!/bin/bash
# Session 43's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
# Session 42's breakdown of `best`'s served call (policy mode) had every host stage at about twice session 30's time
# (transform, upload, image preprocess, setup, copy back: 1.49 ms against 0.75), the GPU stages within 1.3%; the upload
# probe refuted a uniformly slower host; on the CPU (tiny) only `setup` doubled between 9577a0c (session 30's commit)
# and now (0.04 -> 0.08 ms: per-call checks added since).
#   PART=a   (1) best, model mode, on this machine: prediction 12.7-13.2 ms (the same code across H200s since s23).
#            (2) breakdown --levers best --mode policy at 9577a0c (carried as .old9577a0c, `git archive`, run from
#            inside it so that its own vlaperf is imported) and at this commit, interleaved old/new/old/new on this one
#            machine. Prediction: the machine, not the code: transform, upload, preprocess and copy back within 10%
#            between old and new; `setup` higher at new by 0.03-0.15 ms (the checks the CPU split found).
#            (3) session 28's cumulative matrix again (its graph row read 29.1 ms against 32.15-32.64 ms in every
#            other file). Prediction: graph 32-33 ms, the 29.1 does not come back; best ~12.8 ms.
#   PART=b   gpu_suite s43: the whole suite on the GPU, the first run with the fourth step (quiet_gpu, alone) in
#            full. Prediction: all pass.
#   PART=c   (carry .whl_lerobot: LeRobot 0.6.1 and the wheels docs/compare.md lists, installed without deps into
#            their own folder) tests/test_compare_lerobot.py with the real LeRobot, the new `compare --checkpoint`
#            among them (a LeRobot-saved file in both models, float32 and bfloat16). Prediction: all pass (session 2:
#            18 passed, 2 skipped; now 52 tests, of which those that need LeRobot absent or no CUDA skip).
# What ran: part a at c1da1bb. The machine's start left 506 s of the budget after it, so part b was not run and
# part c ran inline with `-m "not gpu"` under a 280 s limit (47 of 49 tests finished; perf-notes, session 43).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session43.sh, carry [".whl", ".old9577a0c"]
# (.old9577a0c: `mkdir .old9577a0c && git archive 9577a0c vlaperf pyproject.toml | tar -x -C .old9577a0c`)
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, gpu_suite
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
OLD="cd .old9577a0c && PYTHONPATH=/tmp/site VLAPERF_GIT_COMMIT=9577a0c3f8a9997d686deeb971033f739ad96e00 $V"
BD="breakdown --workload libero-pi0 --levers best --mode policy --iters 50 --no-progress"
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
90 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s43_model.json
120 $OLD $BD --json $R/breakdown_libero-pi0_best_policy-s43-old1.json
120 $V $BD --json $R/breakdown_libero-pi0_best_policy-s43-new1.json
120 $OLD $BD --json $R/breakdown_libero-pi0_best_policy-s43-old2.json
120 $V $BD --json $R/breakdown_libero-pi0_best_policy-s43-new2.json
330 $V matrix --workload libero-pi0 --variants cumulative --iters 30 --warmup 5 --no-progress --json $R/matrix_libero-pi0_cumulative_s43.json
EOT
  ;;
b)
  gpu_suite s43 &
  ;;
c)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lrsite .whl_lerobot/*.whl
  lane A 0 40 <<EOT &
420 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 8 tests/test_compare_lerobot.py 2>&1 | tee $R/pytest_gpu_s43c_lerobot.log | tail -30
EOT
  ;;
esac
finish
