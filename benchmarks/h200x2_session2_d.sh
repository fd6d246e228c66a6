#!/usr/bin/env bash
# Session 2, follow-up device call (nvidia-h200-x2): is triton_kernels under compile still slower
# than compile alone once the step casts the attention mask once (not per layer)?
#   A: matrix graph+triton, compile+graph, compile+graph+triton (interleaved, one process);
#   B: kernel profiles of the two compiled variants as CUDA-graph replays (what the matrix times).
# Usage: VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_session2_d.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections
. benchmarks/lanes.sh  # lane NAME GPU [TAIL]
lane A 0 24 <<EOA &
290 $V matrix --workload libero-pi0 --no-progress --iters 30 --warmup 5 --variants "$E,triton_kernels,cuda_graph;$E,compile=default,cuda_graph;$E,triton_kernels,compile=default,cuda_graph" --json $R/matrix_libero-pi0_triton_compile_mask.json
EOA
lane B 1 24 <<EOB &
140 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 10 --levers $E,compile=default,cuda_graph
140 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 10 --levers $E,triton_kernels,compile=default,cuda_graph
EOB
wait
cat "$R"/lane_A.log "$R"/lane_B.log | grep -v "^---\|Self CPU\|Name  "
