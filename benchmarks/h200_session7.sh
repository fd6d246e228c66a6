# Session 7's device runs, by part (one call each); every file records the commit it ran.
#   PART=a   A: the step kernel's defaults with 20 repeated launches checked bit for bit; the
#              kernel for 4 samples in one launch (its first timing); sweep 14 (dataflow waits
#              instead of two barriers a layer); Nsight Compute's memory sections and warp
#              states on the step kernel's defaults (what its loads wait on)
#            B: libero-pi0-b4, best against best with megakernel=batched (4 samples a step
#              launch), interleaved and equivalence-checked; then tma_probe.py: the step
#              kernel's matmul tasks streaming 18 layers, pointer loads against TMA loads
#   PART=b   A: sweep 15 (prefetch plans: every program asks L2 for a later phase's weights in the
#              phases that read nothing from HBM) with timelines; tma_probe.py --l2 (does a task
#              read faster when its weights are in L2?)
#            B: the whole call, best against best with prefetch=2, interleaved (step_config_ab);
#              then vlaperf bench of libero-pi0-b4 / -b8 / libero-pi0 with today's best
#              (megakernel takes batch 4)
#            (sweep 15 did not run: the bench's --sweep choices stopped at 14)
#   PART=c   A: sweep 15 again (choices now follow the sweep table); sweep 16 (4 warps); the kernel table of best at
#              batch 4 (the step kernel with 4 samples)
#            B: T(N) at batch 4, best against best less megakernel; vlaperf bench libero-pi0 and
#              -b8 again, now with the GPU's clocks and power in the environment record
#   PART=d   the batch-4 question once more, after megakernel went back to batch 1 (d6782fd):
#              part a's matrix (best against best with megakernel=batched, the reference
#              interleaved) on both GPUs, in both orders: does the matrix reproduce its 1.08x
#              for the batched kernel, which T(N) in part c contradicted (1.53 against 2.10 ms a step)?
#            (both orders: best 42.3 / 42.4 ms against 39.7 / 39.5 with megakernel=batched)
#   PART=e   is it the unused megakernel lever? At batch 4 `best` (megakernel on, not applied:
#              the layers) against best less megakernel, in one matrix; and each alone in bench
#            (no: 33.19 / 33.20 ms; bench 34.14 / 34.28. Only matrices holding the batched engine
#              timed the layers at ~42 ms)
#   PART=f   A: prefix_tiles_ab.py: the prefix attention kernel's tiles swept on the prefix's
#              shape (key splits, row blocks), the fastest against today's in the whole call
#            B: where policy mode's extra time goes (breakdown, best, policy mode); libero-pi0
#              policy-mode bench with the GPU state
#            (prefix tiles: 24.0 against 28.6 us a layer, the call 1.005x: adopted; policy mode's
#              host-side stages: transform 0.16, host-to-device 0.32, image preprocess 0.17 ms)
#   PART=g   A: policy mode after the packed upload (one pinned staging buffer, one copy; images
#              at the model's size skip the per-image path): bench and breakdown
#            B: libero-pi0 model-mode bench with the new prefix tiles
#            (policy 15.39 ms against 15.51 before, other GPUs; model 14.87)
#   PART=next  (prepared for session 8, not run) the batch-4 matrix puzzle (perf notes 22b): the
#              kernel table of best (layers) at batch 4 alone, and with the batched engine built,
#              run and checked in the same process first
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session7.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, and the lever lists $X / $G, $V, $B
case "${PART:-a}" in
a)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  lane A 0 60 <<EOT &
100 python3 benchmarks/expert_step_bench.py --quick --json $R/kernel_expert_step_s7.json
100 python3 benchmarks/expert_step_bench.py --quick --samples 4 --json $R/kernel_expert_step_b4_s7.json
150 python3 benchmarks/expert_step_bench.py --sweep 14 --timeline --json $R/kernel_expert_step_sweep14.json
200 $NCU --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats -f -o /tmp/step_mem python3 benchmarks/step_kernel_once.py && $NCU -i /tmp/step_mem.ncu-rep --page details > $R/step_ncu_memory_s7.txt; tail -60 $R/step_ncu_memory_s7.txt
EOT
  lane B 1 60 <<EOT &
330 $V matrix --workload libero-pi0-b4 --variants "best;$G,megakernel=batched" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_batched_s7.json
200 python3 benchmarks/tma_probe.py --json $R/tma_probe.json
EOT
  ;;
b)
  lane A 0 60 <<EOT &
330 python3 benchmarks/expert_step_bench.py --sweep 15 --timeline --json $R/kernel_expert_step_sweep15.json
200 python3 benchmarks/tma_probe.py --l2 --json $R/tma_probe_l2.json
EOT
  lane B 1 20 <<EOT &
240 python3 benchmarks/step_config_ab.py --base "" --new "prefetch=2" --json $R/step_config_ab_libero-pi0_prefetch2.json
120 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s7_model.json
120 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s7_model.json
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s7_model.json
EOT
  ;;
c)
  lane A 0 60 <<EOT &
300 python3 benchmarks/expert_step_bench.py --sweep 15 --timeline --json $R/kernel_expert_step_sweep15.json
150 python3 benchmarks/expert_step_bench.py --sweep 16 --json $R/kernel_expert_step_sweep16.json
120 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best > $R/kernels_best_b4_s7.txt 2>&1; tail -10 $R/kernels_best_b4_s7.txt
EOT
  lane B 1 20 <<EOT &
330 $V scaling --workload libero-pi0-b4 --levers "best;$G" --no-progress --json $R/scaling_libero-pi0-b4_best_s7.json --plot $R/scaling_libero-pi0-b4_best_s7.png
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s7c_model.json
120 $V bench --workload libero-pi0-b8 --levers best $B --json $R/bench_libero-pi0-b8_best-s7c_model.json
EOT
  ;;
d)
  lane A 0 30 <<EOT &
300 $V matrix --workload libero-pi0-b4 --variants "best;$G,megakernel=batched" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_batched_s7d.json
EOT
  lane B 1 30 <<EOT &
300 $V matrix --workload libero-pi0-b4 --variants "$G,megakernel=batched;best" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_batched_s7d_reversed.json
EOT
  ;;
e)
  lane A 0 30 <<EOT &
240 $V matrix --workload libero-pi0-b4 --variants "$G;best" --no-progress --iters 30 --warmup 5 --json $R/matrix_libero-pi0-b4_megakernel-unused_s7e.json
EOT
  lane B 1 20 <<EOT &
120 $V bench --workload libero-pi0-b4 --levers best $B --json $R/bench_libero-pi0-b4_best-s7e_model.json
120 $V bench --workload libero-pi0-b4 --levers "$G" $B --json $R/bench_libero-pi0-b4_best-less-megakernel-s7e_model.json
EOT
  ;;
f)
  lane A 0 40 <<EOT &
300 python3 benchmarks/prefix_tiles_ab.py --json $R/prefix_tiles_ab_libero-pi0.json
EOT
  lane B 1 40 <<EOT &
150 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best_policy_s7.json
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s7_policy.json
EOT
  ;;
g)
  lane A 0 40 <<EOT &
100 $V bench --workload libero-pi0 --levers best --mode policy $B --json $R/bench_libero-pi0_best-s7g_policy.json
120 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best_policy_s7g.json
EOT
  lane B 1 20 <<EOT &
100 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s7g_model.json
EOT
  ;;
next)
  lane A 0 20 <<EOT &
200 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best > $R/kernels_b4_layers_alone_s8.txt 2>&1; tail -10 $R/kernels_b4_layers_alone_s8.txt
EOT
  lane B 1 20 <<EOT &
300 python3 benchmarks/profile_kernels.py --workload libero-pi0-b4 --rows 30 --levers best --also "$G,megakernel=batched" > $R/kernels_b4_layers_beside_batched_s8.txt 2>&1; tail -10 $R/kernels_b4_layers_beside_batched_s8.txt
EOT
  ;;
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
