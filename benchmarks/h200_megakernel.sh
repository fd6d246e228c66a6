#!/usr/bin/env bash
# Session 3: the step kernel (`megakernel`) on the GPUs. Run on nvidia-h200-x2, one lane per GPU:
#   A: benchmarks/expert_step_bench.py (barrier self-check, accuracy, tilings, per-phase times);
#   B: the matrix best vs graph + megakernel vs compile + graph + megakernel (interleaved, checked).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200_megakernel.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/results; mkdir -p "$R"
source benchmarks/lanes.sh
V="python3 -m vlaperf.cli"
G=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,cuda_graph
lane A 0 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py ${QUICK:-} --json $R/kernel_expert_step.json
EOT
lane B 1 30 <<EOT &
500 $V matrix --workload libero-pi0 --variants "best;$G,megakernel;$G,compile=default,megakernel" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0_megakernel.json
EOT
wait
cat $R/lane_A.log $R/lane_B.log
