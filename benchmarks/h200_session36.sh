#!/bin/bash
# Session 36's device calls on nvidia-h200 (one GPU, 16 cores; lanes.sh, lane A only).
#   PART=a   pi0.5's long prompt buckets (benchmarks/prompt_len_probe.py on libero-pi05, `best`): a 150-token
#            prompt kept as 160, 176, 192 and 200 tokens (the bucket 256 is cut to the 200 slots, so 712 prefix
#            rows, not a multiple of 16), and a 100-token prompt as 112 and 128; the kernel tables at 192 and 200
#   PART=b   torch's cuBLAS pick for Gemma's four prefix GEMMs across the prefix's row counts (batch 1: 512-784,
#            batch 4 and 8 around their buckets), then every algorithm cuBLASLt's heuristic offers at the rows of
#            pi0's and pi0.5's buckets (cublaslt_probe.py): does an algorithm fix the cliff part a found at 704 rows?
#   PART=c   the prefix attention's mask loads bounded by the rows' padded columns (version 114): the kernel alone at
#            704, 712, 720 and 544 tokens against the old bound (prefix_attention_probe.py), then part a's pi0.5
#            prompts again, and pi0's 8-token bucket (520 rows) against 16
#   PART=d   the prefix attention's key splits 1-6 at the prefix shapes the buckets make (prefix_splits_probe.py)
#   PART=e   the prefix attention's splits picked per shape (version 115) against 3 everywhere, the whole `best`
#            call in one process (change_ab.py --change prefix_splits): batch 4 and 8, pi0.5's 200-token bucket,
#            aloha-pi0's three images, and libero-pi0 (68 blocks: 3 splits either way) as the control
#   PART=f   the GPU tests of the kernels and the CUDA engine at versions 114-115, then `vlaperf bench` of `best` on
#            the workloads version 115 moves (batch 4 and 8, aloha-pi0) and libero-pi0
#   PART=g   the rest of the test suite on the GPU machine (as session 35's parts a and b, less part f's modules)
#   PART=h   part d's sweep again at version 115, so its file records prefix_splits' pick
#   PART=i   part g's other modules again at the session's last code, with websockets and openpi-client carried as
#            wheels (carry [".whl"]: the serve tests need them)
# Usage (device tool, no carry; part i: carry [".whl"]): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session36.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
240 cd benchmarks && python3 prompt_len_probe.py --workload libero-pi05 --valid 150 --lengths 160,176,192,200 --rounds 60 --json $R/prompt_len_probe_libero-pi05_valid150_s36.json --kernels $R/profiles/pi05_prompt_s36
150 cd benchmarks && python3 prompt_len_probe.py --workload libero-pi05 --valid 100 --lengths 112,128 --rounds 60 --json $R/prompt_len_probe_libero-pi05_valid100_s36.json
EOT
  ;;
b)
  lane A 0 60 <<EOT &
150 cd benchmarks && python3 cublaslt_probe.py --shapes gemma_qkv,gemma_o,gemma_gate_up,gemma_down --rows 512-784:8 --algos 0 --json $R/gemm_rows_sweep_b1_s36.json | cut -c1-60
120 cd benchmarks && python3 cublaslt_probe.py --shapes gemma_qkv,gemma_o,gemma_gate_up,gemma_down --rows 2048-2304:32,4096-4608:64 --algos 0 --json $R/gemm_rows_sweep_b48_s36.json | cut -c1-60
240 cd benchmarks && python3 cublaslt_probe.py --shapes gemma_down,gemma_qkv,gemma_o,gemma_gate_up --rows 544,552,576,640,688,704,712 --json $R/cublaslt_probe_rows_s36.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
120 cd benchmarks && for t in 704:650 712:650 720:650 544:532; do python3 prefix_attention_probe.py --tokens \${t%:*} --valid \${t#*:} --json $R/prefix_attention_probe_\${t%:*}_s36.json 2>&1 | grep ours; done
200 cd benchmarks && python3 prompt_len_probe.py --workload libero-pi05 --valid 150 --lengths 176,192,200 --rounds 60 --json $R/prompt_len_probe_libero-pi05_valid150_v114_s36.json
150 cd benchmarks && python3 prompt_len_probe.py --valid 6 --lengths 8,16 --rounds 60 --json $R/prompt_len_probe_libero-pi0_valid6_v114_s36.json
EOT
  ;;
d)
  lane A 0 40 <<EOT &
240 cd benchmarks && python3 prefix_splits_probe.py --json $R/prefix_splits_probe_s36.json
EOT
  ;;
e)
  lane A 0 40 <<EOT &
150 cd benchmarks && python3 change_ab.py --change prefix_splits --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_prefix_splits.json
150 cd benchmarks && python3 change_ab.py --change prefix_splits --workload libero-pi0-b8 --rounds 30 --json $R/change_ab_libero-pi0-b8_prefix_splits.json
120 cd benchmarks && python3 change_ab.py --change prefix_splits --workload libero-pi05 --valid 150 --rounds 60 --json $R/change_ab_libero-pi05_valid150_prefix_splits.json
100 cd benchmarks && python3 change_ab.py --change prefix_splits --workload aloha-pi0 --rounds 60 --json $R/change_ab_aloha-pi0_prefix_splits.json
100 cd benchmarks && python3 change_ab.py --change prefix_splits --workload libero-pi0 --rounds 60 --json $R/change_ab_libero-pi0_prefix_splits.json
EOT
  ;;
f)
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  lane A 0 40 <<EOT &
170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s36f.log | grep -v "^\\.*\\["
90 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s36_model.json
100 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s36_model.json
80 $V bench --workload aloha-pi0 --levers best $B --json $R/bench_aloha-pi0_best-s36_model.json
80 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s36_model.json
EOT
  ;;
g)
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  lane A 0 40 <<EOT &
150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_s36g1.log | grep -v "^\\.*\\["
400 $P -q -n 14 --timeout 250 --durations 10 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py 2>&1 | tee $R/pytest_gpu_s36g2.log | grep -v "^\\.*\\["
EOT
  ;;
h)
  lane A 0 40 <<EOT &
120 cd benchmarks && python3 prefix_splits_probe.py --json $R/prefix_splits_probe_v115_s36.json
EOT
  ;;
i)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  lane A 0 40 <<EOT &
220 $P -q -n 14 --timeout 200 --durations 5 --ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py 2>&1 | tee $R/pytest_gpu_s36i.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
