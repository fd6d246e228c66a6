#!/bin/bash
# Session 69's device plan (one GPU; lanes.sh, lane A only). Say which card each figure came from. Carry [".whl"].
# The H200's rows of "Where each workload stands", other than libero-pi0's, are from sessions 18-39 (2026-12-03/04);
# the engine has changed since (real-time chunking's graph inputs, the static cache keyed by prefix length, the
# float32 fixes of the kernels). Session 68's H100 figures at today's engine each fell inside their predicted range,
# so no regression is expected; this plan checks that on the H200 and makes its table current. It also takes the
# `breakdown` of libero-pi0 and libero-pi05 at today's commit, against the H100's of session 68 (4e788be: no engine
# change since), to place the H100's 1.09-1.10x by stage at one engine (session 68's part h compared with the H200's
# session 30 files, at an older commit).
#   PART=a   on an H200: the two breakdowns, then `best` of every other workload in model mode (one process each).
#            In the order the issue reads them (its named workloads and batches first): a call cut short by its
#            limit or the budget keeps those.
#            Predictions, written before the run:
#              breakdown libero-pi0: untimed call 12.7-13.0 ms (the headline is 12.77); embed_prefix 1.65-1.75,
#                prefill 3.9-4.1, ten steps 7.0-7.3 ms (session 30: 1.705, 3.963, 7.175); setup 0.1-0.45 (0.117 in
#                session 30, 0.415 on the H100 in session 68: I cannot tell whether the commit or the card moved it).
#              breakdown libero-pi05: untimed 12.0-12.4 (session 30: 12.25); prefill 4.1-4.3, steps 6.0-6.3.
#              So the H100's prefill excess (+0.39 / +0.60 ms against session 30) stays, within 0.1 ms: the card,
#                not the commit.
#              best, each within 3% of its last H200 file: libero-pi05 11.7-12.4 (12.02), libero-shallow6 5.3-5.7
#                (5.50), aloha-pi0 14.7-15.6 (15.13), aloha-pi05 16.8-17.8 (17.30), droid-pi0 11.6-12.3 (11.91),
#                droid-pi05 12.0-12.7 (12.34), libero-pi0-b4 27.5-29.2 (28.31), libero-pi0-b8 48.7-51.7 (50.20),
#                wam-761 47.9-50.8 (49.33), libero-pi05 at horizon 50 14.5-15.4 (14.92), wam-761 batch 4 116-123
#                (119.54). Every file's check passes.
#            on an H100: the two breakdowns (again at one engine with session 68's: the machine-to-machine spread
#              of the H100 stages), then aloha-pi05, droid-pi0 and droid-pi05 `best`, which the H100 has never run.
#              Predictions: breakdown stages within 0.1 ms of session 68's H100 files except the untimed call, which
#              may land anywhere in 13.3-14.1 (three H100 machines gave 13.35-14.03 in session 68); the three bests at
#              1.04-1.10x the H200's (aloha-pi05 18.0-19.0, droid-pi0 12.4-13.1, droid-pi05 12.8-13.6).
#   PART=x   on an H200: part a's H200 steps, with its predictions. On any other card: nothing (the H100's are taken).
#   PART=b   what part a's call did not reach: part a's steps after the first SKIP (SKIP=N), on the same kind of card.
# Outcome: nineteen calls got no machine (18:19-19:31, ~1150 s of the budget); the twentieth an H100 (19:36-19:39,
#   files labelled 21fa9ba; the tree was 2a72886, which differs from it in docs only), so no H200 figure this session.
#   Breakdowns against session 68's H100 files (same engine, another machine), ms:
#     libero-pi0: setup 0.435 (0.415), embed_prefix 1.749 (1.760), prefill 4.201 (4.353), ten steps 7.545 (7.556),
#       untimed 13.88 (14.03). A miss by 0.05 ms on the prefill (predicted within 0.1 ms); the untimed call inside
#       13.3-14.1.
#     libero-pi05: setup 0.417 (0.401), embed_prefix 1.745 (1.767), prefill 4.728 (4.802), ten steps 6.509 (6.542),
#       untimed 13.33 (13.46): as predicted.
#   aloha-pi05 18.76 ms, droid-pi0 12.77, droid-pi05 13.58: each inside its predicted range; every check passed.
#   On the warm machine, a command given to the device tool (predictions stated before it ran, not in this file:
#   libero-pi05 at horizon 50 15.7-16.7 ms, the H200's 14.92 x 1.05-1.12; wam-761 batch 4 124-130, 119.54 x
#   1.04-1.08): 16.21 ms, as predicted; 123.47 ms, a miss by 0.5 ms (1.03x the H200's).
# Usage (device tool): VLAPERF_GIT_COMMIT=<sha> PART=a bash benchmarks/h200_session69.sh, carry [".whl"]
set -u
source benchmarks/lanes.sh  # $R, lane, finish, gpu_setup, $V, $B
gpu_setup  # GPU_NAME
breakdowns() {
  for w in libero-pi0 libero-pi05; do
    echo "100 $V breakdown --workload $w --levers best --warmup 10 --iters 50 --no-progress --json $R/breakdown_${w}_best-s69.json"
  done
}
bench() {  # bench WORKLOAD FILE_STEM [options]
  local w=$1 stem=$2; shift 2
  echo "110 $V bench --workload $w --levers best $* $B --json $R/bench_${stem}_best-s69_model.json"
}
h200_rest() {
  for w in libero-pi05 libero-shallow6 libero-pi0-b4 libero-pi0-b8 aloha-pi0 wam-761 aloha-pi05 droid-pi0 droid-pi05; do
    bench $w $w
  done
  bench libero-pi05 libero-pi05-h50 --action-horizon 50
  bench wam-761 wam-761-b4 --batch 4
}
h100_rest() {
  for w in aloha-pi05 droid-pi0 droid-pi05; do bench $w $w; done
}
case "${PART:-a}:$GPU_NAME" in
  a:*H200*) breakdowns; h200_rest ;;
  a:*) breakdowns; h100_rest ;;
  x:*H200*) breakdowns; h200_rest ;;
  x:*) echo "not an H200: nothing to run" >&2 ;;
  b:*H200*) { breakdowns; h200_rest; } | tail -n +$((${SKIP:-0} + 1)) ;;
  b:*) { breakdowns; h100_rest; } | tail -n +$((${SKIP:-0} + 1)) ;;
  *) echo "unknown PART=${PART}"; exit 2 ;;
esac | lane A 0 40 &
finish
