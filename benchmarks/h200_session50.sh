#!/bin/bash
# The next device plan, written in session 49 after its runs (one GPU; lanes.sh, lane A only). Session 49 ran on an
# H100 throughout; say which card each figure came from, and rerun a baseline on the card at hand.
#   PART=c   (carry .whl_lerobot) compare --accelerate --rtc for libero-pi0 and libero-pi05, now that compare settles its
#            fast rows (each timed call right after an untimed call of its own). Session 49's unsettled rows read the
#            guided row +0.41 ms (pi0) and +1.31 ms (pi0.5) over the unguided one, while the probe, whose accelerated
#            rows follow accelerated ones, read +0.07 / +0.09 ms for the predict. Predictions:
#            vlaperf_in_lerobot_predict_rtc 0.05-0.3 ms over vlaperf_in_lerobot_predict for both; vlaperf_best and
#            vlaperf_in_lerobot_predict within 0.3 ms of session 49's on the same kind of card (13.53 / 14.27 ms, pi0).
#   PART=s   what the served call's idle cost is: bench --idle-ms 50 asleep and --idle-spin, model and policy mode, and
#            breakdown --mode policy --idle-ms 50 --idle-spin. Session 49 (H100): asleep, policy 1.034x, model 1.010x;
#            the breakdown's host stages 1.28 -> 2.12 ms, every one 1.4-2x slower. Predictions: spinning policy
#            1.000-1.012x and model 1.000-1.005x (a core that sleeps comes back slow: its clock or idle state, not
#            caches, since every host stage slowed alike); asleep as in session 49 (policy 1.025-1.045x); the spun
#            breakdown's host stages within 0.2 ms of back to back (1.28 ms on the H100).
#            (Session 50, no device: on its 2-core KVM CPU machine `benchmarks/idle_decay_probe.py` read tiny's call
#            as slow after 50 ms spinning as after 50 ms asleep, 1.24-1.26x, and 1.03x when the call itself ran every
#            5 ms through the idle; so the spin prediction above may well miss. Part d draws the GPU host's curve.)
#   PART=d   (written in session 50) the idle's cost against its length: `idle_decay_probe.py`, libero-pi0 best,
#            policy and model mode and a control of small CPU operators, each after 0.2, 2, 10, 50 and 200 ms asleep,
#            spinning, and spinning while the call reruns every 5 ms (rewarming); the policy also while only its host
#            stages rerun (rewarming_host: transform, upload, preprocess; no replay). Predictions (from the CPU
#            machine's curve and session 49's bench): spinning within 0.01x of asleep at every idle of 10 ms and
#            more; the cost growing with the idle to 50 ms (policy 1.02-1.04x there, model 1.005-1.015x); rewarming
#            1.000-1.010x for both; rewarming_host taking back 50-80% of the policy's extra at 50 ms (1.005-1.020x;
#            those stages hold ~0.9 of its ~1.3 ms of host work, where on the CPU machine they held ~1.2 of ~5 ms
#            and took back 27% at 50 ms); the control 1.02-1.08x at 50 ms.
#   PART=m   matrix --mode policy --variants "graph;best", back to back and --idle-ms 50 (built in session 49), one
#            process each: which levers keep their gain under a robot's cadence. Predictions: graph and best each
#            +0.3-0.6 ms after the idle (the served path's host stages, as bench read +0.43-0.49), so their speedups
#            over the reference (~200 ms, host-bound) move by under 1%; best over graph within 1% of back to back.
#   PART=p   (carry .whl_lerobot) where the accelerated predict's host time goes, warm: the overhead probe with --profile
#            (torch.profiler's operator table of five accelerated predicts) for libero-pi0 and libero-pi05. Session 49's
#            rows (H100): the predict 0.76 ms over the core, the core 0.43-0.53 ms over the engine called directly,
#            which is the accelerator's conversion (_observation: the image stack, the mask flags read in one copy) and
#            the fault flag's read. After 50 ms idle, the whole host path took +2.2 ms. Predictions: the table's top
#            CPU operators are aten::copy_ / aten::stack / aten::cat and the one device-to-host read (_local_scalar_dense
#            or to/copy with a sync); LeRobot's _preprocess_images 0.3-0.5 ms of it; no single operator over 0.2 ms.
#   PART=e   (written in session 50) the idle's cost end to end, the websocket included: one `vlaperf serve --levers best`
#            server; `loadgen --clients 1` (a closed loop, back to back), then `rollout --control-hz 10` (a call every
#            0.5 s, the server idle ~0.49 s between), then loadgen again to bracket it. Predictions: rollout's
#            server_infer_ms median 0.3-0.9 ms over loadgen's (bench --idle-ms 50 read +0.45 ms in policy mode,
#            breakdown +0.84 ms); its policy_call_ms (the client's round trip) 0.5-1.5 ms over loadgen's round_trip_ms
#            (the front end's threads wake from sleep too); the two loadgen runs within 0.2 ms of each other.
#            The rollout also runs its own closed-loop baseline now (--back-to-back 10 after each episode, session
#            50): at_cadence_over_back_to_back 1.02-1.10x for the round trip and 1.02-1.06x for the server's time
#            (16 cores: none of the 2-vCPU machine's contention, which read 0.74-0.80x there).
#   PART=h   (an H200 only) the headline again: bench --levers best --processes 4, model mode. Prediction: 12.7-13.0 ms,
#            as sessions 43-48.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=c bash benchmarks/h200_session50.sh, carry [".whl", ".whl_lerobot"]
# (c and p need .whl_lerobot; d, e, s, m and h: [".whl"])
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-c}" in
c)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi0 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated-s50.json
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi05 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi05_lerobot_accelerated-s50.json
EOT
  ;;
s)
  lane A 0 20 <<EOT &
200 $V bench --workload libero-pi0 --levers best --mode policy --idle-ms 50 --idle-spin $B --json $R/bench_libero-pi0_best-s50-spin50_policy.json
100 $V bench --workload libero-pi0 --levers best --mode policy --idle-ms 50 $B --json $R/bench_libero-pi0_best-s50-idle50_policy.json
100 $V bench --workload libero-pi0 --levers best --mode model --idle-ms 50 --idle-spin $B --json $R/bench_libero-pi0_best-s50-spin50_model.json
80 $V breakdown --workload libero-pi0 --levers best --mode policy --idle-ms 50 --idle-spin --no-progress --json $R/breakdown_libero-pi0_best-s50-spin50_policy.json
EOT
  ;;
m)
  lane A 0 30 <<EOT &
240 $V matrix --workload libero-pi0 --mode policy --variants "graph;best" --warmup 5 --iters 30 --no-progress --json $R/matrix_libero-pi0_policy_graph-best-s50.json
200 $V matrix --workload libero-pi0 --mode policy --variants "graph;best" --warmup 5 --iters 30 --idle-ms 50 --no-progress --json $R/matrix_libero-pi0_policy_graph-best-s50-idle50.json
EOT
  ;;
p)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 60 <<EOT &
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --workload libero-pi0 --profile $R/lerobot_predict_overhead_profile_libero-pi0-s50.txt --json $R/lerobot_predict_overhead_probe_libero-pi0-s50.json
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --workload libero-pi05 --profile $R/lerobot_predict_overhead_profile_libero-pi05-s50.txt --json $R/lerobot_predict_overhead_probe_libero-pi05-s50.json
EOT
  ;;
d)
  lane A 0 60 <<EOT &
400 python3 benchmarks/idle_decay_probe.py --workload libero-pi0 --levers best --json $R/idle_decay_probe_libero-pi0-s50.json
EOT
  ;;
e)
  lane A 0 40 <<EOT &
300 bash -c 'setsid $V serve --workload libero-pi0 --levers best --max-batch 1 --port 8765 --warmup-batches 1 > $R/serve_libero-pi0_best-s50.log 2>&1 & SP=\$!; for i in \$(seq 200); do python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/healthz\", timeout=2)" 2>/dev/null && break; sleep 1; done; timeout 60 $V loadgen --url ws://127.0.0.1:8765 --clients 1 --requests 200 --warmup 10 --json $R/loadgen_libero-pi0_best-s50a.json; timeout 80 $V rollout --url ws://127.0.0.1:8765 --episodes 2 --steps-per-episode 150 --control-hz 10 --json $R/rollout_libero-pi0_best-s50-10hz.json; timeout 60 $V loadgen --url ws://127.0.0.1:8765 --clients 1 --requests 200 --warmup 10 --json $R/loadgen_libero-pi0_best-s50b.json; kill -TERM \$SP; tail -5 $R/serve_libero-pi0_best-s50.log'
EOT
  ;;
h)
  lane A 0 30 <<EOT &
400 $V bench --workload libero-pi0 --levers best --mode model --processes 4 $B --json $R/bench_libero-pi0_best-s50-4proc_model.json
EOT
  ;;
esac
finish
