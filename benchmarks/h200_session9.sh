#!/usr/bin/env bash
# Session 9 device runs (nvidia-h200-x2, one lane per GPU), by part:
#   PART=a   A: change_ab.py rope_cache_kernel (the prefix's RoPE + static-cache write as one
#               kernel a layer, kernels/rope_qkv.py) at batch 1, then at batch 4
#            B: the step kernel with prefetch_own (each program asks L2 for its own next
#               matmul task's weights before the barrier): sweep 17 with timelines, then the
#               whole call A/B (step_config_ab.py)
#            (rope kernel: batch 1 1.0208x, batch 4 1.0224x; prefetch_own, then a bool (= 15 today):
#            773 -> 794 us a step, the call 0.979x)
#   PART=b   A: the kernel sequence of best with the rope kernel (is the cache written in place?),
#               then sweep 18 (prefetch_own without gate_up's weights, and subsets)
#            B: gemm_probe.py (the prefix's GEMM shapes: cuBLAS against inductor's max-autotune)
#            (the cache write is in place: one 3.5 us rope kernel a layer; sweep 18 within 0.3% of the
#            defaults; max-autotune's Triton templates beat cuBLAS on none of the eight shapes)
#   PART=c   A: change_ab.py step_kernel on libero-pi05 (pi0.5's step through the step kernel, its
#               adaptive norms as a per-step table, against the layers), then the libero-pi0 bench
#            B: expert_step_bench.py --pi05 (the kernel alone on pi0.5's shapes: persistent launch
#               bit for bit against per-phase launches, accuracy against float32), then the
#               libero-pi05 bench
#            (at 622b1ff, the first pi0.5 kernel, which scaled the activations inside the K loops: 1241 us
#            a step against pi0's 773, the call 0.946x the layers; files renamed *_first.json.
#            libero-pi0 best bench 13.86 ms)
#   PART=d   the pi0.5 kernel again, its activations scaled by the phase before (xm, ssq partials):
#            A: expert_step_bench.py --pi05, change_ab.py step_kernel on libero-pi05, the pi05 bench
#            B: the closing figures: shallow6, policy mode, batch 4 and 8
#            (kernel 893 us a step for pi0.5, bit-exact; the call 1.101x the layers; libero-pi05 15.18 ms;
#            shallow6 6.02; libero-pi0 policy 14.21; b4 33.26 (power cap); b8 60.23 (power cap))
#   PART=e   A: T(N) of libero-pi0 best
#            B: the step kernel for pi0 and for pi0.5 back to back on one GPU (what the adaptive
#               norms cost the kernel), then T(N) of libero-pi05 best
#            (T(N) pi0 6.017 + 0.794 N, pi0.5 5.971 + 0.913 N; kernel pi0 771 us, pi0.5 898 us, but every
#            pi0.5 phase alone ~25 us slower, the barriers alone too: the launcher's six torch ops for
#            the first layer's xm and ssq)
#   PART=f   those six ops as one Triton launch (_mod_prologue_kernel): A: expert_step_bench.py
#            --pi05, then change_ab.py step_kernel on libero-pi05; B: the libero-pi05 bench
#            (kernel 879 us a step, bit-exact, every phase alone ~15 us faster than in part e; the call
#            1.114x the layers; libero-pi05 15.00 ms)
#   PART=g   the epilogues' loads before the K loops (StepKernelConfig.early_loads): A: sweep 19
#            for pi0 and for pi0.5 (same process each: early against late, twice); B: the libero-pi0
#            and libero-pi05 benches
#            (both sweeps hit their 100 s limit after the base row: pi0 765.4 us, pi0.5 956.9 us with
#            early loads, against 771-773 and 879 in earlier processes; libero-pi0 13.89 ms, libero-pi05
#            15.25 against 15.00 in part f. No gain shown, pi0.5 likely slower: early_loads was taken
#            out again (the code is part f's), and sweep 19 with it)
#   PART=next  (prepared for session 10, not run) A: benchmarks/cluster_probe.cu, gate_up's stream with
#              the activation block read once per cluster of 1, 2 or 4 CTAs and multicast (compiled here
#              for sm_90a with nvcc 13.0: 48-59 registers, no spills), then sweep 20 for pi0.5
#              (early_mod_loads: its epilogues' extra loads before the K loops, same process);
#              B: session 8's PART=next (the kernel tables of the padded and unpadded cache at
#              batch 4 without triton_kernels)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session9.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 20 <<EOT &
240 python3 benchmarks/change_ab.py --change rope_cache_kernel --rounds 60 --json $R/change_ab_libero-pi0_rope_cache.json
280 python3 benchmarks/change_ab.py --change rope_cache_kernel --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_rope_cache.json
EOT
  lane B 1 30 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 17 --timeline --json $R/kernel_expert_step_sweep17.json
260 python3 benchmarks/step_config_ab.py --base "" --new "prefetch_own=1" --json $R/step_config_ab_libero-pi0_prefetch_own.json
EOT
  ;;
b)
  lane A 0 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s9.txt > $R/kernels_best_s9.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s9.txt; tail -1 $R/kernel_sequence_best_s9.txt
240 python3 benchmarks/expert_step_bench.py --sweep 18 --timeline --json $R/kernel_expert_step_sweep18.json
EOT
  lane B 1 40 <<EOT &
500 python3 benchmarks/gemm_probe.py --json $R/gemm_probe.json
EOT
  ;;
c)
  lane A 0 20 <<EOT &
280 python3 benchmarks/change_ab.py --change step_kernel --workload libero-pi05 --rounds 40 --json $R/change_ab_libero-pi05_step_kernel.json
150 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s9_model.json
EOT
  lane B 1 20 <<EOT &
200 python3 benchmarks/expert_step_bench.py --pi05 --quick --timeline --json $R/kernel_expert_step_pi05.json
200 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s9_model.json
EOT
  ;;
d)
  lane A 0 20 <<EOT &
150 python3 benchmarks/expert_step_bench.py --pi05 --quick --timeline --json $R/kernel_expert_step_pi05.json
200 python3 benchmarks/change_ab.py --change step_kernel --workload libero-pi05 --rounds 40 --json $R/change_ab_libero-pi05_step_kernel.json
150 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s9_model.json
EOT
  lane B 1 20 <<EOT &
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s9_model.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s9_policy.json
120 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s9_model.json
150 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s9_model.json
EOT
  ;;
e)
  lane A 0 20 <<EOT &
260 $V scaling --workload libero-pi0 --levers best --no-progress --json $R/scaling_libero-pi0_best_s9.json --plot $R/scaling_libero-pi0_best_s9.png
EOT
  lane B 1 20 <<EOT &
120 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_pi0_s9e.json
120 python3 benchmarks/expert_step_bench.py --pi05 --quick --timeline --json $R/kernel_expert_step_pi05_s9e.json
260 $V scaling --workload libero-pi05 --levers best --no-progress --json $R/scaling_libero-pi05_best_s9.json --plot $R/scaling_libero-pi05_best_s9.png
EOT
  ;;
f)
  lane A 0 20 <<EOT &
120 python3 benchmarks/expert_step_bench.py --pi05 --quick --timeline --json $R/kernel_expert_step_pi05_s9f.json
200 python3 benchmarks/change_ab.py --change step_kernel --workload libero-pi05 --rounds 40 --json $R/change_ab_libero-pi05_step_kernel_s9f.json
EOT
  lane B 1 20 <<EOT &
150 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s9f_model.json
EOT
  ;;
g)
  lane A 0 20 <<EOT &
100 python3 benchmarks/expert_step_bench.py --sweep 19 --json $R/kernel_expert_step_sweep19.json
100 python3 benchmarks/expert_step_bench.py --pi05 --sweep 19 --json $R/kernel_expert_step_pi05_sweep19.json
EOT
  lane B 1 20 <<EOT &
80 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s9g_model.json
80 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s9g_model.json
EOT
  ;;
next)
  lane A 0 40 <<EOT &
200 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe benchmarks/cluster_probe.cu && /tmp/cluster_probe | tee $R/cluster_probe.txt
240 python3 benchmarks/expert_step_bench.py --pi05 --sweep 20 --json $R/kernel_expert_step_pi05_sweep20.json
EOT
  lane B 1 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" > $R/kernels_b4_graph-compile_align8_s10.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align8_s10.txt
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" --kv-align 1 > $R/kernels_b4_graph-compile_align1_s10.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align1_s10.txt
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
