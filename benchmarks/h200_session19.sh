#!/bin/bash
# Session 19's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the step kernel's attention with its value / output dims in parts a task (att_dsplit, new):
#            sweep 36 with the timeline (32-row blocks in 2 dim parts, 32-row blocks alone, with 32-key
#            tiles), then the libero-pi0 call with att_bm=32 att_dsplit=2 against the defaults, in one process
#   PART=b   sweep 37 (the attention's key tiles pipelined), then the call with its fastest row against the
#            defaults if that row was at least 1% faster than them in the sweep
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session19.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
230 python3 benchmarks/expert_step_bench.py --sweep 36 --timeline --no-phases --json $R/kernel_expert_step_sweep36.json | grep -v timeline
250 python3 benchmarks/step_config_ab.py --base "" --new "att_bm=32 att_dsplit=2" --rounds 50 --json $R/step_config_ab_libero-pi0_att_dsplit.json
EOT
  ;;
b)
  # sweep 37, then the call with the sweep's fastest row against the defaults if it beat them by 1% (pick_row.py)
  lane A 0 40 <<EOT &
230 python3 benchmarks/expert_step_bench.py --sweep 37 --timeline --no-phases --json $R/kernel_expert_step_sweep37.json | grep -v timeline
250 NEW=\$(python3 benchmarks/pick_row.py $R/kernel_expert_step_sweep37.json 0.99) && python3 benchmarks/step_config_ab.py --base "" --new "\$NEW" --rounds 50 --json $R/step_config_ab_libero-pi0_sweep37_best.json
EOT
  ;;
esac
finish
