#!/usr/bin/env bash
# Session 2, closing device call (nvidia-h200-x2): `best` as it now resolves on a Hopper GPU
# (compile + graph + triton_kernels), one bench per lane.
# Usage: VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_session2_e.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
B="--no-progress --warmup 10 --iters 50"
(CUDA_VISIBLE_DEVICES=0 timeout 200 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-triton_model.json 2>&1 | grep -v -i warn | tail -12 > $R/lane_A.log; tar czf "$OUT/lane_A.tgz" -C /tmp results) &
(CUDA_VISIBLE_DEVICES=1 timeout 100 $V bench --workload libero-shallow6 --levers best $B --json $R/bench_libero-shallow6_best-triton_model.json 2>&1 | grep -v -i warn | tail -12 > $R/lane_B.log;
 CUDA_VISIBLE_DEVICES=1 timeout 110 $V bench --workload libero-pi0 --mode policy --levers best $B --json $R/bench_libero-pi0_best-triton_policy.json 2>&1 | grep -v -i warn | tail -12 >> $R/lane_B.log; tar czf "$OUT/lane_B.tgz" -C /tmp results) &
wait
cat $R/lane_A.log $R/lane_B.log
