#!/bin/bash
# Session 67's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from. Carry [".whl"].
# Session 66's part c never got a machine; it is this session's first aim, with the H200 headline if an H200 comes.
#   PART=a   on any card, first: `check --dtype float32` of fuse_projections+triton_kernels and of $G (graph + compile
#               + triton_kernels), after session 66's fix (suffix_attention's dots in IEEE float32 for float32
#               operands).
#               Prediction: both pass, rel L2 <= 1e-5 (session 66, before the fix: 7.92e-4, FAILED).
#            then `check --workload libero-pi05 --dtype float32 --levers megakernel`, after this session's fix (the step
#               kernel's dots in IEEE float32 for float32 operands; the CPU-compiled PTX has no MMA left in float32,
#               and bfloat16's is unchanged). Predictions: the kernel fits at pi0.5's 10 rows (Triton 3.9 on the CPU:
#               147,456 B of shared memory; the GPU's 3.6 asked 1.33x 3.9's at 51 rows, so ~196 KB against 232,448)
#               and passes at rel L2 <= 1e-5. Before the fix its TF32 dots would have failed.
#            on an H200, then: libero-pi0 `best` in model mode and in policy mode, four fresh processes each (no H200
#               since session 60). Predictions: model 12.7-13.0 ms (session 60: 12.72), policy 14.0-14.4 ms
#               (session 48: 14.05-14.34). The checks go first: by 15:10 eleven failed starts had left ~850 s.
#            on another card, then: tests/test_kernels.py on the GPU (prediction: all pass; bfloat16's PTX is
#               unchanged) and `matrix --dtype float32 --variants "best;$G"` in model mode: is `best` right to leave
#               the kernels out in float32? Prediction: $G 1.1-2x slower than best (the kernels' IEEE dots run on FMA
#               units where torch's float32 matmuls take cuBLAS's SGEMM; the tiles were tuned for bfloat16).
#   PART=b   (after an H200's part a) tests/test_kernels.py, the float32 matrix, and a policy breakdown of `best`.
#               Predictions as above; breakdown: the staged call matches the untimed one exactly, coverage 0.95-1.05,
#               host stages 1.4-1.8 ms.
# Outcome (one H100, 15:46-15:50, after thirteen failed starts from 13:51; no H200 came, so no headline), part a:
#   check float32 fuse_projections+triton_kernels 6.65e-7, $G 1.11e-6: both pass, exit 0 (as predicted).
#   the megakernel check as written here named `megakernel` alone and was refused (exit 2: it needs fuse_projections
#   and static_kv_cache; only `--levers all` adds them). Run after on the warm machine with
#   `--levers fuse_projections,static_kv_cache,megakernel`: 2.64e-7, passes (fits at 10 rows); the same with
#   64c8d3d's expert_step.py (the TF32 dots): 5.80e-4, FAILED (as predicted).
#   tests/test_kernels.py: 41 passed, 12 skipped (CPU compile checks need Triton 3.9; the GPU has 3.6).
#   matrix float32: best 91.57 ms, $G 401.78 ms, 4.39x slower: a miss (predicted 1.1-2x; docs/perf-notes.md).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session67.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B, $P, $G
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $GPU_NAME"
CHECK="150 $V check --workload libero-pi0 --dtype float32 --levers 'fuse_projections,triton_kernels;$G' --json $R/check_libero-pi0_fp32_kernels-s67.json; echo exit=\$?"
MEGA="120 $V check --workload libero-pi05 --dtype float32 --levers megakernel --json $R/check_libero-pi05_fp32_megakernel-s67.json; echo exit=\$?"
KERNELS="120 $P -q -n 4 --timeout 110 tests/test_kernels.py 2>&1 | tee $R/pytest_gpu_s67k.log | tail -6"
MATRIX="180 $V matrix --workload libero-pi0 --dtype float32 --variants 'best;$G' --mode model $B --json $R/matrix_libero-pi0_fp32_kernels-s67.json"
case "${PART:-a}" in
a)
  {
    case "$GPU_NAME" in
      *H200*)
        echo "$CHECK"; echo "$MEGA"
        echo "170 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s67-4proc_model.json"
        echo "190 $V bench --workload libero-pi0 --levers best --mode policy --processes 4 $B --json $R/bench_libero-pi0_best-s67-4proc_policy.json"
        ;;
      *)
        echo "$CHECK"; echo "$MEGA"; echo "$KERNELS"; echo "$MATRIX"
        ;;
    esac
  } | lane A 0 40 &
  ;;
b)
  {
    echo "$KERNELS"; echo "$MATRIX"
    echo "90 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s67_policy.json"
  } | lane A 0 40 &
  ;;
*) echo "unknown PART=${PART}"; exit 2 ;;
esac
finish
