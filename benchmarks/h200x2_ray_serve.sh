#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (2 GPUs): loadgen throughput of libero-pi0 (levers graph)
# served three ways by the same front end: in-process (no Ray), Ray Serve with 1 replica, and
# with 2 replicas (one GPU each). PART=matrix instead runs `matrix --ray` (cumulative variants
# of libero-pi0, one task per GPU); PART=all does both (about 10 minutes: may not fit one call).
# SERVERS="ray1 ray2" runs only the Ray ones (the in-process figure of session 1 is the baseline).
# Needs the wheels of benchmarks/ray_wheels.sh in .whl (carry [".whl"]).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> bash benchmarks/h200x2_ray_serve.sh
# (CPU smoke test: WORKLOAD=tiny LEVERS=exact NO_WHEELS=1 OUT=/tmp/out bash benchmarks/h200x2_ray_serve.sh)
set -u
export PYTHONUNBUFFERED=1
if [ -z "${NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site
W=${WORKLOAD:-libero-pi0} L=${LEVERS:-graph}
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
save() { tar czf "$OUT/results.tgz" -C /tmp results; }
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used --format=csv 2>/dev/null
python3 -c "import torch, ray; from ray import serve; print('gpus', torch.cuda.device_count(), 'torch', torch.__version__, 'ray', ray.__version__)" || exit 1
PART=${PART:-serve}

serve_and_load() {  # NAME [serve options...]: start, wait for /healthz, loadgen, SIGTERM, wait
  local name=$1; shift
  echo "== serve $name $*"
  setsid $V serve --workload $W --levers $L --port 8765 --warmup-batches all "$@" > "$R/serve_$name.log" 2>&1 &
  local pid=$! ok=0
  for _ in $(seq 240); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8765/healthz', timeout=2)" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if [ $ok = 1 ]; then
    timeout 150 $V loadgen --url ws://127.0.0.1:8765 --clients 1,2,4,8,16 --requests 40 --warmup 3 \
      --json "$R/loadgen_${W}_${L}_$name.json" 2>&1 | grep -v -i warn | head -12
  else
    echo "server $name did not come up"; tail -20 "$R/serve_$name.log"
  fi
  kill -TERM $pid 2>/dev/null
  for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -KILL -- -$pid 2>/dev/null
  save
}

if [ "$PART" = serve ] || [ "$PART" = all ]; then
  for name in ${SERVERS:-inproc ray1 ray2}; do  # SERVERS="ray1 ray2" skips the in-process one
    case $name in
      inproc) serve_and_load inproc ;;
      ray*) serve_and_load "$name" --replicas "${name#ray}" ;;
    esac
  done
  python3 - "$R" "$W" "$L" <<'EOF'
import json, sys, pathlib
for name in ("inproc", "ray1", "ray2"):
    p = pathlib.Path(sys.argv[1]) / f"loadgen_{sys.argv[2]}_{sys.argv[3]}_{name}.json"
    if not p.exists():
        print(name, "missing"); continue
    r = json.loads(p.read_text())
    print(name, " ".join(f"{ph['clients']}c:{ph['requests_per_s'] or 0:.1f}rps/p50 {(ph['round_trip_ms'] or {}).get('median', 0):.1f}ms"
                         f"/b{(ph['batch_size'] or {}).get('mean', 0):.2f}" for ph in r["loadgen"]["phases"]),
          "passed" if r["loadgen"]["passed"] else "FAILED")
EOF
fi

if [ "$PART" = matrix ] || [ "$PART" = all ]; then
  echo "== matrix --ray"
  if $V matrix --help | grep -q -- "--ray"; then
    timeout 420 $V matrix --ray --workload $W --variants cumulative --no-progress \
      --json "$R/matrix_${W}_cumulative_ray.json" 2>&1 | grep -v -i warn | tail -20
  else  # before vlaperf.cli registers --ray
    timeout 420 python3 - "$R" "$W" <<'EOF' 2>&1 | grep -v -i warn | tail -20
import sys
from vlaperf.profile.ray_matrix import print_ray_matrix, ray_matrix
from vlaperf.report.schema import write_result
from vlaperf.serve.ray_backend import ray_init
ray_init()
(result,) = ray_matrix([sys.argv[2]], "cumulative", warmup=10, iters=50)
print_ray_matrix(result)
write_result(result, f"{sys.argv[1]}/matrix_{sys.argv[2]}_cumulative_ray.json")
EOF
  fi
  save
fi
