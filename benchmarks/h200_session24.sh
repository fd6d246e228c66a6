#!/bin/bash
# Session 24's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   SigLIP's fc2 and o and Gemma's down through cuBLASLt, each shape's fastest zero-workspace algorithm timed
#            at its first call (change_ab.py --change lt_fastest), in one process each: libero-pi0, aloha-pi0,
#            libero-pi0-b4; the Gemma prefix's attention with no mask (heads folded into rows, padding keys zeroed,
#            the log-sum-exp correcting the sum) through cuDNN and flash, against the engine's kernel (run at 1ea7fbf;
#            change_ab.py's lt_fastest is taken out since: version 106)
#   PART=b   closing runs after the session's API changes (calls take turns under a lock, sample_actions checks its
#            arguments): one engine from two threads (engine_threads_check.py), the check of best, and the bench of best
#            in model and policy mode, each in a fresh process
#   PART=c   after the QA fixes (checkpoint loads, input checks of both model families): api_smoke.py (pi0 policy
#            through best in bf16, a load with engines built before and after it, the world-action policy's float32
#            noise beside its bf16 observation), the world-action check of graph, and the closing bench of best
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
b)
  lane A 0 40 <<EOT &
120 python3 benchmarks/engine_threads_check.py --workload libero-pi0 --levers best
150 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s24.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s24_model.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s24_policy.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
200 python3 benchmarks/api_smoke.py
150 $V check --workload wam-761 --levers graph --sparsity none --seeds 1 --json $R/check_wam-761_graph_s24.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s24c_model.json
EOT
  ;;
esac
finish
