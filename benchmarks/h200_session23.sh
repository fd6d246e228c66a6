#!/bin/bash
# Session 23's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the prefix's GEMM shapes through every algorithm cuBLASLt's heuristic offers (cublaslt_probe.py), against
#            what best runs; the upload probe with its staging buffer in 2 MB pages against torch's pinned buffer
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
esac
finish
