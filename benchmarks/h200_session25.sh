#!/bin/bash
# Session 25's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   a real checkpoint's serving path in bf16 (api_smoke.py: 480 x 640 camera images resized on the GPU against
#            the CPU, openpi statistics and pi0_libero's delta actions through best against the reference), then
#            pi0.5 with the 50-action chunk LeRobot's and openpi's ALOHA checkpoints are trained with
#            (--action-horizon 50): the check of best, and its bench
#   PART=b   closing benches of best after the session's policy-path changes: libero-pi0 in policy and model mode,
#            libero-pi05 (horizon 10) in the same process order, each a fresh process
#   PART=c   the profiler's three levels on libero-pi0 at today's code (the committed ones are session 1's): the
#            reference's bench and breakdown one after the other (a QA pass found session 1's breakdown 44% above its
#            bench), best's breakdown, T(N) of reference and best interleaved, host syncs of both, doctor of best
#   PART=d   best's breakdown again (part c's failed: "compile_layers needs compile", fixed), in model and policy mode
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session25.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
240 python3 benchmarks/api_smoke.py
200 $V check --workload libero-pi05 --action-horizon 50 --levers best --seeds 2 --json $R/check_libero-pi05-h50_best_s25.json
120 $V bench --workload libero-pi05 --action-horizon 50 --levers best $B --json $R/bench_libero-pi05-h50_best_model.json
EOT
  ;;
b)
  lane A 0 40 <<EOT &
120 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s25_policy.json
120 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s25_model.json
120 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s25_model.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
90 $V bench --workload libero-pi0 --levers reference --warmup 5 --iters 20 --no-progress --json $R/bench_libero-pi0_reference-s25_model.json
90 $V breakdown --workload libero-pi0 --levers reference --warmup 5 --iters 20 --no-progress --json $R/breakdown_libero-pi0_reference-s25.json
120 $V breakdown --workload libero-pi0 --levers best --warmup 5 --iters 20 --no-progress --json $R/breakdown_libero-pi0_best-s25.json
200 $V scaling --workload libero-pi0 --levers "reference;best" --steps 1,2,5,10,20 --warmup 3 --iters 10 --no-progress --json $R/scaling_libero-pi0_reference_best-s25.json
60 $V syncs --workload libero-pi0 --levers reference --json $R/syncs_libero-pi0_reference-s25.json
90 $V syncs --workload libero-pi0 --levers best --json $R/syncs_libero-pi0_best-s25.json
90 $V doctor --workload libero-pi0 --levers best --json $R/doctor_libero-pi0_best-s25.json
EOT
  ;;
d)
  lane A 0 40 <<EOT &
120 $V breakdown --workload libero-pi0 --levers best --warmup 5 --iters 20 --no-progress --json $R/breakdown_libero-pi0_best-s25.json
120 $V breakdown --workload libero-pi0 --levers best --mode policy --warmup 5 --iters 20 --no-progress --json $R/breakdown_libero-pi0_best-s25_policy.json
EOT
  ;;
esac
finish
