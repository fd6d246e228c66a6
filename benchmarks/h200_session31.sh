#!/bin/bash
# Session 31's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   version 113, the step's kernel mask made once a call in 16-byte rows: the GPU tests of the step kernel
#            and the masks, then change_ab for mask_align (libero-pi0; 8 valid prompt tokens, 520 prefix rows;
#            libero-pi0-b4) and mask_once, and the kernel tables of prompt 40 against 48
#   PART=b   closing checks: the step kernel's registers and spills under the machine's Triton (production and
#            timeline builds), the GPU tests of the graph breakdown, UniPC and the world-action engine, a traced
#            breakdown's stderr (kineto's notices left out), and libero-pi0 `best` at the session's last code
#   PART=c   why pi0.5's setup stage is 0.26 ms against pi0's 0.12 (session 30's breakdowns): launch_probe.py's call
#            and its pieces (input copies, replay, the graph's nodes) for libero-pi05 and libero-pi0, one instance
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session31.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 30 <<EOT &
120 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_kernels.py tests/test_engine.py -k "megakernel or step_kernel or mask" 2>&1 | tail -4
90 cd benchmarks && python3 change_ab.py --change mask_align --rounds 60 --json $R/change_ab_libero-pi0_mask_align_s31.json
90 cd benchmarks && python3 change_ab.py --change mask_once --rounds 60 --json $R/change_ab_libero-pi0_mask_once.json
90 cd benchmarks && python3 change_ab.py --change mask_align --valid 8 --rounds 40 --json $R/change_ab_libero-pi0_mask_align_valid8.json
90 cd benchmarks && python3 prompt_len_probe.py --lengths 40,48 --rounds 20 --kernels $R/kernels_s31 --json $R/prompt_len_probe_libero-pi0_s31.json
90 cd benchmarks && python3 change_ab.py --change mask_align --workload libero-pi0-b4 --rounds 40 --json $R/change_ab_libero-pi0-b4_mask_align.json
EOT
  ;;
b)
  lane A 0 40 <<EOT &
60 cd benchmarks && python3 -c "import kernel_resources as r; from vlaperf.engine.kernels import expert_step as S; c = S.StepKernelConfig(); [print('timeline', tl, {k: v for k, v in r.compile_kernel(S._expert_step_kernel, r.whole_kernel_constexprs(c, tl, 1), c.num_warps, c.num_stages, ptxas=True).items() if k in ('registers', 'spill_store_bytes', 'spill_load_bytes', 'shared_bytes')}) for tl in (False, True)]"
200 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_profile_breakdown.py tests/test_unipc.py tests/test_wam.py -k "cuda" -rs 2>&1 | tail -6
60 $V breakdown --workload tiny --device cuda --levers best --warmup 2 --iters 5 --no-progress --trace $R/trace_tiny.json 2>$R/trace_stderr.txt | tail -2; echo "stderr lines: \$(wc -l < $R/trace_stderr.txt)"; head -5 $R/trace_stderr.txt; rm -f $R/trace_tiny.json
150 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s31_model.json
EOT
  ;;
c)
  lane A 0 40 <<EOT &
200 python3 benchmarks/launch_probe.py --workload libero-pi05 --levers best --call-only --rounds 100 --json $R/launch_probe_libero-pi05_best_s31.json
150 python3 benchmarks/launch_probe.py --workload libero-pi0 --levers best --call-only --rounds 100 --json $R/launch_probe_libero-pi0_best_s31.json
EOT
  ;;
esac
finish
