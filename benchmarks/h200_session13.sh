#!/bin/bash
# Session 13's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the step kernel's norm statistics and loads: pi0's sweep 23 (statistics from o_proj's and
#            down's writers instead of squared in qkv's and gate_up's K loops, loaded ahead of the loops;
#            256-deep K blocks for qkv and gate_up) and pi0.5's sweep 22 (the modulation table prefetched
#            by the programs idle in qkv; statistics and biases loaded ahead), each with timelines; then
#            the whole call, both sides in one process, for the candidate of each
#   PART=b   pi0.5's two new defaults one at a time (sweep 24), pi0's 256-deep K blocks (sweep 25), pi0.5's
#            bench and check at the new defaults
#   PART=c   pi0.5's kernel sequence at the new defaults; each option's share of the call
#   PART=d   sweep 24 again with cold modulation tables (--tables 10); mod_prefetch alone in the call; libero-pi0 bench
#   PART=e   pi0 through pi0.5's modulated path with an identity table, in the call (step_config_ab --identity-mod)
#   PART=next  (not run) sweep 26: pi0.5's step kernel at libero-pi05's 10 rows
#   PART=next2 (not run) sweep 27 and the call: pi0's qkv RoPE tables loaded ahead of its K loop
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
b)
  # (part a: the sweeps ran out of their 200 s after 1 and 3 rows, each row compiling three times; pi0's
  # ssq_from_writers 891 against 775 us a step, the call 0.924x with stats_ahead; pi0.5's call with
  # mod_prefetch + stats_ahead 1.167x, 15.04 -> 12.90 ms: made its defaults) what each of the two gives
  # pi0.5 at the kernel (sweep 24, against the new defaults), pi0's 256-deep K blocks (sweep 25), then
  # pi0.5's best at the new defaults: the bench in a fresh process, its equivalence
  lane A 0 30 <<EOT &
240 python3 benchmarks/expert_step_bench.py --pi05 --sweep 24 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep24.json | grep -v timeline
160 python3 benchmarks/expert_step_bench.py --sweep 25 --timeline --no-phases --json $R/kernel_expert_step_sweep25.json | grep -v timeline
80 $V bench --workload libero-pi05 --levers best --compile-cache /tmp/fcA $B --json $R/bench_libero-pi05_best-s13_model.json
70 $V check --workload libero-pi05 --levers best --seeds 2 --compile-cache /tmp/fcA --json $R/check_libero-pi05_best_s13.json
EOT
  ;;
c)
  # (part b: at the kernel alone, replaying one launch, the new defaults are not faster: 912 against 895 us a
  # step; yet pi0.5's bench fell 14.96 -> 13.04 ms.) The kernel sequence of pi0.5's best call, to see the step
  # kernel's time in the real call (its modulation table is a different one every step there), then what
  # each of the two options gives the call, against the new defaults
  lane A 0 30 <<EOT &
110 python3 benchmarks/profile_kernels.py --workload libero-pi05 --rows 40 --levers best --sequence $R/kernel_sequence_best_pi05_s13.txt > $R/kernels_best_pi05_s13.txt 2>&1; grep -A12 "^per call" $R/kernels_best_pi05_s13.txt
100 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "mod_prefetch=0" --new "" --rounds 40 --json $R/step_config_ab_libero-pi05_mod_prefetch.json
100 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "stats_ahead=0" --new "" --rounds 40 --json $R/step_config_ab_libero-pi05_stats_ahead_only.json
EOT
  ;;
d)
  # (part c: in the real call pi0.5's step kernel takes 665-675 us a step against 870-907 in session 12; all of
  # the gain is stats_ahead's, 1.167x, mod_prefetch's 1.001x.) Why the kernel alone did not show it: there one
  # table stayed warm in L2; here the timed launches cycle through 10 tables, cold as in the call (sweep 24
  # again); mod_prefetch alone against neither, in the call; libero-pi0's best at the session's code
  lane A 0 30 <<EOT &
250 python3 benchmarks/expert_step_bench.py --pi05 --tables 10 --sweep 24 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep24_cold.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --workload libero-pi05 --base "mod_prefetch=0 stats_ahead=0" --new "stats_ahead=0" --rounds 40 --json $R/step_config_ab_libero-pi05_mod_prefetch_alone.json
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcB $B --json $R/bench_libero-pi0_best-s13_model.json
EOT
  ;;
e)
  # (part d: with cold tables the kernel alone is still 913 against 897 us: the call's gain is not the
  # table's temperature; mod_prefetch alone 1.004x in the call; libero-pi0 14.09 ms.) pi0.5's step kernel is
  # 668 us a step in its call, pi0's 764: pi0 through pi0.5's modulated path with an identity table, in the
  # call, with and without stats_ahead
  lane A 0 30 <<EOT &
90 python3 benchmarks/step_config_ab.py --base "" --identity-mod --rounds 40 --json $R/step_config_ab_libero-pi0_identity_mod.json
90 python3 benchmarks/step_config_ab.py --base "" --new "stats_ahead=0" --identity-mod --rounds 40 --json $R/step_config_ab_libero-pi0_identity_mod_no_ahead.json
EOT
  ;;
next)
  # prepared, not run (the device time was spent): pi0.5's step kernel on the very arguments its call launches
  # (--from-engine: does the bench now give the call's 665-675 us?), then at libero-pi05's real shape (10 rows
  # over a 576-token prefix; sweeps 19-24 timed 50 rows), sweep 26, with timelines
  lane A 0 30 <<EOT &
200 python3 benchmarks/expert_step_bench.py --from-engine libero-pi05 --quick --timeline --no-phases --json $R/kernel_expert_step_pi05_from_engine.json | grep -v timeline
370 python3 benchmarks/expert_step_bench.py --pi05 --sweep 26 --timeline --no-phases --json $R/kernel_expert_step_pi05_sweep26.json | grep -v timeline
EOT
  ;;
next2)
  # prepared, not run: pi0's qkv with its RoPE tables loaded before the K loop (rope_ahead), sweep 27, then the call
  lane A 0 30 <<EOT &
300 python3 benchmarks/expert_step_bench.py --sweep 27 --timeline --no-phases --json $R/kernel_expert_step_sweep27.json | grep -v timeline
100 python3 benchmarks/step_config_ab.py --base "" --new "rope_ahead=1" --rounds 60 --json $R/step_config_ab_libero-pi0_rope_ahead.json
EOT
  ;;
esac
finish
