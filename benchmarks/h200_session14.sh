#!/bin/bash
# Session 14's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   qkv as 128 tasks of 10 rotary pairs (qkv_pairs: the per-slot tiling gives 80 tasks for 132
#            programs) in the whole call for pi0 and pi0.5, rope_ahead (session 13's, never timed) in pi0's
#            call, then pi0's kernel with both (sweep 28, with timelines)
#   PART=b   pi0.5's kernel on the arguments its call launches (--from-engine), then at its 10 rows with
#            qkv_pairs, attention splits, warps and mod_prefetch (sweep 29)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session14.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --base "" --new "qkv_pairs=10" --rounds 40 --json $R/step_config_ab_libero-pi0_qkv_pairs.json
80 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "" --new "qkv_pairs=10" --rounds 40 --json $R/step_config_ab_libero-pi05_qkv_pairs.json
80 python3 benchmarks/step_config_ab.py --base "" --new "rope_ahead=1" --rounds 40 --json $R/step_config_ab_libero-pi0_rope_ahead.json
270 python3 benchmarks/expert_step_bench.py --sweep 28 --timeline --no-phases --json $R/kernel_expert_step_sweep28.json | grep -v timeline
EOT
  ;;
b)
  lane A 0 30 <<EOT &
120 python3 benchmarks/expert_step_bench.py --from-engine libero-pi05 --quick --timeline --no-phases --json $R/kernel_expert_step_pi05_from_engine.json | grep -v timeline
420 python3 benchmarks/expert_step_bench.py --pi05 --sweep 29 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep29.json | grep -v timeline
EOT
  ;;
esac
finish
