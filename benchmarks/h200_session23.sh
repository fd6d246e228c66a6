#!/bin/bash
# Session 23's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the prefix's GEMM shapes through every algorithm cuBLASLt's heuristic offers (cublaslt_probe.py), against
#            what best runs; the upload probe with its staging buffer in 2 MB pages against torch's pinned buffer
#   PART=b   part a's probe for the shapes where an algorithm beat torch's, with torch's cuBLASLt workspace at 32 MiB
#            (CUBLASLT_WORKSPACE_SIZE, KiB) and at 1 MiB: whether torch's own pick changes with it
#   PART=c   the whole call with torch's cuBLASLt workspace at 32 MiB against its default: the kernel sequence of one
#            libero-pi0 best call each way, and the bench in four fresh processes, alternating default / 32 MiB
#   PART=d   SigLIP's fc2 through cuBLASLt's first algorithm at 32 MiB of workspace (change_ab.py --change lt_fc2),
#            in one process, interleaved: what part c's two processes a side could not resolve
#   PART=e   the same change in the product (SiglipLayerW.fc2_lt, kernels/cublaslt.py), in one process each: libero-pi0,
#            libero-pi0-b4 (M = 2048) and aloha-pi0 (three images, M = 768); the probe through the product's binding
#   PART=f   closing runs with fc2 through cuBLASLt in best: libero-pi0 best (model mode) and its equivalence check,
#            aloha-pi0 best, each in a fresh process
#   PART=g   part f's check again, after the fix of the race it met (the TF32 switch flipped in the kernel-compile
#            thread while the main thread traced: "GLOBAL_STATE changed: allow_tf32"), and the bench of best with it
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session23.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 60 <<EOT &
200 python3 benchmarks/cublaslt_probe.py --json $R/cublaslt_probe.json
150 python3 benchmarks/upload_probe.py --rounds 100 --json $R/upload_probe_libero-pi0_s23a.json
EOT
  ;;
b)
  lane A 0 60 <<EOT &
100 CUBLASLT_WORKSPACE_SIZE=32768 python3 benchmarks/cublaslt_probe.py --algos 1 --json $R/cublaslt_probe_ws32m.json
100 CUBLASLT_WORKSPACE_SIZE=1024 python3 benchmarks/cublaslt_probe.py --algos 1 --json $R/cublaslt_probe_ws1m.json
100 python3 -c "import torch; print(torch.__version__); print(torch.backends.cuda.preferred_blas_library())"
EOT
  ;;
c)
  lane A 0 40 <<EOT &
150 python3 benchmarks/profile_kernels.py --workload libero-pi0 --levers best --rows 30 --sequence $R/kernel_sequence_best_s23.txt > $R/kernels_best_s23.txt 2>&1; tail -5 $R/kernels_best_s23.txt
150 CUBLASLT_WORKSPACE_SIZE=32768 python3 benchmarks/profile_kernels.py --workload libero-pi0 --levers best --rows 30 --sequence $R/kernel_sequence_best_ws32m_s23.txt > $R/kernels_best_ws32m_s23.txt 2>&1; tail -5 $R/kernels_best_ws32m_s23.txt
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23-ws-default-1_model.json
100 CUBLASLT_WORKSPACE_SIZE=32768 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23-ws32m-1_model.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23-ws-default-2_model.json
100 CUBLASLT_WORKSPACE_SIZE=32768 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23-ws32m-2_model.json
EOT
  ;;
d)
  lane A 0 40 <<EOT &
300 python3 benchmarks/change_ab.py --change lt_fc2 --workload libero-pi0 --rounds 100 --json $R/change_ab_libero-pi0_lt_fc2.json
EOT
  ;;
e)
  lane A 0 40 <<EOT &
60 python3 benchmarks/cublaslt_probe.py --shapes siglip_fc2,siglip_o --json $R/cublaslt_probe_e.json
240 python3 benchmarks/change_ab.py --change lt_fc2 --workload libero-pi0 --rounds 100 --json $R/change_ab_libero-pi0_lt_fc2_product.json
240 python3 benchmarks/change_ab.py --change lt_fc2 --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_lt_fc2.json
240 python3 benchmarks/change_ab.py --change lt_fc2 --workload aloha-pi0 --rounds 60 --json $R/change_ab_aloha-pi0_lt_fc2.json
EOT
  ;;
f)
  lane A 0 40 <<EOT &
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23_model.json
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s23.json
100 $V bench --workload aloha-pi0 --levers best $B --json $R/bench_aloha-pi0_best-s23_model.json
EOT
  ;;
g)
  lane A 0 40 <<EOT &
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s23.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s23g_model.json
EOT
  ;;
esac
finish
