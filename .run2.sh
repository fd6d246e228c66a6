set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/results; mkdir -p "$R"
source benchmarks/lanes.sh
G=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,cuda_graph
lane A 0 60 <<EOT &
240 python3 benchmarks/expert_step_bench.py --sweep 3 --json $R/kernel_expert_step_sweep3.json
EOT
lane B 1 30 <<EOT &
400 python3 -m vlaperf.cli matrix --workload libero-pi0 --variants "best;$G,compile=default,megakernel" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0_megakernel_tuned.json
EOT
wait
cat $R/lane_A.log $R/lane_B.log
