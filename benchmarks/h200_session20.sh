#!/bin/bash
# Session 20's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): the batched calls (libero-pi0-b4/-b8),
# whose step runs the layers (not the step kernel) and attends through kernels/suffix_attention.py.
#   PART=a   where libero-pi0-b4's time goes now (kernel table and sequence of `best`), then the step attention's tiles
#            swept at batch 4 and 8 (suffix_attention_bench.py --batch: the partial kernel's tilings and the merge
#            with its head dim in parts)
#   PART=b   the whole call, in one process each: the merge's head-dim split (merge_dims) at batch 4 and 1, and each
#            batch's fastest tiles from part a (step_tiles --tiles-from; part a's JSONs must be in $R, copied from the
#            committed results into benchmarks/results/h200 and passed by path)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session20.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
S=benchmarks/results/h200
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
150 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --levers best --rows 30 --sequence $R/kernel_sequence_b4_best_s20.txt > $R/kernels_b4_best_s20.txt 2>&1; tail -8 $R/kernels_b4_best_s20.txt
200 python3 benchmarks/suffix_attention_bench.py --batch 4 --json $R/kernel_suffix_attention_b4.json
200 python3 benchmarks/suffix_attention_bench.py --batch 8 --json $R/kernel_suffix_attention_b8.json
EOT
  ;;
b)
  lane A 0 30 <<EOT &
170 python3 benchmarks/change_ab.py --change merge_dims --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_merge_dims.json
170 python3 benchmarks/change_ab.py --change step_tiles --workload libero-pi0-b4 --tiles-from $S/kernel_suffix_attention_b4.json --rounds 30 --json $R/change_ab_libero-pi0-b4_step_tiles.json
170 python3 benchmarks/change_ab.py --change step_tiles --workload libero-pi0-b8 --tiles-from $S/kernel_suffix_attention_b8.json --rounds 20 --json $R/change_ab_libero-pi0-b8_step_tiles.json
90 python3 benchmarks/change_ab.py --change merge_dims --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_merge_dims.json
EOT
  ;;
esac
finish
