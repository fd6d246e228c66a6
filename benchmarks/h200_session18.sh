#!/bin/bash
# Session 18's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only): session 17's prepared
# world-action runs (its PART=next, split in two to fit a call), and the pi0 step kernel under Nsight.
#   PART=a   the GPU tests of the world-action model and UniPC; kernel tables of best's call at none and
#            drop_middle (what its 3.1x over the 18.5 ms floor is) and of one compiled forward at batch 8
#            at none and drop_middle (session 17's unexplained 64.5 / 64.9 ms); batch 4; guidance;
#            the breakdown of exact with drop_middle
#   PART=b   T(N) of reference and best; the served model under loadgen (graph, 1 and 4 clients);
#            Nsight Compute on one launch of pi0's step kernel at the one_dot defaults (session 16's
#            part e, never run)
#   PART=c   (carry .whl: websockets and msgpack for the server) the new lever fuse_projections (stacked
#            q/k/v and context k/v weights, fc1 + GELU in one cuBLASLt call) against best without it, in one
#            process, at none and drop_middle; best in a fresh process; the SDPA backends on the model's
#            attention shapes; the served model under loadgen (PART=b's try had no websockets)
#   PART=d   the two levers that part c's kernel table pointed to, added one at a time in one process
#            (best before this session -> + fuse_projections -> + group_modulation -> + flash_actions = best)
#            at none and drop_middle; best in a fresh process, its kernel table, its check at every sparsity
#            mode, batch 4
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session18.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
W="--workload wam-761"
PK="python3 benchmarks/profile_kernels.py $W --levers best --rows 30"
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
80 python3 -m pytest -q -p no:cacheprovider tests/test_wam.py tests/test_unipc.py -k "gpu or cuda or sync" 2>&1 | grep -E "passed|failed|error" | tail -3
80 $PK --sequence $R/kernel_sequence_wam-761_best.txt > $R/kernels_wam-761_best.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_best.txt
70 $PK --sparsity drop_middle > $R/kernels_wam-761_best_drop.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_best_drop.txt
60 $PK --mode forward --batch 8 > $R/kernels_wam-761_forward_b8.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_forward_b8.txt
60 $PK --mode forward --batch 8 --sparsity drop_middle > $R/kernels_wam-761_forward_b8_drop.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_forward_b8_drop.txt
70 $V bench $W --levers best --batch 4 $B --json $R/bench_wam-761-b4_best_model.json
70 $V bench $W --levers best --cfg-scale 3 $B --json $R/bench_wam-761_best_cfg_model.json
70 $V breakdown $W --levers exact --sparsity drop_middle --iters 20 --warmup 3 --no-progress --json $R/breakdown_wam-761_exact_drop.json
EOT
  ;;
b)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  lane A 0 60 <<EOT &
200 $V scaling $W --levers "reference;best" --steps 2,5,10,20 --iters 8 --warmup 2 --no-progress --json $R/scaling_wam-761.json
150 bash -c 'setsid $V serve $W --levers graph --port 8765 --warmup-batches 1,4 > $R/serve_wam-761.log 2>&1 & SP=\$!; for i in \$(seq 120); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 100 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4 --requests 20 --warmup 2 --json $R/loadgen_wam-761_graph.json; kill -TERM \$SP; tail -5 $R/serve_wam-761.log'
150 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section SpeedOfLight --import-source yes -f -o /tmp/step_ncu python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_ncu.ncu-rep --page details > $R/ncu_step_kernel_details_s18.txt && $NCU -i /tmp/step_ncu.ncu-rep --page source --csv --print-source cuda,sass | gzip > $R/ncu_step_kernel_source_s18.csv.gz; grep -i "shared\|throughput\|stall\|issue" $R/ncu_step_kernel_details_s18.txt | head -60
EOT
  ;;
c)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  OLD=host_schedule,cached_keep_index,sparse_sampler,context_kv_cache,video_kv_cache,sdpa,cuda_graph,compile=default
  lane A 0 40 <<EOT &
60 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_wam.py -k "gpu or cuda" 2>&1 | tail -3
60 python3 benchmarks/wam_attention_probe.py --json $R/wam_attention_probe.json
130 $V matrix $W --variants "$OLD;best" --warmup 3 --iters 20 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_fuse.json
100 $V matrix $W --variants "$OLD;best" --sparsity drop_middle --warmup 3 --iters 20 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_fuse_drop.json
60 $V bench $W --levers best --compile-cache /tmp/fcW $B --json $R/bench_wam-761_best-s18_model.json
150 bash -c 'setsid $V serve $W --levers graph --port 8765 --warmup-batches 1,4 > $R/serve_wam-761.log 2>&1 & SP=\$!; for i in \$(seq 120); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 100 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4 --requests 20 --warmup 2 --json $R/loadgen_wam-761_graph.json; kill -TERM \$SP; tail -5 $R/serve_wam-761.log'
EOT
  ;;
d)
  O=host_schedule,cached_keep_index,sparse_sampler,context_kv_cache,video_kv_cache,sdpa,cuda_graph,compile=default
  VS="$O;$O,fuse_projections;$O,fuse_projections,group_modulation;best"
  lane A 0 40 <<EOT &
60 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_wam.py -k "gpu or cuda" 2>&1 | tail -3
150 $V matrix $W --variants "$VS" --sparsity none --warmup 3 --iters 20 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_levers_s18.json
120 $V matrix $W --variants "$VS" --sparsity drop_middle --warmup 3 --iters 20 --no-progress --compile-cache /tmp/fcW --json $R/matrix_wam-761_levers_s18_drop.json
60 $V bench $W --levers best --compile-cache /tmp/fcW $B --json $R/bench_wam-761_best-s18d_model.json
60 $PK --sequence $R/kernel_sequence_wam-761_best_s18.txt > $R/kernels_wam-761_best_s18.txt 2>&1; grep -A10 "^per call" $R/kernels_wam-761_best_s18.txt
80 $V check $W --levers best --seeds 1 --compile-cache /tmp/fcW --json $R/check_wam-761_best_s18.json
60 $V bench $W --levers best --batch 4 --compile-cache /tmp/fcW $B --json $R/bench_wam-761-b4_best-s18_model.json
EOT
  ;;
esac
finish
