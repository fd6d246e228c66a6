#!/bin/bash
# `vlaperf serve --keep-warm-ms` against a robot's cadence: three servers of one workload on one GPU (keep-warm off,
# 5 ms, 20 ms), then `vlaperf rollout --control-hz 10 --back-to-back 10` (2 episodes of 75 steps: 30 calls at
# cadence, 20 back to back) against each in turn, twice round, 12 s apart (a keep-warm server stops 10 s after its
# last request, so none runs beside another's rollout), then each server's /metrics. Usage: bash benchmarks/keep_warm_rollouts.sh RESULTS_DIR TAG [WORKLOAD] [LEVERS]
# ($SETTINGS, default "off 5 20": the servers' keep-warm, one server each, "5-noquiet" for `--keep-warm-ms 5
# --no-keep-warm-quiet`; $ROUNDS, default "a b": the rounds;
# $HZ, default 10: the control rates, each round runs them all (an episode is 7.5 s at any rate, so 75 steps at
# 10 Hz, 375 at 50); $SERVE_OPTS and $ROLLOUT_OPTS, default none: more options for every server and every rollout,
# e.g. --rtc for both; $CLIENTS, default "off": the rollouts' own keep-warm, `rollout --client-keep-warm-ms`, each
# setting against each server, its files named -client<setting> unless the default; $ROBOTS, default 1: that many
# rollouts at once against each server, as several robots each on its own connection, started 0.13 s apart, their
# files named -robot<k> where there are several)
set -u
R=$1 TAG=$2 W=${3:-libero-pi0} L=${4:-best}
HZ=${HZ:-10}
V="python3 -m vlaperf.cli"
declare -A KEEP=()
PORTS=()
port=8765
for k in ${SETTINGS:-off 5 20}; do KEEP[$port]=$k; PORTS+=($port); port=$((port + 1)); done
PIDS=()
for port in "${PORTS[@]}"; do
  # a setting "5-noquiet": keep-warm every 5 ms, running on the period where the next request is due too
  opt=""; [ "${KEEP[$port]}" != off ] && opt="--keep-warm-ms ${KEEP[$port]%-noquiet}"
  [[ "${KEEP[$port]}" == *-noquiet ]] && opt="$opt --no-keep-warm-quiet"
  setsid $V serve --workload $W --levers $L --max-batch 1 --warmup-batches 1 --port $port $opt ${SERVE_OPTS:-} \
    > $R/serve_${W}_${L}-${TAG}-keepwarm-${KEEP[$port]}.log 2>&1 &
  PIDS+=($!)
done
healthy() { python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/healthz', timeout=2)" 2>/dev/null; }
for port in "${PORTS[@]}"; do
  for i in $(seq 300); do healthy $port && break; sleep 1; done
  healthy $port || { echo "server on $port never became healthy"; tail -20 $R/serve_${W}_${L}-${TAG}-keepwarm-${KEEP[$port]}.log; }
done
for round in ${ROUNDS:-a b}; do
  for hz in $HZ; do
  for port in "${PORTS[@]}"; do
  for c in ${CLIENTS:-off}; do
    copt=""; [ "$c" != off ] && copt="--client-keep-warm-ms $c"
    csuf=""; [ "${CLIENTS:-off}" != off ] && csuf="-client$c"
    sleep 12
    RPIDS=()
    for k in $(seq ${ROBOTS:-1}); do
      rsuf=""; [ "${ROBOTS:-1}" != 1 ] && rsuf="-robot$k"
      # COLUMNS: the console's summary on one line, for the grep
      (sleep "$(awk "BEGIN { print 0.13 * ($k - 1) }")"
       COLUMNS=1000 timeout 90 $V rollout --url ws://127.0.0.1:$port --episodes 2 --steps-per-episode $((hz * 15 / 2)) \
         --control-hz $hz --back-to-back 10 $copt ${ROLLOUT_OPTS:-} \
         --json $R/rollout_${W}_${L}-${TAG}-${hz}hz-keepwarm-${KEEP[$port]}${csuf}${round}${rsuf}.json \
         2>&1 | grep -E "at [0-9.]+ Hz|errors|keep-warm runs and waited" | sed "s/^/${rsuf#-}${rsuf:+: }/") &
      RPIDS+=($!)
    done
    wait "${RPIDS[@]}"  # the rollouts only: the servers run on
    # what is done so far comes back even if the device call's time limit cuts the rest
    [ -n "${OUT:-}" ] && tar czf "$OUT/partial.tgz" -C "$(dirname "$R")" "$(basename "$R")"
  done
  done
  done
done
for port in "${PORTS[@]}"; do
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode())" \
    > $R/metrics_${W}_${L}-${TAG}-keepwarm-${KEEP[$port]}.txt
  echo "keep-warm ${KEEP[$port]}: $(grep -E '^vlaperf_(keep_warm_runs_total|keep_warm_delayed_observations_total|keep_warm_quiet_total|requests_total|keep_warm_seconds_(sum|count)|keep_warm_delayed_why_total\{why="[a-z_]+"\}) ' $R/metrics_${W}_${L}-${TAG}-keepwarm-${KEEP[$port]}.txt | tr '\n' ' ')"
done
kill -TERM "${PIDS[@]}"; wait
