# Sourced by the device scripts that run single-GPU jobs side by side, one lane per GPU:
#   lane NAME GPU [TAIL] <<EOF ... EOF &
# reads steps "budget_s command..." from stdin and runs them in order on that GPU (each under
# `timeout -k 30 budget_s`), keeping the last TAIL lines (default 40) of each step's output, warnings
# dropped, in $R/lane_NAME.log, and refreshing $OUT/lane_NAME.tgz (all of /tmp/results) after
# every step, so a lane cut short by the call's time limit still returns what it finished.
# Each lane's tgz holds all of /tmp/results as it was when that lane last wrote, so it may hold
# another lane's files half-written (the step bench writes after every row): `finish` waits
# for every lane and writes $OUT/results.tgz, the state after all of them. Extract that one;
# the lane tgz files are for a call cut short by its time limit.
# Also sets what the device scripts share: the results folder $R, the CLI $V, the lever lists
# $X (graph: every lever but compile and the kernels) and $G ($X + compile + triton_kernels:
# `best` less `megakernel`), and $B, the bench options.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/results; mkdir -p "$R"
V="python3 -m vlaperf.cli"
X=for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,cuda_graph
G=$X,compile=default,triton_kernels
B="--no-progress --iters 50 --warmup 10"
# pytest as the GPU suite runs it ($P, each failure printed when it happens), and $I, the modules of its first two
# steps, which the broad steps leave out
P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
I="--ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py"
lane() {
  local name=$1 gpu=$2 keep=${3:-40}
  while read -r t cmd; do
    [ -z "$t" ] && continue
    echo "== [$name $(date +%T)] $cmd"
    # SIGTERM at the step's budget (a matrix then writes the rows it has), SIGKILL 30 s later if it is still there
    # (session 28's part e: a matrix was still running 100 s after its SIGTERM, and the lane never returned)
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 30 "$t" bash -c "$cmd" 2>&1 | grep -v -i "warn" | tail -"$keep"
    tar czf "$OUT/lane_$name.tgz" -C /tmp results
  done > "$R/lane_$name.log" 2>&1
}
# The whole test suite on one GPU in four steps (the kernels and the CUDA engine; the world-action model, the
# engine and UniPC; the rest; then the rest's quiet_gpu and quiet_host tests, alone on the machine, whose timing
# assertions do not hold beside 13 other test processes), logs $R/pytest_gpu_TAG{1,2,3,4}.log: `gpu_suite TAG &`. The serve tests need
# websockets and openpi-client, which the machine lacks: carry their wheels in .whl (the device tool's carry [".whl"]).
gpu_suite() {
  local tag=$1
  install_wheels .whl /tmp/site || return
  export PYTHONPATH=/tmp/site:$PWD
  gpu_suite_steps "$tag" 1 2 3 4 | lane A 0 40
}
# gpu_suite's steps as lane steps, by number: `gpu_suite_steps TAG 1 2 4 | lane A 0 40 &` runs a part of the suite
# (a call's time limit holds steps 1, 2 and 4, or step 3)
gpu_suite_steps() {
  local tag=$1 n; shift
  for n in "$@"; do case $n in
    1) echo "170 $P -q -n 4 --timeout 160 tests/test_engine_cuda.py tests/test_kernels.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_${tag}1.log | grep -v '^\.*\['" ;;
    2) echo "150 $P -q -n 12 --timeout 140 tests/test_wam.py tests/test_engine.py tests/test_unipc.py tests/test_suite_setup.py 2>&1 | tee $R/pytest_gpu_${tag}2.log | grep -v '^\.*\['" ;;
    3) echo "240 $P -q -n 14 --timeout 220 --durations 5 -m 'not quiet_gpu and not quiet_host' $I 2>&1 | tee $R/pytest_gpu_${tag}3.log | grep -v '^\.*\['" ;;
    4) echo "90 $P -q --timeout 80 -m 'quiet_gpu or quiet_host' $I 2>&1 | tee $R/pytest_gpu_${tag}4.log | tail -5" ;;
    *) echo "gpu_suite_steps: no step $n (1-4)" >&2; return 2 ;;
  esac; done
}
# One robot against a fresh `vlaperf serve` of libero-pi0 `best` (warmed up at batch 1 only, the compile cache /tmp/cc):
# `serve_loadgen NAME MAX_BATCH` runs loadgen --clients 1 --requests 200 --warmup 10, then stops the server with
# SIGTERM; $R/serve_libero-pi0_best-NAME.log, $R/loadgen_libero-pi0_best-NAME.json. Exported for the lanes' bash -c.
serve_loadgen() {
  setsid python3 -m vlaperf.cli serve --workload libero-pi0 --levers best --max-batch "$2" --port 8765 \
    --warmup-batches 1 --compile-cache /tmp/cc > "$R/serve_libero-pi0_best-$1.log" 2>&1 & local sp=$!
  for i in $(seq 200); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8765/healthz', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  timeout 60 python3 -m vlaperf.cli loadgen --url ws://127.0.0.1:8765 --clients 1 --requests 200 --warmup 10 \
    --json "$R/loadgen_libero-pi0_best-$1.json" | tail -4
  kill -TERM $sp; wait $sp; tail -2 "$R/serve_libero-pi0_best-$1.log"
}
export -f serve_loadgen; export R
# The carried wheels (the device tool's carry) installed without the network into TARGET: `install_wheels .whl /tmp/site`
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" "$1"/*.whl
}
# The one-GPU scripts' start: the carried wheels (.whl) on the path, and GPU_NAME, the card this call got (said first)
gpu_setup() {
  install_wheels .whl /tmp/site
  export PYTHONPATH=/tmp/site:$PWD
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $GPU_NAME"
}
finish() {
  wait
  tar czf "$OUT/results.tgz" -C /tmp results
  cat "$R"/lane_*.log
}
