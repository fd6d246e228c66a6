#!/bin/bash
# Session 27's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   pi0's step kernel at libero-pi0's 51 rows with its K loops' products as a batch of 16-row products
#            (sub_m=16: mma.sync, as at droid-pi0's 16-row block, instead of the 64-row wgmma), with and without the
#            writers' statistics, and 32-row products: kernel sweep 39 with the GPU clock's timeline on the engine's
#            own arguments, then the whole call against today's defaults, both sides in one process
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session27.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 60 <<EOT &
200 python3 benchmarks/expert_step_bench.py --from-engine libero-pi0 --sweep 39 --timeline --no-phases --json $R/kernel_expert_step_libero-pi0_sweep39.json
170 python3 benchmarks/step_config_ab.py --workload libero-pi0 --base "" --new "sub_m=16" --json $R/step_config_ab_libero-pi0_sub_m16.json
170 python3 benchmarks/step_config_ab.py --workload libero-pi0 --base "" --new "sub_m=16 ssq_from_writers=1" --json $R/step_config_ab_libero-pi0_sub_m16_writers.json
EOT
  ;;
esac
finish
