#!/usr/bin/env bash
# Session 2, last device call (nvidia-h200-x2): (1) Ray Serve with 2 replicas again, now that
# idle inference threads share the queue (8 clients should run as two batches of 4);
# (2) two lanes, one per GPU: A, kernel profiles of compile with and without triton_kernels
# (why the kernels lose under compile); B, `best` at batch 4 and 8, then graph vs
# graph+triton_kernels with the retuned attention tiles.
# Carry .whl (benchmarks/ray_wheels.sh). Usage: VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_session2_c.sh
set -u
export PYTHONUNBUFFERED=1
R=/tmp/results; mkdir -p "$R"
SERVERS=ray2 WORKLOAD=libero-pi0 LEVERS=graph bash benchmarks/h200x2_ray_serve.sh 2>&1 | tail -20
mv "$R/loadgen_libero-pi0_graph_ray2.json" "$R/loadgen_libero-pi0_graph_ray2_shared_queue.json" 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
V="python3 -m vlaperf.cli"
B="--no-progress --warmup 10 --iters 50"
. benchmarks/lanes.sh  # lane NAME GPU [TAIL]
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections
lane A 0 40 <<EOA &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 12 --levers $E,compile=default
200 python3 benchmarks/profile_kernels.py --workload libero-pi0 --rows 12 --levers $E,triton_kernels,compile=default
EOA
lane B 1 40 <<EOB &
150 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-compile_model.json
150 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-compile_model.json
120 $V matrix --workload libero-pi0 --no-progress --iters 30 --warmup 5 --variants "$E,cuda_graph;$E,triton_kernels,cuda_graph" --json $R/matrix_libero-pi0_triton_graph.json
EOB
wait
cat "$R"/lane_A.log "$R"/lane_B.log
