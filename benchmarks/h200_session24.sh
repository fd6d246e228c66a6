#!/bin/bash
# Session 24's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   SigLIP's fc2 and o and Gemma's down through cuBLASLt, each shape's fastest zero-workspace algorithm timed
#            at its first call (change_ab.py --change lt_fastest), in one process each: libero-pi0, aloha-pi0,
#            libero-pi0-b4; the Gemma prefix's attention with no mask (heads folded into rows, padding keys zeroed,
#            the log-sum-exp correcting the sum) through cuDNN and flash, against the engine's kernel
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session24.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
100 python3 benchmarks/prefix_attention_probe.py --json $R/prefix_attention_probe_s24.json
200 python3 benchmarks/change_ab.py --change lt_fastest --rounds 80 --json $R/change_ab_libero-pi0_lt_fastest.json
200 python3 benchmarks/change_ab.py --change lt_fastest --workload aloha-pi0 --rounds 60 --json $R/change_ab_aloha-pi0_lt_fastest.json
200 python3 benchmarks/change_ab.py --change lt_fastest --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_lt_fastest.json
EOT
  ;;
esac
finish
