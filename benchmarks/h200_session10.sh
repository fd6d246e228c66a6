#!/bin/bash
# Session 10's device calls on nvidia-h200-x2, one single-GPU lane per GPU (lanes.sh).
#   PART=a   A: benchmarks/cluster_probe.cu (session 9's PART=next: gate_up's stream with the
#               activation block read once per cluster of 1, 2 or 4 CTAs and multicast), then
#               sweep 20 for pi0.5 (early_mod_loads, same process)
#            B: the libero-pi0 best bench (this machine's baseline), then session 8's PART=next
#               (kernel tables of the padded and unpadded cache at batch 4 without triton_kernels)
#            (cluster probe: multicast 2-8x slower than each CTA reading its own x; one CTA with a
#            producer warp 5.11 us a layer, 3.29 TB/s. Sweep 20: early_mod_loads 945 / 947 against
#            878 / 879 us. Bench 14.13 ms. Batch 4 kernels: padded cache 35.2 ms, unpadded 41.4)
#   PART=b   the prefix's gate_up GEMM with GELU x up in its epilogue (kernels/geglu_matmul.py):
#            A: the kernel alone against cuBLAS + inductor, every tiling; the call at batch 4
#            B: the call at batch 1 (change_ab.py geglu_kernel), then the kernel sequence of best
#            (the Triton GEMM with pointer loads: 523 TFLOP/s at best against cuBLAS's 709, 139.5 against
#            117 us with inductor's GELU x up kernel; the call 0.972x at batch 1, 0.964x at batch 4)
#   PART=c   the same GEMM persistent with TMA descriptors (and warp specialization): A: the sweep, then
#            the call at batch 1 with its fastest tiling; B: the pi0 step kernel's timeline today
#            (no tiling beat the pointer kernel: 140.7 us at best against 117.8; the call 0.975x with the
#            fastest. The kernel, its op and bench were taken out after this part: parts b and c run at
#            b3ab80e / f639a83 only. Step kernel today: 773.5 us, slots as in session 9)
#   PART=d   A: splitk_probe.py (SigLIP's o_proj / fc2 and Gemma's o / qkv as other cuBLAS formulations)
#            B: phase_probe.cu with each matmul phase alone in the barrier chain
#   PART=e   first calls with cold and with warm compile caches (two processes a lane): libero-pi0 (A),
#            libero-pi05 (B)
#            (first call libero-pi0 27.15 s cold, 5.28 s warm; libero-pi05 28.12 / 5.28 s)
#   PART=f   the same through `--compile-cache DIR`, twice (libero-pi0)
#            (35.12 s, then 5.69 s)
#   PART=g   pi0.5's writers' next-norm scale loaded after the K loop: sweep 21, then the call A/B
#            (sweep 21 ran out of its 120 s after the base row, 878.1 us: each new tiling compiles for
#            ~a minute; the call A/B 1.002x, p10..p90 0.999..1.005: no gain, the option stays off)
#   PART=next  (prepared for session 11, not run) A: benchmarks/mlp_probe.cu; B: cluster_probe.cu with
#            the clusters resident at once printed
# The CUDA C++ phase probe (benchmarks/phase_probe.cu) ran outside the lanes, on nvidia-h200:
#   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/phase_probe benchmarks/phase_probe.cu && /tmp/phase_probe
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session10.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
200 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe benchmarks/cluster_probe.cu && /tmp/cluster_probe | tee $R/cluster_probe.txt
240 python3 benchmarks/expert_step_bench.py --pi05 --sweep 20 --json $R/kernel_expert_step_pi05_sweep20.json
EOT
  lane B 1 20 <<EOT &
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s10_model.json
170 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" > $R/kernels_b4_graph-compile_align8_s10.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align8_s10.txt
170 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers "$X,compile=default" --kv-align 1 > $R/kernels_b4_graph-compile_align1_s10.txt 2>&1; tail -10 $R/kernels_b4_graph-compile_align1_s10.txt
EOT
  ;;
b)
  lane A 0 30 <<EOT &
200 python3 benchmarks/geglu_matmul_bench.py --json $R/kernel_geglu_matmul.json
200 python3 benchmarks/change_ab.py --change geglu_kernel --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_geglu.json
EOT
  lane B 1 20 <<EOT &
260 python3 benchmarks/change_ab.py --change geglu_kernel --rounds 60 --json $R/change_ab_libero-pi0_geglu.json
120 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s10.txt > $R/kernels_best_s10.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s10.txt
EOT
  ;;
c)
  lane A 0 30 <<EOT &
200 python3 benchmarks/geglu_matmul_bench.py --json $R/kernel_geglu_matmul_tma.json
260 python3 benchmarks/change_ab.py --change geglu_kernel --rounds 60 --geglu-config \$(python3 -c "import json; print(','.join(map(str, json.load(open('$R/kernel_geglu_matmul_tma.json'))['rows'][0]['fastest'])))") --json $R/change_ab_libero-pi0_geglu_tma.json
EOT
  lane B 1 20 <<EOT &
300 python3 benchmarks/expert_step_bench.py --quick --timeline --json $R/kernel_expert_step_pi0_s10.json
EOT
  ;;
d)
  lane A 0 40 <<EOT &
300 python3 benchmarks/splitk_probe.py --json $R/splitk_probe.json
EOT
  lane B 1 60 <<EOT &
200 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/phase_probe benchmarks/phase_probe.cu && /tmp/phase_probe | tee $R/phase_probe_phases.txt
EOT
  ;;
e)
  # the first call of a fresh process with cold compile caches, then of a second process that finds
  # the caches the first one wrote (Triton's kernels, inductor's FX graphs): a restarted server's case.
  # Each lane keeps its own caches so the other lane's cannot warm it.
  lane A 0 12 <<EOT &
150 export TRITON_CACHE_DIR=/tmp/cacheA/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cacheA/inductor; $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s10-cold_model.json
150 export TRITON_CACHE_DIR=/tmp/cacheA/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cacheA/inductor; $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s10-warm_model.json
EOT
  lane B 1 12 <<EOT &
150 export TRITON_CACHE_DIR=/tmp/cacheB/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cacheB/inductor; $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s10-cold_model.json
150 export TRITON_CACHE_DIR=/tmp/cacheB/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cacheB/inductor; $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s10-warm_model.json
EOT
  ;;
f)
  # the same through the CLI's --compile-cache (the variables set inside the process, after torch's import)
  lane A 0 12 <<EOT &
150 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/cc $B --json $R/bench_libero-pi0_best-s10-cache1_model.json; du -sh /tmp/cc/triton /tmp/cc/inductor
150 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/cc $B --json $R/bench_libero-pi0_best-s10-cache2_model.json
EOT
  ;;
g)
  # pi0.5's writers load the next norm's scale right after the K loop (scale_after_loop): the kernel
  # in one process (sweep 21), then the whole libero-pi05 call, both sides captured in one process
  lane A 0 30 <<EOT &
120 python3 benchmarks/expert_step_bench.py --pi05 --sweep 21 --json $R/kernel_expert_step_pi05_sweep21.json
170 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "" --new "scale_after_loop=True" --rounds 40 --json $R/step_config_ab_libero-pi05_scale_after_loop.json
EOT
  ;;
next)
  # prepared for session 11, not run: A: mlp_probe.cu (the expert MLP as two barrier-separated phases
  # against one fused phase for clusters of 8 sharing the hidden units through distributed shared
  # memory); B: cluster_probe.cu again, now printing how many clusters are resident at once (does
  # residency explain session 10's 2-8x slower multicast?)
  lane A 0 40 <<EOT &
200 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mlp_probe benchmarks/mlp_probe.cu && /tmp/mlp_probe | tee $R/mlp_probe.txt
EOT
  lane B 1 40 <<EOT &
200 nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe benchmarks/cluster_probe.cu && /tmp/cluster_probe | tee $R/cluster_probe_residency.txt
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
