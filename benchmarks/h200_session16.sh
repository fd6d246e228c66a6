#!/bin/bash
# Session 16's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   qkv's rotary halves and gate_up's gate and up as one product of twice the width (one_dot, new): sweep 35
#            with timelines for pi0 and for pi0.5 at its 10 rows, then both workloads' calls in one process each
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session16.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
200 python3 benchmarks/expert_step_bench.py --sweep 35 --timeline --no-phases --json $R/kernel_expert_step_sweep35.json | grep -v timeline
200 python3 benchmarks/expert_step_bench.py --pi05 --sweep 35 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep35.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --base "" --new "one_dot=1" --rounds 40 --json $R/step_config_ab_libero-pi0_one_dot.json
80 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "" --new "one_dot=1" --rounds 40 --json $R/step_config_ab_libero-pi05_one_dot.json
EOT
  ;;
esac
finish
