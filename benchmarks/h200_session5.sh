#!/usr/bin/env bash
# Session 5 (nvidia-h200-x2, one lane per GPU).
#   PART=timeline  A: the step kernel as it stands (version 14, vector K/V loads) with its clock
#                     timeline, then sweep 8 (attention tiles, 16 warps), each with a timeline
#                  B: bench best with the reference weights released (the served footprint),
#                     then bench best as before (same process state otherwise)
#   PART=ncu       A: Nsight Compute, full set, on one step-kernel launch (defaults: att_bm 16,
#                     5 key splits), as text (details + the SASS lines with the most stalls)
#                  B: bench best with the new attention tiles; the kernel table of best
#   PART=barrier   A: sweep 9 (one thread polls the barrier; deeper K pipelines) with timelines
#                  B: Nsight Compute again, the stalls by Python source line
#   PART=final     A: bench best (libero-pi0 model + policy, shallow6) with the session's defaults,
#                     the step kernel's timeline; B: T(N) of best and best less megakernel, pi05
#   PART=heads     A: the step's float32 heads through small_m_matmul against cuBLAS, interleaved
#                     (libero-pi0, then shallow6); B: bench best for libero-pi0, shallow6, pi05.
#                     Ran at 55d64b1; no gain (perf-notes, version 17), so the head path and
#                     benchmarks/heads_ab.py were taken out again: this part no longer runs
#   PART=batch     A: bench best at batch 4; B: at batch 8 (the step kernel is batch 1 only, so
#                     their steps run the layer path)
#   PART=next      (prepared for session 6; session 6 runs its parts as h200_session6.sh) A: sweep 10 with timelines;
#                  B: libero-pi0-b8, best against best less triton_kernels, interleaved; the
#                     step's float32 heads through small_m_matmul, "ieee" and "tf32x3", vs cuBLAS
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=timeline bash benchmarks/h200_session5.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-timeline}" in
timeline)
  lane A 0 60 <<EOT &
200 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_v14.json
330 python3 benchmarks/expert_step_bench.py --sweep 8 --timeline --json $R/kernel_expert_step_sweep8.json
EOT
  lane B 1 14 <<EOT &
240 $V bench --workload libero-pi0 --levers best --release-reference $B --json $R/bench_libero-pi0_best-v14-served_model.json
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-v14_model.json
EOT
  ;;
ncu)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 80 <<EOT &
300 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --set full --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page details > $R/step_ncu_details.txt && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source sass | gzip > $R/step_ncu_sass.csv.gz; ls -la $R
EOT
  lane B 1 14 <<EOT &
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-att16_model.json
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best > $R/kernels_best_att16.txt 2>&1; tail -8 $R/kernels_best_att16.txt
EOT
  ;;
barrier)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 60 <<EOT &
330 python3 benchmarks/expert_step_bench.py --sweep 9 --timeline --json $R/kernel_expert_step_sweep9.json
EOT
  lane B 1 30 <<EOT &
300 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --set full --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source cuda,sass | gzip > $R/step_ncu_source.csv.gz; ls -la $R; zcat $R/step_ncu_source.csv.gz | head -c 600
EOT
  ;;
final)
  lane A 0 14 <<EOT &
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s5_model.json
150 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s5_policy.json
150 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s5_model.json
150 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_s5.json
EOT
  lane B 1 14 <<EOT &
380 $V scaling --workload libero-pi0 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0_best_s5.json --plot $R/scaling_libero-pi0_best_s5.png
150 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s5_model.json
EOT
  ;;
heads)
  lane A 0 14 <<EOT &
240 python3 benchmarks/heads_ab.py --workload libero-pi0 --json $R/heads_ab_libero-pi0.json
200 python3 benchmarks/heads_ab.py --workload libero-shallow6 --json $R/heads_ab_libero-shallow6.json
EOT
  lane B 1 14 <<EOT &
200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-heads_model.json
150 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-heads_model.json
150 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-heads_model.json
EOT
  ;;
batch)
  lane A 0 14 <<EOT &
200 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s5_model.json
EOT
  lane B 1 14 <<EOT &
200 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s5_model.json
EOT
  ;;
next)
  lane A 0 60 <<EOT &
450 python3 benchmarks/expert_step_bench.py --sweep 10 --timeline --json $R/kernel_expert_step_sweep10.json
EOT
  lane B 1 30 <<EOT &
400 $V matrix --workload libero-pi0-b8 --variants "best;$X,compile=default" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b8_best.json
150 python3 benchmarks/small_m_matmul_bench.py --heads --json $R/kernel_small_m_heads.json
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
