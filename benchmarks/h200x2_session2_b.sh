#!/usr/bin/env bash
# Session 2, third device call (nvidia-h200-x2), two lanes, one per GPU:
#   A: the attention kernel's sweep, then the matrix that decides whether triton_kernels
#      joins `best`: graph, graph+triton, compile+graph, compile+graph+triton (interleaved);
#   B: the doctor and the best-path breakdown (issue 3), then LeRobot's pytest tests on this
#      machine (issue 6: reduced fp32/bf16 on its CPU, full size on the GPU).
# Carry .whl_lerobot. Usage: VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_session2_b.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ls .whl_lerobot/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_lerobot/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections

. benchmarks/lanes.sh  # lane NAME GPU [TAIL]

lane A 0 30 <<EOA &
150 python3 benchmarks/suffix_attention_bench.py --json $R/kernel_suffix_attention.json
400 $V matrix --workload libero-pi0 --no-progress --iters 40 --warmup 5 --variants "$E,cuda_graph;$E,triton_kernels,cuda_graph;$E,compile=default,cuda_graph;$E,triton_kernels,compile=default,cuda_graph" --json $R/matrix_libero-pi0_triton.json
EOA
lane B 1 30 <<EOB &
90 $V doctor --workload libero-pi0 --json $R/doctor_libero-pi0.json
180 $V breakdown --workload libero-pi0 --levers best --no-progress --json $R/breakdown_libero-pi0_best.json
300 python3 -m pytest -q -rA -p no:cacheprovider tests/test_compare_lerobot.py --junitxml=$R/pytest_lerobot.xml
EOB
wait
cat "$R"/lane_A.log "$R"/lane_B.log
