#!/usr/bin/env bash
# What session 1 could not run on the H200 (its device time ran out), in priority order.
# Not yet run: check each step's output. Carry .whl with the LeRobot wheels of docs/compare.md
# (and websockets) when the compare step is wanted.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200_next.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
run() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | grep -v -i "warn" | tail -16; tar czf "$OUT/results.tgz" -C /tmp results; }
B="--no-progress --warmup 10 --iters 50"
# 1. the small-M kernel against cuBLAS on the expert's shapes (decides the next lever)
run 240 python3 benchmarks/small_m_matmul_bench.py --json "$R/kernel_small_m_matmul.json"
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections
run 200 $V matrix --workload libero-pi0 --no-progress --iters 40 --warmup 5 \
  --variants "$E,cuda_graph;$E,triton_kernels,cuda_graph;$E,compile=default,cuda_graph" --json "$R/matrix_libero-pi0_triton.json"
# 2. issue 3: T(N) of the reference path; the doctor on the GPU
run 120 $V scaling --workload libero-pi0 --levers reference --steps 1,2,5,10,20 --warmup 2 --iters 5 --no-progress --json "$R/scaling_libero-pi0_reference.json"
run 60 $V doctor --workload libero-pi0 --json "$R/doctor_libero-pi0.json"
# 3. issue 4: the workloads not measured yet
run 120 $V bench --workload libero-pi05 --levers best $B --json "$R/bench_libero-pi05_best-compile_model.json"
run 50 $V bench --workload libero-pi0-b4 --levers graph $B --json "$R/bench_libero-pi0-b4_graph_model.json"
# 4. issue 6: LeRobot 0.6.1 side by side (needs the carried wheels)
run 300 $V compare --workload libero-pi0 --against lerobot --no-progress --json "$R/compare_libero-pi0_lerobot.json"
