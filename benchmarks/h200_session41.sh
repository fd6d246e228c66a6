#!/bin/bash
# Session 41's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only). Prepared while the device pool
# was paused (no call made in session 41): the GPU checks of what sessions 40 and 41 changed on the CPU.
#   PART=a   the whole suite on the GPU machine at the session's last code: gpu_suite, carry [".whl"]. It holds session
#            40's part d (tests/test_cuda_measurement.py beside the suite's third step, the kernels' launch recorders
#            under torch 2.11 / Triton 3.6) and session 41's tests (fused multiply-add asked for at every launch, the
#            doctor's Triton switches read through Triton 3.6's knobs). Prediction: all pass.
#   PART=b   what the fp-fusion request does to the kernels every figure came from: libero-pi0 `best` in a fresh
#            process, and the doctor with the two debugging switches set. Predictions: Triton 3.6's default is fused
#            multiply-add already, so the same binaries: 13.14 ms (session 38's file) within 1%, rel L2 6.4e-3 as
#            before; the doctor exits 1 with env.triton_interpreter and env.uncached_allocator, and no
#            env.fp_fusion_disabled for TRITON_FORCE_DISABLE_FP_FUSION=1 (Triton 3.6 has no such switch).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session41.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  gpu_suite s41${PART} &
  ;;
b)
  mkdir -p $R/profiles
  lane A 0 40 <<EOT &
110 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s41_model.json
60 TRITON_INTERPRET=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 TRITON_FORCE_DISABLE_FP_FUSION=1 $V doctor --workload tiny --no-measure --json $R/profiles/doctor_switches_s41.json > $R/profiles/doctor_switches_s41.txt 2>&1; echo "doctor exit \$?"; python3 -c "import json; print(sorted(f['id'] for f in json.load(open('$R/profiles/doctor_switches_s41.json'))['findings']))"
EOT
  ;;
esac
finish
