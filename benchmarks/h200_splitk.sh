#!/usr/bin/env bash
# Session 4: split K for the step kernel's residual matmuls, folded merge, PTX barrier
# (nvidia-h200-x2, one lane per GPU).
#   PART=sweeps  A: expert_step_bench.py --sweep 4 (split K alone, folded merge alone)
#                B: expert_step_bench.py --sweep 5 (PTX barrier, the levers together)
#   PART=final   A: expert_step_bench.py --sweep 6 (the new defaults against session 3's, twice)
#                B: matrix best (new defaults) vs best without megakernel, then bench best (libero-pi0)
#   PART=bench   A: T(N) of both; B: bench policy mode, shallow6 bench and matrix
#   PART=prefix  A: the prefix attention kernel against SDPA, then T(N) of best vs best without megakernel
#                B: the step kernel's defaults (now with the PTX barrier), then the matrix of both
#   PART=final2  A: bench best (prefix kernel with its fastest tiles) model + policy; B: shallow6, pi05
#   PART=gateup  A: expert_step_bench.py --sweep 7 (split K of gate_up); B: stage breakdown of best
#   PART=next    (not run yet) A: the step kernel with vector K/V loads, sweep 8; B: matrix and bench of best
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=sweeps bash benchmarks/h200_splitk.sh
set -u
source benchmarks/lanes.sh  # $R, lane, and the lever lists $X / $G, $V, $B
case "${PART:-sweeps}" in
sweeps)
  lane A 0 60 <<EOT &
420 python3 benchmarks/expert_step_bench.py --sweep 4 --json $R/kernel_expert_step_sweep4.json
EOT
  lane B 1 60 <<EOT &
420 python3 benchmarks/expert_step_bench.py --sweep 5 --json $R/kernel_expert_step_sweep5.json
EOT
  ;;
final)
  lane A 0 60 <<EOT &
420 python3 benchmarks/expert_step_bench.py --sweep 6 --json $R/kernel_expert_step_sweep6.json
EOT
  lane B 1 30 <<EOT &
300 $V matrix --workload libero-pi0 --variants "best;$G" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-pi0_best_splitk.json
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-splitk_model.json
EOT
  ;;
bench)
  lane A 0 30 <<EOT &
400 $V scaling --workload libero-pi0 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0_best_splitk.json --plot $R/scaling_libero-pi0_best_splitk.png
EOT
  lane B 1 14 <<EOT &
150 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-splitk_policy.json
200 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-splitk_model.json
200 $V matrix --workload libero-shallow6 --variants "best;$G" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-shallow6_best_splitk.json
EOT
  ;;
prefix)
  lane A 0 40 <<EOT &
200 python3 benchmarks/suffix_attention_bench.py --prefix --json $R/kernel_prefix_attention.json
350 $V scaling --workload libero-pi0 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0_best_prefix.json --plot $R/scaling_libero-pi0_best_prefix.png
EOT
  lane B 1 40 <<EOT &
150 python3 benchmarks/expert_step_bench.py --quick --json $R/kernel_expert_step_asm.json
300 $V matrix --workload libero-pi0 --variants "best;$G" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-pi0_best_prefix.json
EOT
  ;;
final2)
  lane A 0 14 <<EOT &
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s4_model.json
150 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s4_policy.json
EOT
  lane B 1 14 <<EOT &
150 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s4_model.json
200 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s4_model.json
EOT
  ;;
gateup)
  lane A 0 40 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 7 --json $R/kernel_expert_step_sweep7.json
EOT
  lane B 1 40 <<EOT &
200 $V breakdown --workload libero-pi0 --levers best --warmup 3 --iters 20 --no-progress --json $R/breakdown_libero-pi0_best-s4.json
EOT
  ;;
next)  # prepared for session 5, not run yet: version 14 (vector K/V loads) and sweep 8
  lane A 0 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py --quick --json $R/kernel_expert_step_vectors.json
300 python3 benchmarks/expert_step_bench.py --sweep 8 --json $R/kernel_expert_step_sweep8.json
EOT
  lane B 1 30 <<EOT &
300 $V matrix --workload libero-pi0 --variants "best;$G" --no-progress --iters 50 --warmup 5 --json $R/matrix_libero-pi0_best_vectors.json
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-vectors_model.json
EOT
  ;;
esac
wait
cat $R/lane_*.log
