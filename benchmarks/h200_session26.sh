#!/bin/bash
# Session 26's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the serving workloads of openpi's DROID and pi0.5 ALOHA checkpoints (droid-pi0: pi0 with 10 actions a
#            chunk, 11 suffix rows in the step kernel; droid-pi05: pi0.5 with 15; aloha-pi05: pi0.5 with 3 cameras and
#            50): `vlaperf check` of best against the reference, then the bench of best in
#            model mode, and droid-pi05's policy mode (the DROID observation keys through the transform on the GPU)
#   PART=b   pi0's step kernel at droid-pi0's 11 suffix rows (a 16-row block, as pi0.5's 10-15): the norm statistics
#            from the writers (ssq_from_writers, with stats_ahead), which lost at pi0's 51 rows (versions 60, 81: spills
#            with a 64-row block) while pi0.5 gained 1.17x from them at 10 rows (version 62). Kernel sweep 23 on the
#            engine's own arguments, then the whole call, both sides in one process (step_config_ab.py)
#   PART=c   part b's ssq_from_writers made the fitted default for one sample's 16-row block: droid-pi0's check and
#            bench of best in fresh processes, libero-pi0's bench (its 64-row block keeps the old path), then kernel
#            sweep 26 (key splits, merge chunks, K depths, warps, stages) around the new defaults at droid-pi0's rows
#   PART=d   (carry .whl: websockets and openpi-client) droid-pi05 served as `best` with openpi:pi05_droid (max batch
#            1): openpi's own client with observations built as its DROID example builds them, then `vlaperf loadgen`
#   PART=e   libero-pi0 (51 rows, a 64-row block) with the writers' statistics again (versions 60 and 81 lost 0.92x and
#            0.91x, spilling under Triton 3.6 in 60), now with 64-deep K blocks for qkv and gate_up (fewer registers:
#            version 72's ssq_mma did not spill at 64), and without them, each against today's defaults in one process
#   PART=f   where the writers' statistics gain at 16 rows and lose at 64 (versions 108, 109): kernel sweep 38 (on and
#            off) with the GPU clock's timeline, on the engine's own arguments for droid-pi0 and for libero-pi0
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session26.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
200 $V check --workload droid-pi05 --levers best --seeds 2 --json $R/check_droid-pi05_best_s26.json
120 $V bench --workload droid-pi05 --levers best $B --json $R/bench_droid-pi05_best_model.json
120 $V bench --workload droid-pi05 --levers best --mode policy $B --json $R/bench_droid-pi05_best_policy.json
200 $V check --workload droid-pi0 --levers best --seeds 2 --json $R/check_droid-pi0_best_s26.json
120 $V bench --workload droid-pi0 --levers best $B --json $R/bench_droid-pi0_best_model.json
200 $V check --workload aloha-pi05 --levers best --seeds 2 --json $R/check_aloha-pi05_best_s26.json
120 $V bench --workload aloha-pi05 --levers best $B --json $R/bench_aloha-pi05_best_model.json
EOT
  ;;
b)
  lane A 0 60 <<EOT &
200 python3 benchmarks/expert_step_bench.py --from-engine droid-pi0 --sweep 23 --no-phases --json $R/kernel_expert_step_droid-pi0_sweep23.json
170 python3 benchmarks/step_config_ab.py --workload droid-pi0 --base "" --new "ssq_from_writers=1" --json $R/step_config_ab_droid-pi0_ssq_writers.json
170 python3 benchmarks/step_config_ab.py --workload droid-pi0 --base "" --new "ssq_from_writers=1 bk_qkv=256 bk_gu=256" --json $R/step_config_ab_droid-pi0_ssq_writers_k256.json
EOT
  ;;
c)
  lane A 0 60 <<EOT &
150 $V check --workload droid-pi0 --levers best --seeds 2 --json $R/check_droid-pi0_best_s26c.json
120 $V bench --workload droid-pi0 --levers best $B --json $R/bench_droid-pi0_best-s26c_model.json
120 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s26_model.json
200 python3 benchmarks/expert_step_bench.py --from-engine droid-pi0 --sweep 26 --no-phases --json $R/kernel_expert_step_droid-pi0_sweep26.json
EOT
  ;;
d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 40 <<EOT &
240 bash -c 'setsid $V serve --workload droid-pi05 --conventions openpi:pi05_droid --levers best --max-batch 1 --port 8765 --warmup-batches 1 > $R/serve_droid-pi05_best.log 2>&1 & SP=\$!; for i in \$(seq 150); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 60 python3 benchmarks/openpi_client_smoke.py --port 8765 --requests 50; timeout 120 $V loadgen --url ws://127.0.0.1:8765 --clients 1 --requests 200 --warmup 10 --json $R/loadgen_droid-pi05_best.json; kill -TERM \$SP; tail -8 $R/serve_droid-pi05_best.log'
EOT
  ;;
e)
  lane A 0 40 <<EOT &
170 python3 benchmarks/step_config_ab.py --workload libero-pi0 --base "" --new "ssq_from_writers=1 bk_qkv=64 bk_gu=64" --json $R/step_config_ab_libero-pi0_ssq_writers_k64.json
170 python3 benchmarks/step_config_ab.py --workload libero-pi0 --base "" --new "ssq_from_writers=1" --json $R/step_config_ab_libero-pi0_ssq_writers_s26.json
EOT
  ;;
f)
  lane A 0 80 <<EOT &
170 python3 benchmarks/expert_step_bench.py --from-engine droid-pi0 --sweep 38 --timeline --no-phases --json $R/kernel_expert_step_droid-pi0_sweep38.json
170 python3 benchmarks/expert_step_bench.py --from-engine libero-pi0 --sweep 38 --timeline --no-phases --json $R/kernel_expert_step_libero-pi0_sweep38.json
EOT
  ;;
esac
finish
