#!/usr/bin/env bash
# Where does the time of the compiled path go, and does autotuning the GEMMs help?
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
E=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections
mkdir -p "$OUT/r"
timeout 200 python3 benchmarks/profile_kernels.py --levers "$E,compile=default" --rows 30 2>&1 | grep -v Warn | cut -c1-75,150-230 | tail -40
timeout 380 python3 -m vlaperf.cli matrix --workload libero-pi0 --no-progress --iters 40 --warmup 5 \
  --variants "$E,cuda_graph;$E,compile=default,cuda_graph;$E,compile=max-autotune-no-cudagraphs,cuda_graph" \
  --json "$OUT/r/matrix_libero-pi0_autotune.json" 2>&1 | grep -v -i warn | tail -12
