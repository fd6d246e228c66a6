#!/bin/bash
# Session 39's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   the whole test suite on the GPU machine at the session's last code, after this session's audits (the
#            Ray backend and Ray matrix; the doctor, trace and result schemas) landed: gpu_suite, carry [".whl"]; then part b's mutated step
#   PART=b   the breakdown's CUDA-event branch, which no CPU run reaches (session 38's audit left it as a survivor):
#            the GPU test of a graph variant's in-graph breakdown, first as the code is, then with the untimed side
#            read by the wall clock instead of CUDA events. Prediction: passes as it is; fails under the mutation
#            (its new asserts name the timer and the untimed event median); the tree is restored after.
#            Then libero-pi05 `best` at horizon 50 (the README's one figure from 2026-12-02, session 25's 14.32 ms) and
#            at its own horizon 10, fresh processes on one instance. Prediction: nothing since session 25 changed the
#            work of either call, so h50 lands within the ~3% that instances differ by (14.0-14.8 ms), and h50 / h10
#            stays at session 25's 1.178 within 2%.
#   PART=c   part b's miss taken apart: libero-pi05 `best` at horizon 50 took 14.92 ms against session 25's 14.32
#            (+4.1%) while horizon 10 took 12.02 against 12.16: the step kernel's config at 50 rows is the same in both
#            files, so either the instance or the code since 55bf55a. session 25's code (s25tree/: `git archive 55bf55a
#            vlaperf`, untracked, carried with the tree) and today's, fresh processes alternating three times each,
#            --no-check (part b checked today's). Prediction: if it is the instance, the two sides within 1%; if the
#            code, session 25's ~4% faster. The records go to profiles/ (not figures: make_performance_md skips it).
#   PART=d   part a's one failure fixed (the doctor's empty-cache-variable test called torch's cache_dir(), which raises
#            FileNotFoundError for "" in the machine's torch 2.11): the doctor's test file again, and the doctor
#            command itself with TORCHINDUCTOR_CACHE_DIR="". Prediction: the file passes; the doctor shows the warning.
#   PART=e   what part d's doctor call showed: with TORCHINDUCTOR_CACHE_DIR="" the doctor itself stopped with "error: :
#            No such file or directory" (torch 2.11's inductor makes its cache folder at import; the PDL check imports
#            it), and torch.compile failed the same way. After the fix: the doctor with the empty variable (prediction:
#            exit 0 or its warning code, the cache warning and PDL "unknown" shown), bench tiny with compile (refused,
#            naming the variable), then the whole suite at the session's last code.
#   PART=f   the two test files the last audit changed (fusion, compile and prefix: test_engine.py and
#            test_profile_doctor.py) on the GPU machine. Prediction: all pass.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session39.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
# the breakdown test of part b (which ran it with --tb=line), and the mutation that its CUDA-event asserts must catch
T="python3 -m pytest -p no:cacheprovider -q --tb=short tests/test_profile_breakdown.py -k cuda_graph_variant"
M='s/if timer == "cuda_event" and timing/if False and timing/'
# one lane step each (parts a and b; part b ran them with `tail -4` in place of the grep): the test under the
# mutation, the file restored after; then a check, when that step runs, that no mutated line is left
MUTATED="cp vlaperf/profile/breakdown.py /tmp/bd.py && sed -i '$M' vlaperf/profile/breakdown.py && grep -c 'if False and timing' vlaperf/profile/breakdown.py; $T 2>&1 | grep -E '^E  |passed|failed' | head -12 | sed 's/^/mutated: /'; cp /tmp/bd.py vlaperf/profile/breakdown.py"
LEFT='echo "mutated lines left: $(grep -c "if False and timing" vlaperf/profile/breakdown.py)"'
case "${PART:-a}" in
a)
  # then part b's mutation step again (the suite runs the test as it is)
  { gpu_suite s39${PART}; lane M 0 20 <<EOT
120 $MUTATED
10 $LEFT
EOT
  } &
  ;;
b)
  lane A 0 40 <<EOT &
120 $T 2>&1 | tail -3 | sed "s/^/as is: /"
120 $MUTATED
10 $LEFT
120 $V bench --workload libero-pi05 --action-horizon 50 --levers best $B --json $R/bench_libero-pi05-h50_best-s39_model.json
100 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s39_model.json
EOT
  ;;
c)
  H="--workload libero-pi05 --action-horizon 50 --levers best $B --no-check --json $R/profiles"
  mkdir -p $R/profiles
  lane A 0 16 <<EOT &
100 $V bench $H/h50_s39c_new1.json
100 cd s25tree && PYTHONPATH=$PWD/s25tree python3 -c 'import vlaperf; print(vlaperf.__file__)' && VLAPERF_GIT_COMMIT=55bf55a PYTHONPATH=$PWD/s25tree python3 -m vlaperf.cli bench $H/h50_s39c_s25code1.json
100 $V bench $H/h50_s39c_new2.json
100 cd s25tree && VLAPERF_GIT_COMMIT=55bf55a PYTHONPATH=$PWD/s25tree python3 -m vlaperf.cli bench $H/h50_s39c_s25code2.json
100 $V bench $H/h50_s39c_new3.json
100 cd s25tree && VLAPERF_GIT_COMMIT=55bf55a PYTHONPATH=$PWD/s25tree python3 -m vlaperf.cli bench $H/h50_s39c_s25code3.json
EOT
  ;;
d)
  lane A 0 30 <<EOT &
150 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short tests/test_profile_doctor.py 2>&1 | tee $R/pytest_gpu_s39d.log | tail -8
100 TORCHINDUCTOR_CACHE_DIR= $V doctor --workload tiny --no-measure 2>&1 | grep -i -A3 "set but empty"
EOT
  ;;
e)
  {
    TORCHINDUCTOR_CACHE_DIR= $V doctor --workload tiny --no-measure --json $R/doctor_empty_cache_s39e.json > $R/doctor_empty_cache_s39e.txt 2>&1
    echo "doctor rc=$?" >> $R/doctor_empty_cache_s39e.txt
    TORCHINDUCTOR_CACHE_DIR= $V bench --workload tiny --levers for_loop,compile --iters 2 --warmup 1 >> $R/doctor_empty_cache_s39e.txt 2>&1
    echo "bench rc=$?" >> $R/doctor_empty_cache_s39e.txt
    gpu_suite s39${PART}
  } &
  ;;
f)
  lane A 0 30 <<EOT &
200 python3 -m pytest -p no:cacheprovider -q -n 12 -rfEs --tb=short tests/test_engine.py tests/test_profile_doctor.py > $R/pytest_gpu_s39f.log 2>&1; tail -n 1 $R/pytest_gpu_s39f.log | sed "s/warnings/w./"
EOT
  ;;
esac
finish
