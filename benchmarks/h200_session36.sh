#!/bin/bash
# Session 36's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   pi0.5's long prompt buckets (benchmarks/prompt_len_probe.py on libero-pi05, `best`): a 150-token
#            prompt kept as 160, 176, 192 and 200 tokens (the bucket 256 is cut to the 200 slots, so 712 prefix
#            rows, not a multiple of 16), and a 100-token prompt as 112 and 128; the kernel tables at 192 and 200
# Usage (device tool, no carry): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session36.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
240 cd benchmarks && python3 prompt_len_probe.py --workload libero-pi05 --valid 150 --lengths 160,176,192,200 --rounds 60 --json $R/prompt_len_probe_libero-pi05_valid150_s36.json --kernels $R/profiles/pi05_prompt_s36
150 cd benchmarks && python3 prompt_len_probe.py --workload libero-pi05 --valid 100 --lengths 112,128 --rounds 60 --json $R/prompt_len_probe_libero-pi05_valid100_s36.json
EOT
  ;;
esac
finish
