#!/bin/bash
# Session 47's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only).
#   PART=r   real-time chunking served (new this session): `vlaperf bench --rtc` for libero-pi0 (bfloat16, batch 1,
#            LeRobot's RTCConfig defaults, a previous chunk with 3 actions executed and a delay of 2): `graph` and
#            `best` in model mode, `best` in policy mode; each file also holds the guided call against the unguided
#            one, interleaved in the same process (rtc.vs_unguided). Then the guidance's GPU tests
#            (tests/test_guidance.py: the CUDA-graph tests, per-sample weights among them).
#            Predictions: every check passes with guided calls included (bf16 rel L2 under 3e-2, ~1e-2 as the
#            unguided best's). The guidance adds, per step, the unfolded Euler head (the folded one is one fused
#            matmul + update; unfolded, the velocity is written, then five elementwise kernels, ~3 us each) and,
#            per call, nothing on the host in model mode: ~10 x 6 x 3 us = 0.15-0.4 ms, so guided over unguided
#            1.01-1.03 for best (12.9 ms) and 1.005-1.015 for graph (~29 ms). In policy mode the guidance is built
#            on the host (a (1, 50, 32) numpy target, the (1, 50) weights, two copies to the device): +0.05-0.15 ms
#            more, 1.01-1.04. Tests: all pass, one capture per guided shape.
#   PART=p   (carry .whl_lerobot) two probes of part r's and part e's misses on the H100:
#            benchmarks/guidance_error_probe.py: `best`'s guided calls on tiny float32 were 4.6e-4 and 6.9e-4 from the
#            reference's (the GPU tests' 1e-4 failed; `graph` passed). Prediction: if the guided error follows the
#            guidance weight (0 -> the unguided error, growing to 10), it is the unguided error amplified (the tests'
#            tolerance is at fault); if it is already there at weight 0, the unfolded head of `best` is less precise
#            than the folded one. On the CPU (exact, for_loop + static cache) the guided error did not grow with the
#            weight (4e-7 / 0).
#            benchmarks/lerobot_predict_overhead_probe.py: LeRobot's accelerated predict (17.18 ms) against the engine
#            alone (13.60 ms). Prediction: LeRobot's wrapper is most of the 3.6 ms: policy.eval() over ~1,000+ modules
#            1-2.5 ms, its image preprocessing (three frames: a permute, a scale, a permute each) 0.1-0.3 ms; the
#            accelerator's conversion (core_accelerated - engine_direct) 0.3-1 ms.
#   PART=q   (carry .whl_lerobot) after part p's two findings: the GPU tests of the guidance (their tolerance now the
#            variant's own unguided distance, x1.5) and of the accelerator (the full-size LeRobot tests); the overhead
#            probe again; compare --accelerate --rtc for libero-pi0. Predictions: all tests pass. LeRobot's eval()
#            is now a no-op while nothing is in training mode: predict_accelerated 18.17 -> 14.2-14.6 ms (the 3.84
#            ms walk gone; the 0.45 ms preprocessing and 0.6 ms conversion stay), policy_eval 3.84 ms -> under 0.01
#            ms; in compare, vlaperf_in_lerobot_predict 17.18 -> 13.9-14.4 ms (vs vlaperf_best's 13.6) and its RTC
#            row 17.78 -> 14.5-15.0 ms; LeRobot's own rows unchanged (the accelerator is restored around them).
#   PART=e, g: session 46's (benchmarks/h200_session46.sh): compare --accelerate --rtc (e), the guidance's and the
#            accelerator's GPU tests (g). PART=a, b, c, d: session 45's.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=r bash benchmarks/h200_session47.sh, carry [".whl"] (e, g, c, p, q:
# [".whl", ".whl_lerobot"])
set -u
case "${PART:-r}" in
a | b | c | d | e | g) exec bash benchmarks/h200_session46.sh ;;
esac
# probes' output (text, JSON) goes to the results folder with the rest
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "$PART" in
r)
  lane A 0 40 <<EOT &
120 $V bench --workload libero-pi0 --levers graph --rtc $B --json $R/bench_libero-pi0_graph-rtc-s47_model.json
170 $V bench --workload libero-pi0 --levers best --rtc $B --json $R/bench_libero-pi0_best-rtc-s47_model.json
170 $V bench --workload libero-pi0 --levers best --mode policy --rtc $B --json $R/bench_libero-pi0_best-rtc-s47_policy.json
110 python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 6 -m gpu tests/test_guidance.py 2>&1 | tee $R/pytest_gpu_s47r_guidance.log | tail -20
EOT
  ;;
p)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
150 python3 benchmarks/guidance_error_probe.py --json $R/guidance_error_probe_s47.json 2>&1 | grep -v "^DEBUG"
300 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --json $R/lerobot_predict_overhead_probe_s47.json --profile $R/lerobot_predict_overhead_profile_s47.txt
EOT
  ;;
q)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 6 -m gpu tests/test_guidance.py tests/test_compare_accelerate.py 2>&1 | grep -v "^DEBUG" | tee $R/pytest_gpu_s47q_guidance_accelerate.log | tail -20
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --json $R/lerobot_predict_overhead_probe_s47q.json
200 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi0 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated-s47q.json
EOT
  ;;
esac
finish
