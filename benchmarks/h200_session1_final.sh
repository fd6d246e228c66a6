#!/usr/bin/env bash
# The session's closing device call: best variant of libero-pi0 (first call = compile +
# capture, timed before the equivalence check), batch 8 throughput, the profiler's breakdown /
# scaling / syncs on libero-pi0, the server under 1/4/8 clients, then the other workloads.
# Ordered by priority; results are re-tarred into $OUT/results.tgz after every command, so a
# run cut short by the time limit still returns what it finished.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200_session1_final.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # websockets, for the server
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
run() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | grep -v -i "warn" | tail -16; tar czf "$OUT/results.tgz" -C /tmp results; }
B="--no-progress --warmup 10 --iters 50"
run 110 $V bench --workload libero-pi0 --levers best $B --json "$R/bench_libero-pi0_best-compile_model.json"
run 50 $V bench --workload libero-pi0-b8 --levers graph $B --json "$R/bench_libero-pi0-b8_graph_model.json"
run 60 $V breakdown --workload libero-pi0 --levers reference --warmup 3 --iters 10 --no-progress --json "$R/breakdown_libero-pi0_reference.json"
run 50 $V breakdown --workload libero-pi0 --levers graph --warmup 3 --iters 20 --no-progress --json "$R/breakdown_libero-pi0_graph.json"
run 50 $V scaling --workload libero-pi0 --levers graph --steps 1,2,5,10,20 --no-progress --json "$R/scaling_libero-pi0_graph.json"
run 40 $V syncs --workload libero-pi0 --levers reference --json "$R/syncs_libero-pi0_reference.json"
run 40 $V syncs --workload libero-pi0 --levers graph --json "$R/syncs_libero-pi0_graph.json"
if python3 -c "import websockets" 2>/dev/null; then
  timeout 120 $V serve --workload libero-pi0 --levers graph --port 8765 --warmup-batches all > "$R/serve.log" 2>&1 &
  for i in $(seq 60); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8765/healthz', timeout=2)" 2>/dev/null && break; sleep 1; done
  run 60 $V loadgen --url ws://127.0.0.1:8765 --clients 1,4,8 --requests 40 --warmup 3 --json "$R/loadgen_libero-pi0_graph.json"
  kill %1 2>/dev/null; wait
fi
run 80 $V bench --workload libero-shallow6 --levers best $B --json "$R/bench_libero-shallow6_best-compile_model.json"
run 100 $V bench --workload libero-pi05 --levers best $B --json "$R/bench_libero-pi05_best-compile_model.json"
run 50 $V bench --workload libero-pi0-b4 --levers graph $B --json "$R/bench_libero-pi0-b4_graph_model.json"
