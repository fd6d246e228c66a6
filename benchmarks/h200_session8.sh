#!/usr/bin/env bash
# Session 8 device runs (nvidia-h200-x2, one lane per GPU), by part:
#   PART=a   A: the batch-4 puzzle (perf notes 22b), side one: the kernel table of best (layers)
#               at batch 4 alone; then prefix_ab.py (now change_ab.py) siglip_gelu_epilogue
#               (SigLIP's fc1 + GELU as one cuBLASLt GEMM with a GELU epilogue, against a GEMM + an
#               inductor kernel): 1.021x
#            B: 22b side two: the same table with the batched engine built, run and checked in
#               the process first; then every kernel of one libero-pi0 best call in launch order
#               (profile_kernels.py --sequence) with inductor's generated code (TORCH_LOGS)
#   PART=b   change_ab.py step_attention_kernel (the step's torch layers attend through the
#            split-key Triton kernel, not cuBLAS's folded matmuls): A at batch 4, then pi0.5;
#            B at batch 8, then call_overhead.py (the call against its graph replay and copies)
#            (b4 1.236x, b8 1.145x, pi0.5 0.999x; call 14.40 ms against its replay alone 14.27)
#   PART=c   A: change_ab.py patch_matmul (SigLIP's patch conv as one float32 matmul), then
#               siglip_sdpa_flash (SDPA's flash kernel first for SigLIP's attention)
#            B: batch 4 and batch 8 benches of best with the step attention kernel
#            (patch 1.0047x, kept; flash 0.9996x, taken out; b4 34.34 ms, b8 60.96 ms)
#   PART=d   the closing figures: A: libero-pi0 best bench (model, policy), call_overhead.py
#            (now also one _foreach_copy_); B: libero-shallow6 and libero-pi05 benches, T(N)
#            (14.42 ms; policy 15.04; shallow6 6.18; pi05 17.44; T(N) 6.400 + 0.797 N)
#   PART=e   22b again, now that the layers attend through the kernel: A: session 7's matrix
#            (best against the batched step kernel, reference interleaved) at batch 4;
#            B: the kernel table of best at batch 4
#            (matrix: best 33.67 ms against 38.56 for the batched kernel; 33.0 ms of kernels)
#   PART=f   A: change_ab.py siglip_attention_kernel (SigLIP's attention through the split-key
#               kernel, triton_kernels, against SDPA/cuDNN)
#            B: the kernel sequence of best with it
#            (0.986x: the kernel took 17.4 us a layer, against cuDNN's 7.4)
#   PART=g   the vision kernel's tiles swept against SDPA on SigLIP's shape
#            (suffix_attention_bench.py --vision), then the fastest in the whole call, A/B
#            (fastest 12.3 us against SDPA's 9.1; whole call 0.999x. The vision kernel, --vision
#            and --vision-tiles-from were taken out after this run: parts f and g ran at 0ccbea4
#            and 8a3233d)
#   PART=h   change_ab.py kv_align (the static cache padded to a multiple of 8 keys) on the
#            path without triton_kernels (graph + compile): A at batch 1, B at batch 4
#            (batch 1 1.143x; batch 4 0.952x)
#   PART=next  (prepared for session 9, not run) why the padded cache is slower at batch 4 on the
#              path without triton_kernels: the kernel tables with KV_ALIGN 8 and 1
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session8.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best > $R/kernels_b4_layers_alone_s8.txt 2>&1; tail -10 $R/kernels_b4_layers_alone_s8.txt
240 python3 benchmarks/prefix_ab.py --change siglip_gelu_epilogue --json $R/prefix_ab_libero-pi0_gelu_epilogue.json
EOT
  lane B 1 20 <<EOT &
300 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best --also "$G,megakernel=batched" > $R/kernels_b4_layers_beside_batched_s8.txt 2>&1; tail -10 $R/kernels_b4_layers_beside_batched_s8.txt
200 TORCH_LOGS=output_code python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 60 --levers best --sequence $R/kernel_sequence_best_s8.txt > $R/kernels_best_output_code_s8.txt 2>&1; grep -A12 "^per call" $R/kernels_best_output_code_s8.txt; tail -1 $R/kernel_sequence_best_s8.txt
EOT
  ;;
b)
  lane A 0 20 <<EOT &
280 python3 benchmarks/change_ab.py --change step_attention_kernel --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_step_attention.json
200 python3 benchmarks/change_ab.py --change step_attention_kernel --workload libero-pi05 --json $R/change_ab_libero-pi05_step_attention.json
EOT
  lane B 1 20 <<EOT &
330 python3 benchmarks/change_ab.py --change step_attention_kernel --workload libero-pi0-b8 --rounds 30 --json $R/change_ab_libero-pi0-b8_step_attention.json
150 python3 benchmarks/call_overhead.py --workload libero-pi0 --json $R/call_overhead_libero-pi0.json
EOT
  ;;
c)
  lane A 0 20 <<EOT &
220 python3 benchmarks/change_ab.py --change patch_matmul --json $R/change_ab_libero-pi0_patch_matmul.json
220 python3 benchmarks/change_ab.py --change siglip_sdpa_flash --json $R/change_ab_libero-pi0_siglip_sdpa_flash.json
EOT
  lane B 1 20 <<EOT &
200 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s8_model.json
240 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s8_model.json
EOT
  ;;
d)
  lane A 0 20 <<EOT &
150 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s8_model.json
150 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s8_policy.json
150 python3 benchmarks/call_overhead.py --workload libero-pi0 --json $R/call_overhead_libero-pi0_foreach.json
EOT
  lane B 1 20 <<EOT &
120 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s8_model.json
150 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s8_model.json
220 $V scaling --workload libero-pi0 --levers best --no-progress --json $R/scaling_libero-pi0_best_s8.json --plot $R/scaling_libero-pi0_best_s8.png
EOT
  ;;
e)
  lane A 0 20 <<EOT &
330 $V matrix --workload libero-pi0-b4 --variants "best;$G,megakernel=batched" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_batched_s8.json
EOT
  lane B 1 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best > $R/kernels_b4_best_s8.txt 2>&1; tail -10 $R/kernels_b4_best_s8.txt
EOT
  ;;
f)
  lane A 0 20 <<EOT &
220 python3 benchmarks/change_ab.py --change siglip_attention_kernel --json $R/change_ab_libero-pi0_siglip_attention.json
EOT
  lane B 1 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s8f.txt > $R/kernels_best_s8f.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s8f.txt; grep -m3 "_partial_kernel" $R/kernel_sequence_best_s8f.txt; tail -1 $R/kernel_sequence_best_s8f.txt
EOT
  ;;
g)
  lane A 0 30 <<EOT &
200 python3 benchmarks/suffix_attention_bench.py --vision --json $R/kernel_vision_attention.json
240 python3 benchmarks/change_ab.py --change siglip_attention_kernel --json $R/change_ab_libero-pi0_siglip_attention_tuned.json --vision-tiles-from $R/kernel_vision_attention.json
EOT
  ;;
h)
  lane A 0 20 <<EOT &
240 python3 benchmarks/change_ab.py --change kv_align --levers "$X,compile=default" --rounds 40 --json $R/change_ab_libero-pi0_kv_align_graph-compile.json
EOT
  lane B 1 20 <<EOT &
240 python3 benchmarks/change_ab.py --change kv_align --levers "$X,compile=default" --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_kv_align_graph-compile.json
EOT
  ;;
next)
  lane A 0 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" > $R/kernels_b4_graph-compile_align8_s9.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align8_s9.txt
EOT
  lane B 1 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" --kv-align 1 > $R/kernels_b4_graph-compile_align1_s9.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align1_s9.txt
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
