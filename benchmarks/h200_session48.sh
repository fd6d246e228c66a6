#!/bin/bash
# Session 48's device plan on nvidia-h200 (one GPU; lanes.sh, lane A only). Same parts as session 47's, its result
# files named s48, so a run on either card lands beside, not over, session 47's H100 files.
#   PART=r   `vlaperf bench --rtc` for libero-pi0 (bfloat16, batch 1, LeRobot's RTCConfig defaults, 3 actions of the
#            previous chunk executed, a delay of 2): `graph` and `best` in model mode, `best` in policy mode, each
#            with the guided call against the unguided one interleaved (rtc.vs_unguided); then the guidance's GPU
#            tests. Predictions (session 47's H100 figures: model 1.012-1.014x, policy 1.029-1.035x): model mode
#            unchanged, best 1.01-1.015x, graph 1.005-1.015x. Policy mode, now that the guidance is built and copied
#            before the observation's upload (f87f2e3) and its prefix weights kept per (delay, horizon) (e84854a):
#            1.015-1.02x, that is model mode's ~0.16 ms plus ~0.04-0.1 ms of host work, where the H100 read +0.26 ms
#            more than model mode. If it stays near 1.03x, the pageable copies were not the cause. Tests: all pass.
#            Outcome (H200, d16c947): best 1.016x model, 1.026x policy (+0.15 ms of host over model mode's +0.22),
#            graph 1.010x: policy mode missed the range.
#   PART=s   after part r: the guidance's target and weights now ride in the observation's one pinned upload (no
#            pageable copies of their own). `bench --rtc` for libero-pi0 best in policy then model mode, libero-pi05
#            best in model mode, and the broad part of the GPU suite (lanes.sh gpu_suite's third line: every test
#            file but the kernel/engine ones, -m "not quiet_gpu"). Predictions: policy mode 1.026x -> 1.016-1.021x
#            (model mode's ~0.2 ms plus <= 0.05 ms of host work: the numpy target and weights, ~35 us on this CPU);
#            model mode 1.013-1.018x as before. libero-pi05 (horizon 10) in model mode 1.01-1.025x (+0.15-0.3 ms on
#            ~12 ms, the same unfolded head and five elementwise kernels a step): if so, the +1.27 ms its guided
#            call cost inside LeRobot's predict (session 47, part e) lies outside the engine. Suite: all pass.
#            Outcome (an H100, bdb51fb; the H200 did not start again): policy 1.019x, model 1.013x, libero-pi05
#            1.013x (+0.18 ms); the suite passed (run as four calls with the other gpu_suite steps). All held.
#   PART=a, b, d: session 44's parts (benchmarks/h200_session44.sh, predictions there), files named s48.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=r bash benchmarks/h200_session48.sh (or s), carry [".whl"]
set -u
case "${PART:-r}" in
a | b | d) TAG=s48 exec bash benchmarks/h200_session44.sh ;;
esac
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-r}" in
r)
  lane A 0 40 <<EOT &
120 $V bench --workload libero-pi0 --levers graph --rtc $B --json $R/bench_libero-pi0_graph-rtc-s48_model.json
170 $V bench --workload libero-pi0 --levers best --rtc $B --json $R/bench_libero-pi0_best-rtc-s48_model.json
170 $V bench --workload libero-pi0 --levers best --mode policy --rtc $B --json $R/bench_libero-pi0_best-rtc-s48_policy.json
110 python3 -m pytest -p no:cacheprovider -q -rs --tb=short --durations 6 -m gpu tests/test_guidance.py 2>&1 | tee $R/pytest_gpu_s48r_guidance.log | tail -20
EOT
  ;;
s)
  P="PYTHONPATH=benchmarks:\$PYTHONPATH python3 -m pytest -p no:cacheprovider -p pytest_report_now -rfEs --tb=short"
  I="--ignore tests/test_kernels.py --ignore tests/test_engine_cuda.py --ignore tests/test_wam.py --ignore tests/test_engine.py --ignore tests/test_unipc.py"
  lane A 0 40 <<EOT &
100 $V bench --workload libero-pi0 --levers best --mode policy --rtc $B --json $R/bench_libero-pi0_best-rtc-s48s_policy.json
100 $V bench --workload libero-pi0 --levers best --rtc $B --json $R/bench_libero-pi0_best-rtc-s48s_model.json
100 $V bench --workload libero-pi05 --levers best --rtc $B --json $R/bench_libero-pi05_best-rtc-s48s_model.json
250 $P -q -n 14 --timeout 220 --durations 5 -m "not quiet_gpu" $I 2>&1 | tee $R/pytest_gpu_s48s3.log | grep -v "^\\.*\\["
EOT
  ;;
esac
finish
