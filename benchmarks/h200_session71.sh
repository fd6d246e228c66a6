#!/bin/bash
# Session 71's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from. Carry [".whl"].
# Session 69's H200 part (PART=x of h200_session69.sh; its predictions stand, written there before any run) at today's
# engine, then the host cost of the two contexts session 70 put around every engine call (`torch.cuda.device` of the
# engine's GPU; leaving torch.inference_mode() where the caller is in it), through benchmarks/call_overhead.py.
#   PART=a   on an H200: session 69's H200 steps (the two breakdowns, then `best` of every other workload), then
#            call_overhead.py on libero-pi0 `best`. On another card: call_overhead.py only (the H100 rows are current).
#            Predictions for call_overhead.py, written before the run:
#              contexts_host_us: nullcontext 0.05-0.25 us (0.20 on the CPU machine); the engine's GPU made
#                current (already current) 1-5 us; the inference-mode check outside inference mode 0.15-0.5 us
#                (0.25 on the CPU machine), inside 0.8-2. So the two add 1-5 us to a call whose host side is
#                ~150 us: 1-3% of the host side, <0.05% of 12.8 ms.
#              the call over its replay alone: 0.06-0.10 ms (0.074 ms in version 33's file, at 1553334).
#            Outcome (H100, 22:56, af9c4c8): only the probe ran (an H100). Contexts: nullcontext 0.28 us (a miss
#              by 0.03), the engine's GPU current 2.36, the check outside 0.42, inside 1.90 (as predicted); the
#              call over its replay 0.125 ms (a miss, high: perf-notes, session 71).
#   PART=b   what part a's call did not reach: its steps after the first SKIP (SKIP=N), on the same kind of card.
#   PART=t/u the whole GPU suite on any card, last run in session 65 (sessions 66-70 changed the engine's per-call
#            contexts, the released-weights check, real-time chunking's graph inputs, serving's batcher, the hub, the
#            report, ...): lanes.sh's gpu_suite_steps 1, 2 and 4 (t), then step 3 (u), logs pytest_gpu_s71{t,u}N.log.
#            Prediction: all pass, with more tests than session 65's (48 passed 11 skipped; 365 passed; 11 passed 1
#            skipped; 1361 passed 40 skipped), the skips LeRobot/openpi/Ray, Triton < 3.9 and two-GPU cases only.
#   PART=o   on any card (carry [".whl", "old_1553334"]: `git archive 1553334 vlaperf benchmarks/call_overhead.py
#            benchmarks/engine_ab.py` extracted into old_1553334/, git-ignored through .git/info/exclude): the
#            call over its replay at version 33's commit (the 0.074 ms file) and at today's, one machine, one process
#            each, old first. Part a's H100 file read 0.125 ms at today's commit; the pieces (input copies 0.050 ms and
#            the output's clone 0.022, each less its sync) leave ~0.05 ms for the call's Python, of which the two new
#            contexts measured 2.8 us. Prediction: the old commit's call over replay 0.06-0.09 ms on this
#            machine, today's 0.03-0.06 ms more (the checks and bookkeeping added since: released weights,
#            dtype/device, guidance, prompt-length, ~15 us of it measured on the CPU machine for
#            check_sample_inputs, plan and key alone).
#            Then the GPU suite's step 3 (as part u).
#   PART=v   after the calls that got no machine: what fits one call, the GPU suite's steps 1 and 2 (the CUDA
#            engine, the kernels, the world-action model, the engine, UniPC), part o's
#            pair (carry [".whl", "old_1553334"]). Predictions as parts t and o. Step 4 left out: after eight refused
#            calls (to 00:08) the budget holds one call of ~470 s.
#   PART=w   the last ~300 s of the budget: the GPU suite's step 1 alone (the CUDA engine, where session 70's per-call
#            contexts and released-weights check run on a GPU, and the kernels). Prediction: all pass.
# Outcome of parts t, u, v, w and o: none ran. Thirteen calls got no machine (23:05-00:52), and the budget ran out.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session71.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, gpu_setup, $V, $B
gpu_setup  # GPU_NAME
overhead() {
  echo "90 python3 benchmarks/call_overhead.py --workload libero-pi0 --levers best --json $R/call_overhead_libero-pi0_best-s71.json"
}
breakdowns() {
  for w in libero-pi0 libero-pi05; do
    echo "100 $V breakdown --workload $w --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_${w}_best-s71.json"
  done
}
bench() {  # bench WORKLOAD FILE_STEM [options]
  local w=$1 stem=$2; shift 2
  echo "110 $V bench --workload $w --levers best $* $B --json $R/bench_${stem}_best-s71_model.json"
}
h200_steps() {  # session 69's H200 steps (its predictions), in the issue's order
  breakdowns
  for w in libero-pi05 libero-shallow6 libero-pi0-b4 libero-pi0-b8 aloha-pi0 wam-761 aloha-pi05 droid-pi0 droid-pi05; do
    bench $w $w
  done
  bench libero-pi05 libero-pi05-h50 --action-horizon 50
  bench wam-761 wam-761-b4 --batch 4
  overhead
}
overhead_ab() {  # part o's pair: version 33's commit, then today's
  echo "90 cd old_1553334 && VLAPERF_GIT_COMMIT=15533343d31d2945c2131824d31a4ccd1d2b1bdc PYTHONPATH=\$PWD python3 benchmarks/call_overhead.py --json $R/call_overhead_libero-pi0_best-s71-at1553334.json"
  echo "90 python3 benchmarks/call_overhead.py --json $R/call_overhead_libero-pi0_best-s71o.json"
}
case "${PART:-a}:$GPU_NAME" in
  t:*) gpu_suite_steps s71t 1 2 4 ;;
  u:*) gpu_suite_steps s71u 3 ;;
  o:*) overhead_ab; gpu_suite_steps s71u 3 ;;
  v:*) gpu_suite_steps s71t 1 2; overhead_ab ;;
  w:*) gpu_suite_steps s71t 1 ;;
  a:*H200*) h200_steps ;;
  a:*) overhead ;;
  b:*H200*) h200_steps | tail -n +$((${SKIP:-0} + 1)) ;;
  b:*) overhead ;;
  *) echo "unknown PART=${PART}"; exit 2 ;;
esac | lane A 0 40 &
finish
