#!/bin/bash
# Session 11's device calls on nvidia-h200-x2, one single-GPU lane per GPU (lanes.sh).
#   PART=a   A: benchmarks/mlp_probe.cu (session 10's PART=next: the expert MLP as two barrier-separated
#               phases against one fused phase for clusters of 8), then where libero-pi0 best's first
#               call goes, cold and warm (first_call.py, its own cache directory)
#            B: cluster_probe.cu with the clusters resident at once printed, then the first call of the
#               same levers without compile (graph + the kernels), cold and warm
#   PART=b   compile_layers (the prefix compiled layer block by layer block): A: first calls cold and warm
#            (first_call.py), then best against best + compile_layers in one process (matrix)
#            B: libero-pi05's first calls with compile_layers, cold and warm
#   PART=c   the denoise loop with one launch between steps (kernels/denoise_loop.py): A: the call A/B in one
#            process, libero-pi0 then libero-pi05 (change_ab.py fused_loop); the kernel sequence of best
#            B: libero-pi0 best bench with empty compile caches (best then had compile_layers and the loop)
#            (0.982x and 0.970x: the kernel between steps took 59.8 us against the ~37 us of small kernels it
#            replaced; bench 14.28 ms, kept as bench_libero-pi0_best-fused-loop-s11_model.json)
#   PART=d   the between-steps kernel alone, every tiling (between_steps_bench.py), then the call A/B with
#            its fastest tiling, libero-pi0 and libero-pi05
#            (the default tiling was the fastest, 58.2 us; the call 0.985x / 0.967x. The loop, its kernel and
#            bench were taken out after this part: parts c and d run at ac42366 / 38a4931 only)
#   PART=e   best as it now resolves (compile_layers) on every batch-1 workload, each bench in a fresh process
#            with empty compile caches (its first call is a cold start); then the cumulative table of libero-pi0
#   PART=f   compile_layers with zeros pending for the first layer (one graph a block): libero-pi0 best's
#            first call cold and warm, then best against the whole-prefix compile in one process
#   PART=g   our Triton kernels compiled in a thread while torch.compile traces the first call
#            (Engine._precompile_kernels): first calls cold and warm, libero-pi0 and libero-pi05
#   PART=h   the closing figures: libero-pi0 best bench with empty compile caches, then its equivalence on the GPU
# On nvidia-h200 (one GPU) ONE_GPU=1 runs lane B after lane A, both on GPU 0.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session11.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
K=$X,triton_kernels,megakernel  # best less compile
GPU_B=1; [ "${ONE_GPU:-0}" = 1 ] && GPU_B=0
after_a() { [ "${ONE_GPU:-0}" = 1 ] && wait; }  # one GPU: lane B waits for lane A
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
90 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mlp_probe benchmarks/mlp_probe.cu && /tmp/mlp_probe | tee $R/mlp_probe.txt
120 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcA --json $R/first_call_libero-pi0_best_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcA --json $R/first_call_libero-pi0_best_warm.json
EOT
  after_a
  lane B $GPU_B 40 <<EOT &
90 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe benchmarks/cluster_probe.cu && /tmp/cluster_probe | tee $R/cluster_probe_residency.txt
120 python3 benchmarks/first_call.py --workload libero-pi0 --levers $K --compile-cache /tmp/fcB --json $R/first_call_libero-pi0_kernels-graph_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi0 --levers $K --compile-cache /tmp/fcB --json $R/first_call_libero-pi0_kernels-graph_warm.json
EOT
  ;;
b)
  L=$X,compile=default,compile_layers,triton_kernels,megakernel  # best + compile_layers
  lane A 0 40 <<EOT &
120 python3 benchmarks/first_call.py --workload libero-pi0 --levers $L --compile-cache /tmp/fcC --json $R/first_call_libero-pi0_best-layers_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi0 --levers $L --compile-cache /tmp/fcC --json $R/first_call_libero-pi0_best-layers_warm.json
240 $V matrix --workload libero-pi0 --variants "best;$L" --iters 40 --warmup 5 --no-progress --json $R/matrix_libero-pi0_compile_layers.json
EOT
  after_a
  lane B $GPU_B 40 <<EOT &
120 python3 benchmarks/first_call.py --workload libero-pi05 --levers $L --compile-cache /tmp/fcD --json $R/first_call_libero-pi05_best-layers_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi05 --levers $L --compile-cache /tmp/fcD --json $R/first_call_libero-pi05_best-layers_warm.json
EOT
  ;;
c)
  lane A 0 30 <<EOT &
200 python3 benchmarks/change_ab.py --change fused_loop --rounds 60 --json $R/change_ab_libero-pi0_fused_loop.json
150 python3 benchmarks/change_ab.py --change fused_loop --workload libero-pi05 --rounds 40 --json $R/change_ab_libero-pi05_fused_loop.json
100 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s11.txt > $R/kernels_best_s11.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s11.txt
EOT
  after_a
  lane B $GPU_B 20 <<EOT &
120 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcE $B --json $R/bench_libero-pi0_best-s11_model.json
EOT
  ;;
d)
  lane A 0 30 <<EOT &
240 python3 benchmarks/between_steps_bench.py --json $R/kernel_between_steps.json | tail -3
150 python3 benchmarks/change_ab.py --change fused_loop --rounds 60 --between-config $R/kernel_between_steps.json --json $R/change_ab_libero-pi0_fused_loop_tuned.json
150 python3 benchmarks/change_ab.py --change fused_loop --workload libero-pi05 --rounds 40 --between-config $R/kernel_between_steps.json --json $R/change_ab_libero-pi05_fused_loop_tuned.json
EOT
  ;;
e)
  lane A 0 30 <<EOT &
100 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcF $B --json $R/bench_libero-pi0_best-s11_model.json
100 $V bench --workload libero-pi05 --levers best --compile-cache /tmp/fcG $B --json $R/bench_libero-pi05_best-s11_model.json
100 $V bench --workload libero-shallow6 --levers best --compile-cache /tmp/fcH $B --json $R/bench_libero-shallow6_best-s11_model.json
260 $V matrix --workload libero-pi0 --variants cumulative --iters 30 --warmup 5 --no-progress --json $R/matrix_libero-pi0_cumulative_s11.json
EOT
  ;;
f)
  lane A 0 30 <<EOT &
100 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcI --json $R/first_call_libero-pi0_best-layers1_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcI --json $R/first_call_libero-pi0_best-layers1_warm.json
200 $V matrix --workload libero-pi0 --variants "best;$X,compile=default,triton_kernels,megakernel" --iters 40 --warmup 5 --no-progress --json $R/matrix_libero-pi0_compile_layers1.json
EOT
  ;;
g)
  lane A 0 30 <<EOT &
100 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcJ --json $R/first_call_libero-pi0_best-precompile_cold.json
60 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcJ --json $R/first_call_libero-pi0_best-precompile_warm.json
100 python3 benchmarks/first_call.py --workload libero-pi05 --levers best --compile-cache /tmp/fcK --json $R/first_call_libero-pi05_best-precompile_cold.json
EOT
  ;;
h)
  lane A 0 30 <<EOT &
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcL $B --json $R/bench_libero-pi0_best-s11b_model.json
80 $V check --workload libero-pi0 --levers best --seeds 2 --compile-cache /tmp/fcL --json $R/check_libero-pi0_best_s11.json
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
