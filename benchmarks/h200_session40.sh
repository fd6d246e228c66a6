#!/bin/bash
# Session 40's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   a mutation audit of the code only a GPU runs (benchmarks/gpu_mutants.py: 24 mutants of the CUDA-graph
#            cache, the engine's graph key and timed replays, the CUDA-event timer, time_calls' peak memory,
#            interleaved's event ratios and the environment record's GPU fields), against the GPU tests as they were
#            (test_engine_cuda.py, test_profile_breakdown.py, test_timing.py) and with the new
#            tests/test_cuda_measurement.py. Predictions: the unmutated tree passes every test. Killed before: ~5
#            (the inputs not copied, the timed graph sharing the untimed key, never timed, no events, maybe the
#            tables made inside the capture); after: all but the ones that change no behaviour a test can see (no
#            warm-up before capture, no join of the warm-up stream, has_shape ignoring the timed key, and the UUID's
#            prefix if torch never prints one): ~19-20 of 24.
#   PART=b   part a's runner found every mutant "killed" because the unmutated tree failed one new test by itself:
#            its message was not kept; likeliest, the 4 ms upper bound on 2e6 spin cycles (1 ms at 1.98 GHz, longer at a low clock),
#            and one more new test failed under some unrelated mutants (the 8 side-by-side runs share the GPU by time
#            slices). Bounds now one-sided with room for time slices; the runner keeps each failure's message.
#            The new file alone with its 7 tests side by side (-n 7), then the mutants again. Predictions: the file
#            passes both ways; killed before 9 (as part a), after ~20 of 24 (no warm-up, no stream join, has_shape
#            and the UUID prefix may survive; part a cannot tell, its kills of them were the flaky test's).
#   PART=c   part b: the unmutated tree passed alone (75 passed), but two new checks failed whenever the GPU was shared
#            (the -n 7 run of the file, and as false kills of unrelated mutants): events recorded around a kernel on
#            another stream took 24.5 of the call's 45 ms, and twice the spin measured 0.8-1.0x as fast. Those checks
#            are now what sharing cannot move: wall > event per call, the wall clock waiting for a side stream, the
#            ratios computed from their own clock's samples. Predictions: the file passes twice at -n 7; the
#            unmutated tree passes; killed 8 -> 18 of 24, the other six equivalent here (no stream join, has_shape,
#            the UUID prefix; the untimed graph's sink, as no stage is marked without a hook; no warm-up and no
#            prepare, as the warm-up makes the tables before the capture).
#   PART=d   the whole suite on the GPU machine at the session's last code (the new GPU tests among the others of
#            the suite's third step, 14 processes side by side; this session's audits' tests): gpu_suite, carry
#            [".whl"]. Prediction: all pass (session 39's 1256 plus this session's new tests).
#            Not run in session 40: the device pool was paused before it (prepared for the next session).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session40.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  mkdir -p $R/profiles
  lane A 0 40 <<EOT &
560 python3 benchmarks/gpu_mutants.py --jobs 8 --timeout 300 --json $R/profiles/gpu_mutants_s40.json > $R/profiles/gpu_mutants_s40.log 2>&1; tail -30 $R/profiles/gpu_mutants_s40.log
EOT
  ;;
b)
  mkdir -p $R/profiles
  lane A 0 40 <<EOT &
100 python3 -m pytest -p no:cacheprovider -q -n 7 -rfE --tb=line tests/test_cuda_measurement.py > $R/profiles/pytest_gpu_s40b.log 2>&1; tail -n 6 $R/profiles/pytest_gpu_s40b.log
460 python3 benchmarks/gpu_mutants.py --jobs 8 --timeout 300 --json $R/profiles/gpu_mutants_s40b.json > $R/profiles/gpu_mutants_s40b.log 2>&1; tail -30 $R/profiles/gpu_mutants_s40b.log
EOT
  ;;
c)
  mkdir -p $R/profiles
  lane A 0 40 <<EOT &
100 for i in 1 2; do python3 -m pytest -p no:cacheprovider -q -n 7 -rfE --tb=line tests/test_cuda_measurement.py > $R/profiles/pytest_gpu_s40c\$i.log 2>&1; tail -n 3 $R/profiles/pytest_gpu_s40c\$i.log; done
460 python3 benchmarks/gpu_mutants.py --jobs 8 --timeout 300 --json $R/profiles/gpu_mutants_s40c.json > $R/profiles/gpu_mutants_s40c.log 2>&1; tail -30 $R/profiles/gpu_mutants_s40c.log
EOT
  ;;
d)
  gpu_suite s40${PART} &
  ;;
esac
finish
