#!/bin/bash
# Session 28's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   float8 (e4m3, row-wise scales) against bf16 on libero-pi0's GEMM shapes: the prefix's (compute-bound)
#            and the expert step's (M = 51, weight-bound), cuBLAS through torch._scaled_mm against F.linear, with the
#            activations' quantization timed apart (benchmarks/fp8_gemm_probe.py)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session28.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 60 <<EOT &
240 python3 benchmarks/fp8_gemm_probe.py --json $R/fp8_gemm_probe.json
EOT
  ;;
esac
finish
