#!/bin/bash
# Session 30's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the breakdown taken inside the CUDA graph: the GPU tests of it (pi0 tiny, model and policy
#            mode; wam-tiny), the event probe, then `vlaperf breakdown` of libero-pi0 `best` (model and
#            policy mode) and `graph`, and of wam-761 `best`
#   PART=b   refreshes of two table cells with old dates: wam-761 at batch 4 (`best`) and libero-pi0's
#            policy-mode reference
#   PART=c   the other workloads' `best` broken down inside the graph: libero-pi05, libero-shallow6, libero-pi0-b8
#   PART=d   what a padded prompt token costs `best` (benchmarks/prompt_len_probe.py): libero-pi0's 20 tokens kept
#            as 20, 24, 32 (today's bucket), 40 and 48, interleaved in one process
#   PART=e   the attention masks' rows padded to 16 bytes (suffix_attention.aligned_mask): change_ab against rows of
#            exactly Tk bytes (libero-pi0: the step kernel's 600-key mask), then part d's probes again
#   PART=f   (not run: no device time left) the same A/B after the step's mask was aligned once a step where it is
#            cast (f30b3c9, since taken out again: the step's kernels get rows of exactly Tk bytes, as before)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session30.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
150 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_profile_breakdown.py tests/test_wam.py -k "cuda_graph" 2>&1 | tail -4
30 python3 benchmarks/graph_event_probe.py
150 $V breakdown --workload libero-pi0 --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-pi0_best-s30.json
100 $V breakdown --workload libero-pi0 --levers best --mode policy --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-pi0_best-s30_policy.json
60 $V breakdown --workload libero-pi0 --levers graph --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-pi0_graph-s30.json
100 $V breakdown --workload wam-761 --levers best --warmup 5 --iters 30 --no-progress --json $R/breakdown_wam-761_best-s30.json
EOT
  ;;
b)
  lane A 0 14 <<EOT &
120 $V bench --workload wam-761 --levers best --batch 4 $B --json $R/bench_wam-761-b4_best-s30_model.json
120 $V bench --workload libero-pi0 --mode policy --levers reference --warmup 10 --iters 50 --no-progress --json $R/bench_libero-pi0_reference-s30_policy.json
EOT
  ;;
c)
  lane A 0 30 <<EOT &
100 $V breakdown --workload libero-pi05 --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-pi05_best-s30.json
100 $V breakdown --workload libero-shallow6 --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-shallow6_best-s30.json
100 $V breakdown --workload libero-pi0-b8 --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_libero-pi0-b8_best-s30.json
EOT
  ;;
d)
  lane A 0 20 <<EOT &
240 cd benchmarks && python3 prompt_len_probe.py --lengths 20,24,32,40,48 --rounds 40 --json $R/prompt_len_probe_libero-pi0_s30.json
EOT
  ;;
e)
  lane A 0 20 <<EOT &
200 cd benchmarks && python3 change_ab.py --change mask_align --rounds 60 --json $R/change_ab_libero-pi0_mask_align.json
150 cd benchmarks && python3 prompt_len_probe.py --valid 6 --lengths 8,16,32 --rounds 40 --json $R/prompt_len_probe_libero-pi0_valid6_aligned_s30.json
150 cd benchmarks && python3 prompt_len_probe.py --lengths 20,24,32,40,48 --rounds 40 --json $R/prompt_len_probe_libero-pi0_aligned_s30.json
EOT
  ;;
f)
  lane A 0 20 <<EOT &
150 cd benchmarks && python3 change_ab.py --change mask_align --rounds 60 --json $R/change_ab_libero-pi0_mask_align_f.json
150 cd benchmarks && python3 change_ab.py --change mask_align --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_mask_align_f.json
EOT
  ;;
esac
finish
