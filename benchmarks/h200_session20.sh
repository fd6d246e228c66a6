#!/bin/bash
# Session 20's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): the batched calls (libero-pi0-b4/-b8),
# whose step runs the layers (not the step kernel) and attends through kernels/suffix_attention.py.
#   PART=a   where libero-pi0-b4's time goes now (kernel table and sequence of `best`), then the step attention's tiles
#            swept at batch 4 and 8 (suffix_attention_bench.py --batch: the partial kernel's tilings and the merge
#            with its head dim in parts)
#   PART=b   libero-pi0-b4's call, each change against the same without it, in one process (change_ab.py): the step's
#            RoPE + cache write as one kernel (step_rope_cache_kernel), its attention written token-major
#            (step_token_major), the merge's head dim in parts (merge_dims)
#   PART=c   libero-pi0-b8 with the key splits capped at one wave (wave_splits), libero-pi0 with merge_dims (the
#            prefix's merge), then the closing benches of b4, b8 and libero-pi0 in fresh processes
#   PART=d   after parts b-c: libero-pi0-b4's kernel table and sequence again, libero-pi0 best in a fresh process, and
#            the equivalence checks of best at batch 1 and 4
#   PART=e   the batch-1 workloads that parts b-d did not bench (libero-pi05, libero-shallow6, aloha-pi0), best, each in
#            a fresh process: their prefixes' merge now runs the head dim in parts
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
190 python3 benchmarks/change_ab.py --change step_rope_cache_kernel --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_step_rope_cache_kernel.json
170 python3 benchmarks/change_ab.py --change step_token_major --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_step_token_major.json
170 python3 benchmarks/change_ab.py --change merge_dims --workload libero-pi0-b4 --rounds 30 --json $R/change_ab_libero-pi0-b4_merge_dims.json
EOT
  ;;
c)
  lane A 0 30 <<EOT &
190 python3 benchmarks/change_ab.py --change wave_splits --workload libero-pi0-b8 --rounds 20 --json $R/change_ab_libero-pi0-b8_wave_splits.json
100 python3 benchmarks/change_ab.py --change merge_dims --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_merge_dims.json
100 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s20_model.json
100 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s20_model.json
EOT
  ;;
d)
  lane A 0 30 <<EOT &
150 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --levers best --rows 30 --sequence $R/kernel_sequence_b4_best_s20d.txt > $R/kernels_b4_best_s20d.txt 2>&1; tail -8 $R/kernels_b4_best_s20d.txt
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s20_model.json
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s20.json
150 $V check --workload libero-pi0-b4 --levers best --seeds 1 --json $R/check_libero-pi0-b4_best_s20.json
EOT
  ;;
e)
  lane A 0 30 <<EOT &
100 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-s20_model.json
100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-s20_model.json
100 $V bench --workload aloha-pi0 --levers best $B --json $R/bench_aloha-pi0_best-s20_model.json
EOT
  ;;
esac
finish
