#!/bin/bash
# Session 39's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   the whole test suite on the GPU machine at the session's last code, after this session's audits (the
#            Ray backend and Ray matrix; the doctor, trace and result schemas) landed: gpu_suite, carry [".whl"]
#   PART=b   the breakdown's CUDA-event branch, which no CPU run reaches (session 38's audit left it as a survivor):
#            the GPU test of a graph variant's in-graph breakdown, first as the code is, then with the untimed side
#            read by the wall clock instead of CUDA events. Prediction: passes as it is; fails under the mutation
#            (its new asserts name the timer and the untimed event median); the tree is restored after.
#            Then libero-pi05 `best` at horizon 50 (the README's one figure from 2026-12-02, session 25's 14.32 ms) and
#            at its own horizon 10, fresh processes on one instance. Prediction: nothing since session 25 changed the
#            work of either call, so h50 lands within the ~3% that instances differ by (14.0-14.8 ms), and h50 / h10
#            stays at session 25's 1.178 within 2%.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session39.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  gpu_suite s39${PART} &
  ;;
b)
  T="python3 -m pytest -p no:cacheprovider -q --tb=line tests/test_profile_breakdown.py -k cuda_graph_variant"
  M='s/if timer == "cuda_event" and timing/if False and timing/'
  lane A 0 40 <<EOT &
120 $T 2>&1 | tail -3 | sed "s/^/as is: /"
120 cp vlaperf/profile/breakdown.py /tmp/bd.py && sed -i '$M' vlaperf/profile/breakdown.py && grep -c "if False and timing" vlaperf/profile/breakdown.py; $T 2>&1 | tail -4 | sed "s/^/mutated: /"; cp /tmp/bd.py vlaperf/profile/breakdown.py
10 echo "mutated lines left: \$(grep -c "if False and timing" vlaperf/profile/breakdown.py)"
120 $V bench --workload libero-pi05 --action-horizon 50 --levers best $B --json $R/bench_libero-pi05-h50_best-s39_model.json
100 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s39_model.json
EOT
  ;;
esac
finish
