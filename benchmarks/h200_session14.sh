#!/bin/bash
# Session 14's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   qkv as 128 tasks of 10 rotary pairs (qkv_pairs: the per-slot tiling gives 80 tasks for 132
#            programs) in the whole call for pi0 and pi0.5, rope_ahead (session 13's, never timed) in pi0's
#            call, then pi0's kernel with both (sweep 28, with timelines)
#   PART=b   qkv_pairs and rope_ahead together in pi0's call; rope_ahead in pi0.5's; pi0.5's kernel at its
#            10 rows around its new defaults (sweep 29: without qkv_pairs, attention splits, warps)
#   PART=c   pi0.5's fitted 10 key splits in its call; the closing benches and checks of libero-pi0 and
#            libero-pi05
#   PART=e   libero-shallow6's bench and check; the kernel tables of libero-pi0's and libero-pi05's calls
#   PART=f   pi0's merge in 64-dim chunks (one round of tasks): sweep 31 and the call
#   PART=g   libero-pi0's closing bench and check with the merge chunks fitted
#   PART=next (not run here; session 15's h200_session15.sh PART=a ran it with ssq_local) ssq_mma: sweep 32 and the call
#   PART=d   pi0.5's kernel on the arguments its call launches (--from-engine); sweep 30 (merge chunks,
#            mod_prefetch at pi0.5's 10 rows and 10 splits)
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
  # (part a: pi0's call 0.996x with qkv_pairs, 1.0056x with rope_ahead; pi0.5's 1.0065x with qkv_pairs. Now
  # rope_ahead is on and pi0.5's kernel had qkv_pairs=10 by default, at a47d7f5) both for pi0 in the call; rope_ahead
  # for pi0.5 in the call (its kernel was not timed with it); then pi0.5's kernel around its defaults (sweep 29)
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --base "" --new "qkv_pairs=10" --rounds 40 --json $R/step_config_ab_libero-pi0_qkv_pairs_rope_ahead.json
80 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "rope_ahead=0" --new "" --rounds 40 --json $R/step_config_ab_libero-pi05_rope_ahead.json
340 python3 benchmarks/expert_step_bench.py --pi05 --sweep 29 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep29.json | grep -v timeline
EOT
  ;;
c)
  # (part b: pi0's call 1.0058x with qkv_pairs on top of rope_ahead; pi0.5's 1.0089x with rope_ahead; pi0.5's
  # kernel 614 against 663 us a step with 10 key splits. Now fit_config resolves both for the launch's shape:
  # 10 pairs a qkv task, 5 splits at pi0's 51 rows, 10 at pi0.5's 10) the 10 splits in pi0.5's call, then the
  # closing benches at the session's defaults, each in a fresh process with empty caches, and their checks
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "splits=5" --new "" --rounds 40 --json $R/step_config_ab_libero-pi05_splits.json
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcA $B --json $R/bench_libero-pi0_best-s14_model.json
80 $V bench --workload libero-pi05 --levers best --compile-cache /tmp/fcB $B --json $R/bench_libero-pi05_best-s14_model.json
110 $V check --workload libero-pi05 --levers best --seeds 2 --compile-cache /tmp/fcB --json $R/check_libero-pi05_best_s14.json
110 $V check --workload libero-pi0 --levers best --seeds 2 --compile-cache /tmp/fcA --json $R/check_libero-pi0_best_s14.json
EOT
  ;;
d)
  # pi0.5's kernel on the arguments its call launches (--from-engine): does the bench give the call's step?
  lane A 0 30 <<EOT &
120 python3 benchmarks/expert_step_bench.py --from-engine libero-pi05 --quick --timeline --no-phases --json $R/kernel_expert_step_pi05_from_engine.json | grep -v timeline
230 python3 benchmarks/expert_step_bench.py --pi05 --sweep 30 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep30.json | grep -v timeline
EOT
  ;;
e)
  # libero-shallow6 at the session's defaults (its 6-layer expert runs the step kernel: 51 rows, fitted as pi0's),
  # and the kernels of both calls
  lane A 0 30 <<EOT &
80 $V bench --workload libero-shallow6 --levers best --compile-cache /tmp/fcE $B --json $R/bench_libero-shallow6_best-s14_model.json
100 $V check --workload libero-shallow6 --levers best --seeds 2 --compile-cache /tmp/fcE --json $R/check_libero-shallow6_best_s14.json
100 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s14.txt > $R/kernels_best_s14.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s14.txt
100 python3 benchmarks/profile_kernels.py --workload libero-pi05 --rows 40 --levers best --sequence $R/kernel_sequence_best_pi05_s14.txt > $R/kernels_best_pi05_s14.txt 2>&1; grep -A12 "^per call" $R/kernels_best_pi05_s14.txt
EOT
  ;;
f)
  # pi0's merge in one round of tasks: 64-dim chunks (sweep 31), then in the call
  lane A 0 30 <<EOT &
150 python3 benchmarks/expert_step_bench.py --sweep 31 --timeline --no-phases --json $R/kernel_expert_step_sweep31.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --base "" --new "merge_bd=64" --rounds 40 --json $R/step_config_ab_libero-pi0_merge_bd64.json
EOT
  ;;
g)
  # (part f: pi0's kernel 746.4 against 756.1 us a step with 64-dim merge chunks, the call 1.0092x; now fitted:
  # merge_bd=0) libero-pi0's closing bench and check at the session's last defaults
  lane A 0 30 <<EOT &
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcA $B --json $R/bench_libero-pi0_best-s14g_model.json
80 $V check --workload libero-pi0 --levers best --seeds 2 --compile-cache /tmp/fcA --json $R/check_libero-pi0_best_s14g.json
EOT
  ;;
next)
  # prepared, not run (the device time was spent): pi0's RMSNorm statistics summed on the tensor cores in qkv and
  # gate_up (ssq_mma) at 64-deep K blocks, against those K blocks alone and against ssq_mma at 128 (sweep 32), then
  # the first row's configuration in the call
  lane A 0 30 <<EOT &
300 python3 benchmarks/expert_step_bench.py --sweep 32 --timeline --no-phases --json $R/kernel_expert_step_sweep32.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_mma=1 bk_qkv=64 bk_gu=64" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_mma.json
EOT
  ;;
esac
finish
