#!/usr/bin/env bash
# Session 6 (nvidia-h200-x2, one lane per GPU).
#   PART=sweeps  A: sweep 11 (as run at 05b9760: qkv split in K, since taken out; attention's value
#                   loads issued with the keys) with timelines, then the step's float32 heads through small_m_matmul ("ieee",
#                   "tf32x3") against cuBLAS; B: sweep 10 (deeper pipelines, atomic polling at 4
#                   stages, wider split tiles for down / o_proj) with timelines
#   PART=final   A: the step's float32 heads through small_m_matmul (tf32x3) against cuBLAS,
#                   interleaved (heads_ab.py); bench best (libero-pi0 model + policy) with the
#                   session's defaults; the step kernel's timeline. B: T(N) of best and best
#                   less megakernel, shallow6, pi05
#   PART=b8      A: libero-pi0-b8, best against best less triton_kernels, interleaved (is the gap
#                   to session 2's 67.4 ms the prefix kernels at batch 8, or the machine?);
#                   B: bench best at batch 4 and 8; the kernel table of best (libero-pi0)
#   PART=prefetch A: sweep 12 (L2 prefetch by the programs idle in qkv; wider o_proj tiles) with
#                   timelines; B: the tf32x3 heads against cuBLAS for libero-shallow6
#   PART=final2  with sweep 12's defaults: A: bench best (libero-pi0), the step kernel's timeline;
#                   B: T(N) of best and best less megakernel, shallow6
#   PART=ab      A: best with session 5's step-kernel tiling against today's, interleaved in one
#                   process (step_config_ab.py)
#   PART=rotate  A: sweep 13 (rotated K loops) with timelines; B: best with k_rotate against
#                   without, interleaved in one process
#   PART=next    (prepared for session 7, not run yet) A: the step kernel's defaults with 20 repeated
#                   launches checked bit for bit; the kernel for 4 samples in one launch (its
#                   first timing); sweep 14 (dataflow waits instead of two barriers a layer);
#                   Nsight Compute's memory sections (L2 hit
#                   rates, sector traffic) and warp states on the step kernel's current defaults:
#                   what its loads wait on; B: libero-pi0-b4, best against best with
#                   megakernel=batched (4 samples a step launch), interleaved and equivalence-checked
#   PART=next2   (prepared) B: T(N) at batch 4 of the same two variants
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=sweeps bash benchmarks/h200_session6.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-sweeps}" in
sweeps)
  lane A 0 60 <<EOT &
480 python3 benchmarks/expert_step_bench.py --sweep 11 --timeline --json $R/kernel_expert_step_sweep11.json
100 python3 benchmarks/small_m_matmul_bench.py --heads --json $R/kernel_small_m_heads.json
EOT
  lane B 1 60 <<EOT &
560 python3 benchmarks/expert_step_bench.py --sweep 10 --timeline --json $R/kernel_expert_step_sweep10.json
EOT
  ;;
final)
  lane A 0 14 <<EOT &
240 python3 benchmarks/heads_ab.py --workload libero-pi0 --json $R/heads_ab_libero-pi0_tf32x3.json
180 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s6_model.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s6_policy.json
100 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_s6.json
EOT
  lane B 1 14 <<EOT &
330 $V scaling --workload libero-pi0 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0_best_s6.json --plot $R/scaling_libero-pi0_best_s6.png
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s6_model.json
120 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s6_model.json
EOT
  ;;
b8)
  lane A 0 30 <<EOT &
400 $V matrix --workload libero-pi0-b8 --variants "best;$X,compile=default" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b8_best.json
EOT
  lane B 1 14 <<EOT &
200 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s6_model.json
200 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s6_model.json
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best > $R/kernels_best_s6.txt 2>&1; tail -8 $R/kernels_best_s6.txt
EOT
  ;;
prefetch)
  lane A 0 60 <<EOT &
420 python3 benchmarks/expert_step_bench.py --sweep 12 --timeline --json $R/kernel_expert_step_sweep12.json
EOT
  lane B 1 14 <<EOT &
240 python3 benchmarks/heads_ab.py --workload libero-shallow6 --json $R/heads_ab_libero-shallow6_tf32x3.json
EOT
  ;;
final2)
  lane A 0 14 <<EOT &
150 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s6b_model.json
100 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_s6b.json
EOT
  lane B 1 14 <<EOT &
200 $V scaling --workload libero-pi0 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0_best_s6b.json --plot $R/scaling_libero-pi0_best_s6b.png
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s6b_model.json
EOT
  ;;
ab)
  lane A 0 14 <<EOT &
280 python3 benchmarks/step_config_ab.py --base "bn_o=16 ks_o=2 bn_down=16 ks_down=2 att_early_v=0 idle_prefetch=0" --json $R/step_config_ab_libero-pi0.json
EOT
  ;;
rotate)
  lane A 0 40 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 13 --timeline --json $R/kernel_expert_step_sweep13.json
EOT
  lane B 1 14 <<EOT &
240 python3 benchmarks/step_config_ab.py --base "" --new "k_rotate=1" --json $R/step_config_ab_libero-pi0_rotate.json
EOT
  ;;
next)  # prepared for session 7, not run yet
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 60 <<EOT &
120 python3 benchmarks/expert_step_bench.py --quick --json $R/kernel_expert_step_s7.json
120 python3 benchmarks/expert_step_bench.py --quick --samples 4 --json $R/kernel_expert_step_b4_s7.json
150 python3 benchmarks/expert_step_bench.py --sweep 14 --timeline --json $R/kernel_expert_step_sweep14.json
300 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats -f -o /tmp/step_mem python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_mem.ncu-rep --page details > $R/step_ncu_memory_s7.txt; tail -60 $R/step_ncu_memory_s7.txt
EOT
  lane B 1 30 <<EOT &
450 $V matrix --workload libero-pi0-b4 --variants "best;$G,megakernel=batched" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_batched_s7.json
EOT
  ;;
next2)  # prepared for session 7, not run yet
  lane B 1 14 <<EOT &
400 $V scaling --workload libero-pi0-b4 --levers "best;$G,megakernel=batched" --no-progress --json $R/scaling_libero-pi0-b4_batched_s7.json --plot $R/scaling_libero-pi0-b4_batched_s7.png
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
