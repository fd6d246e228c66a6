#!/usr/bin/env bash
# Session 3: the step kernel (`megakernel`) on the GPUs, as run (nvidia-h200-x2, one lane per GPU).
#   PART=first   A: expert_step_bench.py (barrier self-check, accuracy, tilings, per-phase times)
#                B: matrix best vs graph + megakernel vs compile + graph + megakernel
#   PART=sweeps  A/B: expert_step_bench.py sweeps 1 and 2 (then --sweep 3 for the L2 prefetch)
#   PART=final   A: matrix best vs best + megakernel (libero-pi0, libero-shallow6); B: T(N) of both
#   PART=bench   A: bench best (now with megakernel) model + policy; B: shallow6
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=final bash benchmarks/h200_megakernel.sh
set -u
source benchmarks/lanes.sh  # $R, lane, and the lever lists $X / $G, $V, $B
case "${PART:-final}" in
first)
  lane A 0 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py --json $R/kernel_expert_step.json
EOT
  lane B 1 30 <<EOT &
500 $V matrix --workload libero-pi0 --variants "best;$X,megakernel;$X,compile=default,megakernel" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0_megakernel.json
EOT
  ;;
sweeps)
  lane A 0 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py --json $R/kernel_expert_step.json
240 python3 benchmarks/expert_step_bench.py --sweep 3 --json $R/kernel_expert_step_sweep3.json
EOT
  lane B 1 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 2 --json $R/kernel_expert_step_sweep2.json
EOT
  ;;
final)
  lane A 0 30 <<EOT &
300 $V matrix --workload libero-pi0 --variants "best;$G,megakernel" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-pi0_best_megakernel.json
240 $V matrix --workload libero-shallow6 --variants "best;$G,megakernel" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-shallow6_best_megakernel.json
EOT
  lane B 1 30 <<EOT &
400 $V scaling --workload libero-pi0 --levers "best;$G,megakernel" --no-progress --json $R/scaling_libero-pi0_best_megakernel.json --plot $R/scaling_libero-pi0_best_megakernel.png
EOT
  ;;
bench)
  lane A 0 14 <<EOT &
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-megakernel_model.json
150 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-megakernel_policy.json
EOT
  lane B 1 14 <<EOT &
200 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-megakernel_model.json
EOT
  ;;
esac
wait
cat $R/lane_*.log
