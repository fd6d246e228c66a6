#!/bin/bash
# Session 15's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   pi0's norm statistics in qkv's and gate_up's K loops: summed on the tensor cores (ssq_mma, session
#            14's, at 64-deep K blocks and at 128), those K blocks alone, and summed within each thread
#            (ssq_local, new): sweep 32 with timelines, then both in the call
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session15.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
360 python3 benchmarks/expert_step_bench.py --sweep 32 --timeline --no-phases --json $R/kernel_expert_step_sweep32.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_mma=1 bk_qkv=64 bk_gu=64" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_mma.json
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_local=1" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_local.json
EOT
  ;;
esac
finish
