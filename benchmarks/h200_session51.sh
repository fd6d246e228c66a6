#!/bin/bash
# The device plan written in session 51 (one GPU; lanes.sh, lane A only), after session 51's parts d-p of
# benchmarks/h200_session50.sh on an H100. Say which card each figure came from.
#   PART=k   (ran in session 51 on an H100, at 6f40a25; docs/perf-notes.md has the outcome) does `serve
#            --keep-warm-ms` take back the idle's cost of a robot's cadence? Three `serve --levers best` servers on
#            one GPU (keep-warm off, 5 ms, 20 ms), each warmed up before any timing; `rollout --control-hz 10` (a call
#            every 0.5 s) against each in turn, twice round (off, 5, 20, off, 5, 20), with 12 s between
#            rollouts so a keep-warm server has stopped (10 s after its last request) before another's rollout runs;
#            every rollout also times its own closed loop (--back-to-back 10), the ratio its file keeps. Then each
#            server's /metrics (keep-warm runs, the requests they delayed). Session 51's part e (H100, no keep-warm):
#            at cadence over back to back 1.083x for the round trip, 1.049x for the server's time; the idle probe:
#            the served call 1.016x after 200 ms asleep, 1.003x with only its host stages rerun every 5 ms.
#            Predictions: off as part e (server 1.03-1.06x, round trip 1.06-1.10x); 5 ms: server 1.00-1.02x, round
#            trip 1.03-1.06x (the client's and the event loop's own wake-ups stay), 5-15% of calls delayed by a run;
#            20 ms between the two (server 1.01-1.03x), under 5% delayed.
#            Run again after session 51 (rollout now splits each call: at_cadence_extra_ms), predictions for the
#            loop's extra over its closed loop, in ms: off: the policy call +0.5-0.8, the wait for the inference thread
#            +0.02-0.1, the rest (client, network, event loop) +0.5-0.8; 5 ms: the policy call +0.0-0.2, the wait
#            +0.0-0.05 (the thread wakes every 5 ms anyway), the rest as off.
#   (The H200 headline is benchmarks/h200_session50.sh part h, unchanged.)
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=k bash benchmarks/h200_session51.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-k}" in
k)
  # servers: keep-warm off on 8765, 5 ms on 8766, 20 ms on 8767
  lane A 0 60 <<EOT &
450 bash benchmarks/keep_warm_rollouts.sh $R s51
EOT
  ;;
k2)
  # part k's two settings that matter, twice round, for the call's three-way split (written late in session 51,
  # for the device time it had left): predictions as part k's "run again". Ran at 70e7b59 (H100); since 5779208 the
  # rest of the round trip is split once more (handoff_ms, server_ms): predictions in docs/perf-notes.md, "Next,
  # after session 51"
  lane A 0 60 <<EOT &
200 SETTINGS="off 5" bash benchmarks/keep_warm_rollouts.sh $R s51k2
EOT
  ;;
esac
finish
