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
#   PART=a, b, d: session 44's parts (benchmarks/h200_session44.sh, predictions there), files named s48.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=r bash benchmarks/h200_session48.sh, carry [".whl"]
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
esac
finish
