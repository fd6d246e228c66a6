#!/usr/bin/env bash
# What the next session could run on the GPUs, in priority order (after session 2).
# Run on nvidia-h200-x2 (two lanes, one per GPU); carry .whl (benchmarks/ray_wheels.sh) for lane A.
#   A (both GPUs first): `matrix --ray` on libero-pi0 (issue 7's sweep on real GPUs, not yet run there);
#   then, one lane per GPU: the cumulative table as it now ends (at `best` with the Triton kernels) and
#   pi0.5 `best` again alongside `graph` (the kernels do not apply to pi0.5 yet).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200_next.sh
set -u
export PYTHONUNBUFFERED=1
R=/tmp/results; mkdir -p "$R"
PART=matrix WORKLOAD=libero-pi0 bash benchmarks/h200x2_ray_serve.sh 2>&1 | tail -25
export PYTHONPATH=$PWD:/tmp/site
V="python3 -m vlaperf.cli"
(CUDA_VISIBLE_DEVICES=0 timeout 400 $V matrix --workload libero-pi0 --variants cumulative --no-progress --iters 30 --warmup 5 \
   --json $R/matrix_libero-pi0_cumulative_best.json 2>&1 | grep -v -i warn | tail -20 > $R/lane_A.log; tar czf "$OUT/lane_A.tgz" -C /tmp results) &
(CUDA_VISIBLE_DEVICES=1 timeout 300 $V matrix --workload libero-pi05 --variants "graph;best" --no-progress --iters 30 --warmup 5 \
   --json $R/matrix_libero-pi05_graph_best.json 2>&1 | grep -v -i warn | tail -12 > $R/lane_B.log; tar czf "$OUT/lane_B.tgz" -C /tmp results) &
wait
cat $R/lane_A.log $R/lane_B.log
