#!/bin/bash
# Session 15's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   pi0's norm statistics in qkv's and gate_up's K loops: summed on the tensor cores (ssq_mma, session
#            14's, at 64-deep K blocks and at 128), those K blocks alone, and summed within each thread
#            (ssq_local, new): sweep 32 with timelines, then both in the call
#   PART=b   (part a: ssq_local 728.3 against 748.7 us a step, the call 1.013x; ssq_mma slower: now ssq_local is on)
#            the grid barrier's poll with several reads in flight, and the idle programs' prefetch off (sweep 33, with
#            timelines), then Nsight Compute's stall samples by source line on one launch of pi0's step kernel
#   PART=c   (part b: staggered polls slower, 769-778 against 726.6 us a step, the barriers' release 0.77 -> 1.02 us;
#            idle_prefetch=0 740.2) the merge folded into attention (sweep 34), Nsight Compute's source view again
#            (part b's had no counters: `--print-source cuda` alone), the closing benches and checks of libero-pi0 and
#            libero-shallow6 (each in a fresh process, empty caches)
#   PART=d   (part c: fold_merge slower, 758.8 / 798.0 against 731.3 us; libero-pi0 best 13.44 ms) aloha-pi0's first
#            bench and check (3 views, 48-token prompt: an 867-key step kernel), batch 4 and 8 with today's best (last
#            benched in session 9), and libero-pi0's kernel table at the session's defaults
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session15.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
360 python3 benchmarks/expert_step_bench.py --sweep 32 --timeline --no-phases --json $R/kernel_expert_step_sweep32.json | grep -v timeline
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_mma=1 bk_qkv=64 bk_gu=64" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_mma.json
80 python3 benchmarks/step_config_ab.py --base "" --new "ssq_local=1" --rounds 40 --json $R/step_config_ab_libero-pi0_ssq_local.json
EOT
  ;;
b)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 30 <<EOT &
360 python3 benchmarks/expert_step_bench.py --sweep 33 --timeline --no-phases --json $R/kernel_expert_step_sweep33.json | grep -v timeline
200 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --section SchedulerStats --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page details > $R/ncu_step_kernel_details_s15.txt && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source cuda | gzip > $R/ncu_step_kernel_source_lines_s15.csv.gz; ls -la $R
EOT
  ;;
c)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 30 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 34 --timeline --no-phases --json $R/kernel_expert_step_sweep34.json | grep -v timeline
100 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source cuda,sass | gzip > $R/ncu_step_kernel_source_s15.csv.gz; ls -la $R
80 $V bench --workload libero-pi0 --levers best --compile-cache /tmp/fcA $B --json $R/bench_libero-pi0_best-s15_model.json
100 $V check --workload libero-pi0 --levers best --seeds 2 --compile-cache /tmp/fcA --json $R/check_libero-pi0_best_s15.json
80 $V bench --workload libero-shallow6 --levers best --compile-cache /tmp/fcE $B --json $R/bench_libero-shallow6_best-s15_model.json
100 $V check --workload libero-shallow6 --levers best --seeds 2 --compile-cache /tmp/fcE --json $R/check_libero-shallow6_best_s15.json
EOT
  ;;
d)
  lane A 0 30 <<EOT &
80 $V bench --workload aloha-pi0 --levers best --compile-cache /tmp/fcD $B --json $R/bench_aloha-pi0_best-s15_model.json
100 $V check --workload aloha-pi0 --levers best --seeds 2 --compile-cache /tmp/fcD --json $R/check_aloha-pi0_best_s15.json
100 $V bench --workload libero-pi0-b4 --levers best --compile-cache /tmp/fc4 $B --json $R/bench_libero-pi0-b4_best-s15_model.json
120 $V bench --workload libero-pi0-b8 --levers best --compile-cache /tmp/fc8 $B --json $R/bench_libero-pi0-b8_best-s15_model.json
100 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 40 --levers best --sequence $R/kernel_sequence_best_s15.txt > $R/kernels_best_s15.txt 2>&1; grep -A12 "^per call" $R/kernels_best_s15.txt
EOT
  ;;
esac
finish
