#!/bin/bash
# The device plan of session 52 (one GPU; lanes.sh, lane A only). Say which card each figure came from.
#   PART=h   the headline, libero-pi0 `best` in model mode in four fresh processes (session 50's part h, tag s52).
#            Session 48 (H200, d16c947): medians 12.77-12.93 ms, the file 12.86 ms. Prediction: 12.7-13.0 ms, spread
#            under 2% (nothing on the model's path changed since; the serving work does not reach model mode).
#   PART=kf  `serve --keep-warm-ms` at two cadences: servers keep-warm off and 5 ms, rollouts at 10 Hz and at 50 Hz
#            (a call every 0.5 s and every 0.1 s; replan every 5), twice round, with the call split in three past the
#            server (its policy call, the event loop's wake-up for the result, outside the server). Predictions, the
#            loop's extra over its closed loop: 10 Hz off: server 1.02-1.05x, handoff +0.05-0.2 ms, outside the
#            server +0.2-0.4 ms; 10 Hz 5 ms: server 1.00-1.02x, handoff and outside as off; 50 Hz off: server
#            1.01-1.03x (the probe: 1.014x after 50 ms asleep), the rest as 10 Hz; 50 Hz 5 ms: server 1.00-1.01x.
#            From 0e4ffaf the outside is split on the host's one clock: the way to the server (the request's packing
#            and send; the server's event loop, idle since the last reply, waking to read it) +0.15-0.35 ms; the way
#            back (the client blocked in its receive for only the call's ~14 ms) +0.0-0.1 ms.
#   PART=r   the same at 10 Hz with `--rtc` (servers and rollouts): a guided call's host path has the guidance's
#            arrays too, which the keep-warm run does not rebuild. Predictions: off: server 1.02-1.05x; 5 ms:
#            1.00-1.02x, at most 0.1 ms above the unguided 5 ms server's extra.
#   PART=p   whose warmth the served call misses after an idle (benchmarks/idle_decay_probe.py, policy target,
#            gaps 50 and 200 ms): asleep; the host stages rerun every 5 ms (session 51, H100: 1.000x / 1.003x);
#            the transform alone; the upload and device preprocess alone. Predictions: asleep 1.01-1.02x; host
#            1.000-1.004x; split between the two halves (neither alone as good as both): transform 1.004-1.012x,
#            upload 1.002-1.010x. If one half matches the host way, keep-warm can rerun that half only (shorter runs,
#            fewer delayed requests).
#   Written after part kc ran (H100: both keep-warms took the 10 Hz round trip from 1.066-1.085x to 1.002-1.015x):
#   PART=k50 kc at 50 Hz (a call every 0.1 s). Predictions: off/off round trip 1.03-1.07x, the server 1.01-1.04x;
#            the server's keep-warm alone 1.01-1.04x; both 1.00-1.02x.
#   PART=kr  kc with `--rtc` (servers and rollouts, 10 Hz). Predictions: off/off round trip 1.05-1.09x; both
#            1.00-1.03x (the keep-warm run does not rebuild the guidance's arrays, so a little may stay).
#   Written in session 53, after keep-warm learned to stand aside where a steady client's next request is due
#   (`serve --keep-warm-ms` is quiet there by default from 6f6816e; part kc's 5 ms servers delayed 10-14 requests
#   each, and their queue's p95 at cadence was 0.32-0.60 ms against 0.20-0.23 without keep-warm):
#   PART=kq  servers off, 5 ms run on the period (`5-noquiet`, as before) and 5 ms quiet, each against a rollout
#            with the client's pings every 5 ms, at 10 Hz and at 50 Hz. Predictions: requests delayed by a run
#            5-15% of the calls at cadence for 5-noquiet, at most 2 a server for quiet (the first calls of each
#            episode come before the forecast); the queue's p95 at cadence for quiet within 0.05 ms of the off
#            server's; the round trip's median within +-0.05 ms of 5-noquiet's (the last run before a call is 1-7 ms
#            before it instead of 0-5, which the host keeps: session 51's probe rewarming every 5 ms gave 1.000x).
#   Written in session 54, after two more rounds of kq on an H100 (quiet: 3 and 5 of 180 calls at cadence waited,
#   on the period 10 and 15):
#   PART=kqr kq with `--rtc` (servers and rollouts, 10 Hz; one round ran in session 53 as tag s53kqr: 5 waited on
#            the period, 2 quiet). Predictions: quiet at most 2 waited of 30, on the period 2-8; the queue's p95 at
#            cadence for quiet within 0.1 ms of the off server's.
#   PART=km  two robots on one server, each on its own connection (`ROBOTS=2`, started 0.13 s apart, 10 Hz, the
#            client's pings every 5 ms), servers 5 ms on the period and quiet, one round. From 6ffc202 each connection's
#            cadence is forecast on its own. The CPU machine (tiny): waited 22 of 60 calls at cadence on the period, 1
#            quiet; 24 quiet with one forecast for all requests (b2bcd41). Predictions: on the period 8-25 of 60; quiet
#            at most 3 of 60.
#   Written in session 55, after one round of km on an H100 (3d2df30: on the period 4 of 60, quiet 5, both robots'
#   quiet waits at call 8 of episode 1): km takes KM_ROUNDS (default a; "a b" runs two rounds in one call) and
#   prints the why counters from a9961da. Predictions: on the period 4-25 of 60 a round; quiet at most 3 of 60 a
#   round; the quiet waits that remain are mostly off_forecast (an arrival outside its span, e.g. after a reset),
#   none no_forecast past an episode's third call.
#   Written in session 55 after the forecast learned to fall back on the paces a connection kept (and, with none
#   kept, on its newest gap): parts km and kq again. On the replayed arrival pattern (two episodes, a 0.2 ms jitter)
#   the calls at cadence outside every window went from 289 to 205 of 1500: episode 0's call 2 and episode 1's
#   call 1 now forecast. Predictions: km quiet at most 2 of 60 a round, at episode 0's calls 0-1 and episode 1's
#   call 0 only, none no_forecast; on the period as before (4-25 of 60); kq quiet at most 2 of 180 a round.
#   Written in session 55 after the one-gap window learned to allow 0.5 ms of jitter each side (7850d19; the replay:
#   episode 0's call 2 unexpected in 6 of 200 seeds, from 62): part km again. Predictions: quiet at most 2 of 60 a
#   round, none at episode 0's call 2, none no_forecast; on the period 4-25 of 60.
#   Written in session 56, for part kq at 7be9951 (kept paces and the one-gap jitter; kq last ran at b32f413, before
#   the jitter): predictions: quiet at most 2 of 180 calls at cadence a round, none at an episode 0's call 2, none
#   no_forecast; on the period 5-15% of the calls at cadence, as before. On an H200, part h first (12.7-13.0 ms).
#   Written in session 56 after part kq at 7b9a5d4 (quiet at 50 Hz: 4 of 150 waited in round a, 3 of them
#   off_forecast, in the one rollout with overrun steps: 3; round b none, no overruns). A loop that sleeps out each
#   step's period starts late after a call that overran it, and every later request comes that much late. From
#   the next commit the server tells each forecast when its replies go out, and after a call longer than the usual
#   the window stays open as much longer (CadenceForecast.replied).
#   PART=ko  the tree at 7b9a5d4 (OLD, a copy of its vlaperf/, carried as out/old_tree; OLD_COMMIT its SHA) against
#            this one, interleaved, rounds KO_ROUNDS (default "a b"): a quiet 5 ms server alone, a rollout at KO_HZ
#            (default 60 on an H100: steps of 16.7 ms against calls of ~16.4, so a third or more overrun; 70 on an
#            H200, whose calls are ~2 ms shorter). benchmarks/cadence_replay.py at 60 Hz (calls 15.8 ms plus an
#            exponential tail of 0.9 ms, 0.2 ms jitter): unexpected 1268 -> 352 of 9000 calls at cadence (150 of them
#            each episode's first calls, which no forecast places). Predictions, calls at cadence that waited for a
#            run, of 180 a round: the old tree 6-20, mostly off_forecast; this one at most 4, none off_forecast after
#            an overrun; the windows' held time a call +0.3-0.6 ms (the replay: +0.49).
#   Written in session 56 after part ko (60 Hz: no overruns on that host; 66 Hz: 23-167 overruns a rollout, and
#   neither tree let a request wait): part kq at 7a2137f or later, whose rollouts record the calls that overran
#   (overran_at). Predictions: quiet at most 2 of 180 a round, none of them the call after an overrun; on the period
#   5-15% of the calls at cadence.
#   Written in session 56 after part kq round c at 4714316 (quiet at 50 Hz: 4 of 150 waited, all off_forecast, none
#   after an overrun; rounds a-c: 4, 0, 4): the forecast keeps seven gaps, not three (CADENCE_ARRIVALS 8), so that
#   their spread tells the loop's jitter (the replay at 50 Hz, 0.2 ms jitter: 161 -> 39 of 7500 unexpected).
#   PART=kq50 a quiet 5 ms server alone, rollouts at 50 Hz with the client's pings, rounds KQ50_ROUNDS (default
#            "d e"). Predictions: at most 1 of 150 calls at cadence waited a round; the queue's p95 at cadence as
#            before (0.2-0.3 ms).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=h bash benchmarks/h200_session52.sh, carry [".whl"]
#   TAG names the files (default s52; session 53 ran the parts session 52 could not with TAG=s53).
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
TAG=${TAG:-s52}
case "${PART:-h}" in
h)
  lane A 0 30 <<EOT &
400 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-${TAG}-4proc_model.json
EOT
  ;;
kf)
  lane A 0 60 <<EOT &
560 SETTINGS="off 5" HZ="10 50" bash benchmarks/keep_warm_rollouts.sh $R ${TAG}
EOT
  ;;
kc)
  # (ran in session 52 on an H100, at fa42d34, ROUNDS=a then ROUNDS=b as two calls; docs/perf-notes.md has the outcome)
  # the server's keep-warm (off, 5 ms) against the client's (`rollout --client-keep-warm-ms`: off, 5 ms) at 10 Hz,
  # twice round, with the split. Predictions: the client's pings take back half of the way to the server's extra
  # (the CPU machine: +0.26-0.32 ms asleep); the round trip's ratio 0.005-0.02x lower with them; the server's policy
  # call as kf's
  lane A 0 60 <<EOT &
560 SETTINGS="off 5" CLIENTS="off 5" bash benchmarks/keep_warm_rollouts.sh $R ${TAG}kc
EOT
  ;;
r)
  lane A 0 60 <<EOT &
400 SETTINGS="off 5" SERVE_OPTS=--rtc ROLLOUT_OPTS=--rtc bash benchmarks/keep_warm_rollouts.sh $R ${TAG}rtc
EOT
  ;;
k50)
  lane A 0 60 <<EOT &
560 SETTINGS="off 5" CLIENTS="off 5" HZ=50 bash benchmarks/keep_warm_rollouts.sh $R ${TAG}k50
EOT
  ;;
kr)
  lane A 0 60 <<EOT &
560 SETTINGS="off 5" CLIENTS="off 5" SERVE_OPTS=--rtc ROLLOUT_OPTS=--rtc bash benchmarks/keep_warm_rollouts.sh $R ${TAG}kr
EOT
  ;;
kq)
  lane A 0 60 <<EOT &
560 SETTINGS="off 5-noquiet 5" CLIENTS=5 HZ="10 50" bash benchmarks/keep_warm_rollouts.sh $R ${TAG}kq
EOT
  ;;
kqr)
  lane A 0 60 <<EOT &
420 SETTINGS="off 5-noquiet 5" CLIENTS=5 SERVE_OPTS=--rtc ROLLOUT_OPTS=--rtc bash benchmarks/keep_warm_rollouts.sh $R ${TAG}kqr
EOT
  ;;
km)
  lane A 0 60 <<EOT &
560 SETTINGS="5-noquiet 5" CLIENTS=5 ROBOTS=2 ROUNDS="${KM_ROUNDS:-a}" bash benchmarks/keep_warm_rollouts.sh $R ${TAG}km
EOT
  ;;
kq50)
  lane A 0 60 <<EOT &
400 SETTINGS=5 CLIENTS=5 HZ=50 ROUNDS="${KQ50_ROUNDS:-d e}" bash benchmarks/keep_warm_rollouts.sh $R ${TAG}kq50
EOT
  ;;
ko)
  : "${OLD:?set OLD to the old tree}" "${OLD_COMMIT:?set OLD_COMMIT to its commit}"
  hz=${KO_HZ:-60}
  for round in ${KO_ROUNDS:-a b}; do  # run from the old tree's folder: python3 -m imports the vlaperf of the folder it runs in
    echo "280 cd $OLD && VLAPERF_GIT_COMMIT=$OLD_COMMIT PYTHONPATH=/tmp/site SETTINGS=5 CLIENTS=5 HZ=$hz ROUNDS=$round bash $PWD/benchmarks/keep_warm_rollouts.sh $R ${TAG}ko-old-$round"
    echo "280 SETTINGS=5 CLIENTS=5 HZ=$hz ROUNDS=$round bash benchmarks/keep_warm_rollouts.sh $R ${TAG}ko-$round"
  done | lane A 0 60 &
  ;;
p)
  lane A 0 40 <<EOT &
300 python3 benchmarks/idle_decay_probe.py --workload libero-pi0 --levers best --targets policy --gaps 50,200 --ways asleep,rewarming_host,rewarming_transform,rewarming_upload --json $R/idle_decay_probe_libero-pi0_best-${TAG}.json
EOT
  ;;
esac
finish
