# Session 7's device runs, by part (one call each); every file records the commit it ran.
#   PART=a   A: the step kernel's defaults with 20 repeated launches checked bit for bit; the
#              kernel for 4 samples in one launch (its first timing); sweep 14 (dataflow waits
#              instead of two barriers a layer); Nsight Compute's memory sections and warp
#              states on the step kernel's defaults (what its loads wait on)
#            B: libero-pi0-b4, best against best with megakernel=batched (4 samples a step
#              launch), interleaved and equivalence-checked; then tma_probe.py: the step
#              kernel's matmul tasks streaming 18 layers, pointer loads against TMA loads
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
esac
finish  # lanes.sh: waits for both lanes, then $OUT/results.tgz holds every finished file
