#!/bin/bash
# Session 13's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the step kernel's norm statistics and loads: pi0's sweep 23 (statistics from o_proj's and
#            down's writers instead of squared in qkv's and gate_up's K loops, loaded ahead of the loops;
#            256-deep K blocks for qkv and gate_up) and pi0.5's sweep 22 (the modulation table prefetched
#            by the programs idle in qkv; statistics and biases loaded ahead), each with timelines; then
#            the whole call, both sides in one process, for the candidate of each
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session13.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
200 python3 benchmarks/expert_step_bench.py --sweep 23 --timeline --no-phases --json $R/kernel_expert_step_sweep23.json | grep -v timeline
200 python3 benchmarks/expert_step_bench.py --pi05 --sweep 22 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep22.json | grep -v timeline
130 python3 benchmarks/step_config_ab.py --base "" --new "ssq_from_writers=1 stats_ahead=1" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_writers.json
130 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "" --new "mod_prefetch=1 stats_ahead=1" --rounds 40 --json $R/step_config_ab_libero-pi05_stats_ahead.json
EOT
  ;;
esac
finish
