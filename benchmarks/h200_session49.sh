#!/bin/bash
# The next device plan, written in session 48 after its runs (nvidia-h200; one GPU; lanes.sh, lane A only).
#   PART=l   (carry .whl_lerobot) vlaperf's guided call inside LeRobot's predict. Session 47 (H100): +1.27 / +1.30 ms
#            over the unguided accelerated predict for pi0.5, +0.31 / +0.60 ms for pi0, while session 48 measured the
#            engine's guided replay at +0.18 ms for both (bench --rtc) and, on the CPU, the same extra operators in
#            both models' guided predicts. benchmarks/lerobot_predict_overhead_probe.py --rtc, interleaved, for
#            libero-pi0 and libero-pi05; then compare --accelerate --rtc for both (their first H200 files).
#            Predictions: engine_direct_rtc - engine_direct 0.15-0.25 ms (the unfolded head); accelerator_guidance
#            0.03-0.1 ms (a zero target, the leftover copied in, all on the device); core_accelerated_rtc -
#            core_accelerated 0.2-0.35 ms and predict_accelerated_rtc - predict_accelerated the same, for pi0 and
#            pi0.5 alike. If pi0.5's predict difference is again ~1.3 ms while its core difference is ~0.3, the
#            extra is in LeRobot's predict around the core (not in vlaperf); if the core difference holds it, it is
#            the accelerator's path and the rows name the piece. In compare: LeRobot's own RTC +20-35% over its
#            predict; vlaperf_in_lerobot_predict 13.5-14.3 ms (pi0), its RTC row within 0.4 ms of it.
#   PART=g   benchmarks/graph_context_probe.py with its phase F. Predictions: A-E as in session 48 (g1 32.3-32.6 ms
#            in A and C, g1 and g2 ~29.2 in E, g3 ~32.6 in E). In F, after one more compiled build: g3 ~29.2 (a
#            build speeds every graph captured before it) -- my guess, weakly held -- and g1 stays ~29.2. `best`
#            (the last row built in D) 12.7-13.0 ms in E, and in F within 1% of E: its ~700 kernels a call bound
#            what the gaps could give it at ~0.25 ms, so a drop of >= 0.15 ms there would be a lever worth a look.
# Parts l and g ran on an H100 (the H200 did not come); outcomes in perf-notes "Session 49". Part l put the guided
# call's extra inside LeRobot's predict at +0.07 (pi0) / +0.09 ms (pi0.5) in the probe, while `compare` read +0.41 ms
# for pi0 (session 47: +0.60 / +1.27). The probe interleaves only accelerated rows; compare puts each accelerated row
# right after LeRobot's eager one.
#   PART=n   (carry .whl_lerobot) the probe with --neighbours (LeRobot's own predict, unguided and guided, each
#            followed by a copy of the accelerated predict) for libero-pi0 and libero-pi05, then compare --accelerate
#            --rtc for libero-pi05. Predictions: after_lerobot_predict within +-0.15 ms of predict_accelerated (the
#            pi0 compare's unguided row, 14.27 ms, was not slower than the probe's, 14.54); after_lerobot_predict_rtc
#            0.3-1.2 ms over predict_accelerated_rtc for pi0.5 and 0.2-0.5 for pi0 (the neighbour, LeRobot's guided
#            call under autograd, is what compare's guided row has and the probe's lacks) -- weakly held; compare
#            pi0.5: vlaperf_in_lerobot_predict_rtc 0.4-1.3 ms over vlaperf_in_lerobot_predict, as in session 47.
# Part n (H100): LeRobot's guided predict as the neighbour costs the next accelerated guided predict +1.15 ms (pi0.5)
# and +0.45 ms (pi0); LeRobot's unguided predict costs the next unguided one nothing (-0.15 / +0.03 ms); compare's
# pi0.5 rows read +1.31 ms. The guided extra in compare is its neighbour's, not vlaperf's call's.
#   PART=v   (carry .whl_lerobot) libero-pi05, the probe with --neighbour-variants and --profile-after: after
#            LeRobot's guided predict, (engine) the engine's guided replay alone, (unguided) the unguided accelerated
#            predict, (gc) the guided one after a gc.collect(), (sleep) after 50 ms idle; and the profiled guided call
#            after each neighbour. Predictions (weakly held; the mechanism is unknown): the neighbour's autograd
#            leaves state that any next call pays for, so engine and unguided +0.5-1.2 ms over their rows; gc no
#            help (no collections start in the after rows on the CPU); 50 ms idle takes it away (an asynchronous
#            leftover); profiled: the GPU's kernel time within 2% after either neighbour, the wall time higher
#            after LeRobot's (host side).
# Part v (H100, pi0.5): after LeRobot's guided predict, the engine's guided replay alone pays +0.12 ms, the unguided
# accelerated predict +0.39, the guided one +0.99; after a gc.collect() +2.1 ms and after 50 ms idle +2.2 ms (both
# predicted to help: missed). The profiled call: the same kernel time after either neighbour. So the cost is host work
# in LeRobot's predict around the replay, and it grows with the time the host spent elsewhere (asleep or walking
# the heap): caches gone cold, not vlaperf's graph. A robot waits between calls, so `bench --idle-ms` now times it.
#   PART=i   bench libero-pi0 best --idle-ms 50 and 5, model and policy mode (the call after that idle, interleaved
#            with back to back). Predictions: model mode 1.00-1.02x at 50 ms (the replay's host part is ~0.1-0.2
#            ms); policy mode 1.04-1.10x at 50 ms (host stages ~1.5 ms warm, in part cold after the idle); at 5 ms
#            about half of each (weakly held: how fast the caches go cold is unknown).
# Part i (H100): model mode 1.010x at 50 ms (held), 1.001x at 5 ms; policy mode 1.034x at 50 ms (+0.49 ms; 1.04-1.10
# predicted: a miss, low), 1.009x at 5 ms.
#   PART=j   the same at 200 ms (a 5 Hz loop's wait). Predictions: policy 1.034-1.06x (colder than at 50 ms, if deeper
#            idle states come with the longer sleep), model 1.01-1.02x.
# Part j (H100): policy 1.030x at 200 ms (a miss, low: no colder than at 50 ms), model 1.011x (held).
#   PART=b   breakdown --mode policy --levers best, back to back and with --idle-ms 50 (built after part j), one process
#            each. Predictions: the host stages' sum 1.3-1.8 ms back to back and 0.3-0.6 ms more after the idle (bench's
#            +0.43-0.49), most of it in image_preprocess and host_to_device, which touch the most memory (weakly
#            held); the GPU stages (embed_prefix, prefill, the steps) within 1% of each other.
# Part b (H100): host stages 1.28 ms back to back, 2.12 ms after 50 ms idle (+0.84; every host stage 1.4-2x slower,
# not the memory-heavy ones alone); GPU stages within 0.7%. The device budget ended here.
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=l bash benchmarks/h200_session49.sh, carry [".whl", ".whl_lerobot"]
# (g: [".whl"])
set -u
source benchmarks/lanes.sh  # $R, lane, finish, $V, $B
install_wheels .whl /tmp/site
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-l}" in
l)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --rtc --workload libero-pi0 --json $R/lerobot_predict_overhead_probe_rtc_libero-pi0-s49.json
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --rtc --workload libero-pi05 --json $R/lerobot_predict_overhead_probe_rtc_libero-pi05-s49.json
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi0 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi0_lerobot_accelerated-s49.json
EOT
  ;;
n)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 40 <<EOT &
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --rtc --neighbours --iters 40 --workload libero-pi05 --json $R/lerobot_predict_overhead_probe_neighbours_libero-pi05-s49.json
150 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --rtc --neighbours --iters 40 --workload libero-pi0 --json $R/lerobot_predict_overhead_probe_neighbours_libero-pi0-s49.json
280 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH $V compare --workload libero-pi05 --accelerate --rtc --lerobot-compile none --iters 30 --no-progress --json $R/compare_libero-pi05_lerobot_accelerated-s49.json
EOT
  ;;
v)
  install_wheels .whl_lerobot /tmp/lrsite
  lane A 0 60 <<EOT &
330 PYTHONPATH=/tmp/lrsite:\$PYTHONPATH python3 benchmarks/lerobot_predict_overhead_probe.py --rtc --neighbours --neighbour-variants --profile-after $R/after_profile_libero-pi05-s49.txt --iters 40 --workload libero-pi05 --json $R/lerobot_predict_overhead_probe_variants_libero-pi05-s49.json
EOT
  ;;
i)
  lane A 0 20 <<EOT &
200 $V bench --workload libero-pi0 --levers best --mode model --idle-ms 50 $B --json $R/bench_libero-pi0_best-s49-idle50_model.json
120 $V bench --workload libero-pi0 --levers best --mode policy --idle-ms 50 $B --json $R/bench_libero-pi0_best-s49-idle50_policy.json
100 $V bench --workload libero-pi0 --levers best --mode policy --idle-ms 5 $B --json $R/bench_libero-pi0_best-s49-idle5_policy.json
100 $V bench --workload libero-pi0 --levers best --mode model --idle-ms 5 $B --json $R/bench_libero-pi0_best-s49-idle5_model.json
EOT
  ;;
j)
  lane A 0 20 <<EOT &
150 $V bench --workload libero-pi0 --levers best --mode policy --idle-ms 200 $B --json $R/bench_libero-pi0_best-s49-idle200_policy.json
100 $V bench --workload libero-pi0 --levers best --mode model --idle-ms 200 $B --json $R/bench_libero-pi0_best-s49-idle200_model.json
EOT
  ;;
b)
  lane A 0 40 <<EOT &
100 $V breakdown --workload libero-pi0 --levers best --mode policy --no-progress --json $R/breakdown_libero-pi0_best-s49-b2b_policy.json
80 $V breakdown --workload libero-pi0 --levers best --mode policy --idle-ms 50 --no-progress --json $R/breakdown_libero-pi0_best-s49-idle50_policy.json
EOT
  ;;
g)
  lane A 0 40 <<EOT &
420 python3 benchmarks/graph_context_probe.py --workload libero-pi0 --json $R/graph_context_probe_libero-pi0-s49.json
EOT
  ;;
esac
finish
