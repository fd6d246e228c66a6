#!/bin/bash
# Session 19's device calls on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=a   the step kernel's attention with its value / output dims in parts a task (att_dsplit, new):
#            sweep 36 with the timeline (32-row blocks in 2 dim parts, 32-row blocks alone, with 32-key
#            tiles), then the libero-pi0 call with att_bm=32 att_dsplit=2 against the defaults, in one process
#   PART=b   sweep 37 (the attention's key tiles pipelined), then the call with its fastest row against the
#            defaults if that row was at least 1% faster than them in the sweep
#   PART=c   (carry .whl) libero-pi0 served as `best` (max batch 1) under loadgen, one client
#   PART=d   the call with Gemma's gate_up as two GEMMs of its halves against the stacked one (change_ab.py)
#   PART=e   libero-pi0 best in a fresh process, and its check
#   PART=f   where best's first call goes (first_call.py cold and warm), and the bench's first call again
#   PART=g   the first call of session 16's code against today's, cold, alternating on one instance
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session19.sh
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
case "${PART:-a}" in
a)
  lane A 0 40 <<EOT &
230 python3 benchmarks/expert_step_bench.py --sweep 36 --timeline --no-phases --json $R/kernel_expert_step_sweep36.json | grep -v timeline
250 python3 benchmarks/step_config_ab.py --base "" --new "att_bm=32 att_dsplit=2" --rounds 50 --json $R/step_config_ab_libero-pi0_att_dsplit.json
EOT
  ;;
b)
  # sweep 37, then the call with the sweep's fastest row against the defaults if it beat them by 1% (pick_row.py)
  lane A 0 40 <<EOT &
230 python3 benchmarks/expert_step_bench.py --sweep 37 --timeline --no-phases --json $R/kernel_expert_step_sweep37.json | grep -v timeline
250 NEW=\$(python3 benchmarks/pick_row.py $R/kernel_expert_step_sweep37.json 0.99) && python3 benchmarks/step_config_ab.py --base "" --new "\$NEW" --rounds 50 --json $R/step_config_ab_libero-pi0_sweep37_best.json
EOT
  ;;
c)
  # (carry .whl: websockets and msgpack for the server) libero-pi0 served as `best`, one client: the round trip a
  # closed loop sees, against the model-mode call (13.1 ms) and policy mode (14.2 ms)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
  lane A 0 40 <<EOT &
200 bash -c 'setsid $V serve --workload libero-pi0 --levers best --max-batch 1 --port 8765 --warmup-batches 1 --compile-cache /tmp/fc > $R/serve_libero-pi0_best.log 2>&1 & SP=\$!; for i in \$(seq 150); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 120 $V loadgen --url ws://127.0.0.1:8765 --clients 1 --requests 200 --warmup 10 --json $R/loadgen_libero-pi0_best.json; kill -TERM \$SP; tail -5 $R/serve_libero-pi0_best.log'
EOT
  ;;
d)
  # Gemma's gate_up as two GEMMs of its halves (no memset node; layers.SPLIT_GATE_UP) against the stacked GEMM
  lane A 0 40 <<EOT &
250 python3 benchmarks/change_ab.py --change split_gate_up --rounds 60 --json $R/change_ab_libero-pi0_split_gate_up.json
EOT
  ;;
e)
  # closing: libero-pi0 best in a fresh process and its equivalence check, at the session's last code
  lane A 0 40 <<EOT &
120 $V bench --workload libero-pi0 --levers best $B --json $R/bench_libero-pi0_best-s19_model.json
120 $V check --workload libero-pi0 --levers best --seeds 2 --json $R/check_libero-pi0_best_s19.json
EOT
  ;;
f)
  # part e's first call took 17.3 s (9.4-13.6 in sessions 11-16, 11.8 s for part c's served warm-up): where it went,
  # cold then warm, on one instance; then the bench's own first call in a fresh process
  lane A 0 40 <<EOT &
120 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcF --json $R/first_call_libero-pi0_best-s19_cold.json
90 python3 benchmarks/first_call.py --workload libero-pi0 --levers best --compile-cache /tmp/fcF --json $R/first_call_libero-pi0_best-s19_warm.json
100 $V bench --workload libero-pi0 --levers best --no-progress --iters 20 --warmup 5 --json $R/bench_libero-pi0_best-s19f_model.json
EOT
  ;;
g)
  # the first call of session 16's code (fd6b0b9) against today's, cold, alternating on one instance. Before the call,
  # on the CPU machine: mkdir old16 && git archive fd6b0b9 vlaperf benchmarks/first_call.py benchmarks/kernel_timing.py
  # | tar x -C old16 (untracked, so the device tool carries it; deleted after). The call ran these lines directly
  # (not through a lane); the s16code files' env.git_commit was set to fd6b0b9 afterwards, with a note saying so
  F="benchmarks/first_call.py --workload libero-pi0 --levers best"
  for i in 1 2; do
    (cd old16 && PYTHONPATH=$PWD timeout 70 python3 $F --compile-cache /tmp/o$i --json $OUT/first_call_s16code_cold$i.json 2>&1 | grep "first call")
    timeout 70 python3 $F --compile-cache /tmp/n$i --json $OUT/first_call_s19code_cold$i.json 2>&1 | grep "first call"
  done
  exit 0
  ;;
esac
finish
