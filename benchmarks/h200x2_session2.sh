#!/usr/bin/env bash
# Session 2, first device call (nvidia-h200-x2): the single-GPU runs still missing, as two
# lanes in parallel, one per GPU (each lane is one process at a time on its own GPU; the
# lanes share only the host's 32 cores). Carry .whl_lerobot (LeRobot 0.6.1 and the wheels
# of docs/compare.md) for lane B's comparisons.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_session2.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ls .whl_lerobot/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_lerobot/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
nvidia-smi --query-gpu=index,name,uuid,memory.used --format=csv,noheader
B="--no-progress --warmup 10 --iters 50"
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections

. benchmarks/lanes.sh  # lane NAME GPU [TAIL]

lane A 0 25 <<EOA &
150 python3 benchmarks/small_m_matmul_bench.py --json $R/kernel_small_m_matmul.json
220 $V matrix --workload libero-pi0 --no-progress --iters 40 --warmup 5 --variants "$E,cuda_graph;$E,triton_kernels,cuda_graph;$E,compile=default,cuda_graph" --json $R/matrix_libero-pi0_triton.json
130 $V bench --workload libero-pi05 --levers best $B --json $R/bench_libero-pi05_best-compile_model.json
60 $V bench --workload libero-pi0-b4 --levers graph $B --json $R/bench_libero-pi0-b4_graph_model.json
EOA
lane B 1 25 <<EOB &
170 $V compare --workload libero-pi0 --against lerobot --lerobot-compile none --no-progress --json $R/compare_libero-pi0_lerobot.json
170 $V compare --workload libero-pi05 --against lerobot --lerobot-compile none --no-progress --json $R/compare_libero-pi05_lerobot.json
200 $V scaling --workload libero-pi0 --levers "reference;best" --steps 1,2,5,10,20 --warmup 2 --iters 5 --no-progress --plot $R/scaling_libero-pi0_reference_best.png --json $R/scaling_libero-pi0_reference_best.json
EOB
wait
cat "$R"/lane_A.log "$R"/lane_B.log
