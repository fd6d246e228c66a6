#!/bin/bash
# Session 16's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   qkv's rotary halves and gate_up's gate and up as one product of twice the width (one_dot, new): sweep 35
#            with timelines for pi0 and for pi0.5 at its 10 rows, then both workloads' calls in one process each
#   PART=b   (part a: one_dot 691.9 against 731.6 us a step, the libero-pi0 call 1.027x, libero-pi05 1.010x: now on) the
#            K loops bound by their instruction issue, not their bytes: o_proj's and down's tiles twice as wide (64
#            columns, 8 K slices of 128-deep blocks: n32 a warpgroup), each and both, in the call; then the benches
#            and checks of libero-pi0 and libero-pi05 at the new defaults (fresh process each, empty caches)
#   PART=c   (part b: wider o_proj / down tiles slower, 0.977x / 0.990x / 0.978x; libero-pi0 best 13.12 ms, libero-pi05
#            12.12 ms) with one_dot's freed registers and issue slots: the norm statistics from the writers again
#            (ssq_from_writers: 0.924x in session 13, when it spilled), one warpgroup (4 warps: n32 / n64 wgmma), 3-deep
#            pipelines, each in the call; libero-shallow6's bench and check; libero-pi0's kernel table
#   PART=d   (part c: ssq_from_writers 0.906x, 4 warps 0.889x, 3 stages 0.966x; libero-shallow6 5.77 ms; the step kernel
#            6.86 ms of the libero-pi0 call) gate_up's K blocks 64 deep (twice the iterations for the same shared-memory
#            traffic: is the loop's per-block cost what is left?), in the call; batch 4 and 8 and aloha-pi0 with one_dot
#   PART=e   (part d: bk_gu=64 0.998x; b4 33.57 ms, b8 60.65 ms under the power cap; aloha-pi0 16.89 ms) Nsight Compute
#            on one launch of pi0's step kernel at the new defaults: stall reasons, shared-memory and L2 throughput
#            (is the K loops' shared-memory traffic what binds them?), stall samples by source line
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
b)
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --base "" --new "bn_o=64 ks_o=8 bk_o=128" --rounds 40 --json $R/step_config_ab_libero-pi0_wide_o.json
80 python3 benchmarks/step_config_ab.py --base "" --new "bn_down=64 ks_down=8 bk_down=128" --rounds 40 --json $R/step_config_ab_libero-pi0_wide_down.json
80 python3 benchmarks/step_config_ab.py --base "" --new "bn_o=64 ks_o=8 bk_o=128 bn_down=64 ks_down=8 bk_down=128" --rounds 40 --json $R/step_config_ab_libero-pi0_wide_o_down.json
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcA $B --json $R/bench_libero-pi0_best-s16_model.json
100 $V check --workload libero-pi0 --levers best --seeds 2 --compile-cache /tmp/fcA --json $R/check_libero-pi0_best_s16.json
80 $V bench --workload libero-pi05 --levers best --compile-cache /tmp/fcB $B --json $R/bench_libero-pi05_best-s16_model.json
100 $V check --workload libero-pi05 --levers best --seeds 2 --compile-cache /tmp/fcB --json $R/check_libero-pi05_best_s16.json
EOT
  ;;
c)
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_from_writers=1" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_writers_one_dot.json
80 python3 benchmarks/step_config_ab.py --base "" --new "num_warps=4" --rounds 40 --json $R/step_config_ab_libero-pi0_warps4_one_dot.json
80 python3 benchmarks/step_config_ab.py --base "" --new "num_stages=3" --rounds 40 --json $R/step_config_ab_libero-pi0_stages3_one_dot.json
80 $V bench --workload libero-shallow6 --levers best --compile-cache /tmp/fcE $B --json $R/bench_libero-shallow6_best-s16_model.json
100 $V check --workload libero-shallow6 --levers best --seeds 2 --compile-cache /tmp/fcE --json $R/check_libero-shallow6_best_s16.json
100 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s16.txt > $R/kernels_best_s16.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s16.txt
EOT
  ;;
d)
  lane A 0 30 <<EOT &
80 python3 benchmarks/step_config_ab.py --base "" --new "bk_gu=64" --rounds 40 --json $R/step_config_ab_libero-pi0_bk_gu64_one_dot.json
100 $V bench --workload libero-pi0-b4 --levers best --compile-cache /tmp/fc4 $B --json $R/bench_libero-pi0-b4_best-s16_model.json
120 $V bench --workload libero-pi0-b8 --levers best --compile-cache /tmp/fc8 $B --json $R/bench_libero-pi0-b8_best-s16_model.json
80 $V bench --workload aloha-pi0 --levers best --compile-cache /tmp/fcD $B --json $R/bench_aloha-pi0_best-s16_model.json
100 $V check --workload aloha-pi0 --levers best --seeds 2 --compile-cache /tmp/fcD --json $R/check_aloha-pi0_best_s16.json
EOT
  ;;
e)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 60 <<EOT &
150 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section SpeedOfLight --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page details > $R/ncu_step_kernel_details_s16.txt && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source cuda,sass | gzip > $R/ncu_step_kernel_source_s16.csv.gz; grep -i "shared\|throughput\|stall\|issue" $R/ncu_step_kernel_details_s16.txt | head -60
EOT
  ;;
esac
finish
