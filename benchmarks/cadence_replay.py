"""Which of a rollout's calls at cadence a quiet keep-warm server's forecast expects, replayed without a server.

Why: with `serve --keep-warm-ms` quiet, a request still meets a keep-warm run where the forecast had no window for it,
and on the GPU those requests are a few of 60 a round, too few to compare two forecast rules by (session 55). The
forecast itself is deterministic, so its part can be counted exactly: this replays the arrivals of one connection of
`vlaperf rollout --back-to-back 10` (benchmarks/keep_warm_rollouts.sh) through `vlaperf.serve.cadence.CadenceForecast`
and, before each arrival (as the server asks), checks it against the windows for a run of `--run-ms`: inside a
window's expected span (from a run's length after its start to its end) or not. A call the windows do not expect is
one a run may meet; whether a run is going then is the GPU's part, not replayed here.

The arrivals: a warm-up call, then per episode its calls every `replan / hz` seconds (75 steps at 10 Hz, a call every
5: 15 calls every 0.5 s), each moved by a Gaussian jitter (`--jitter-ms`, the client's sleep and the host), then the
rest of the episode, the closed-loop burst (an untimed call and `--back-to-back` more, `--call-ms` apart), and a chunk's
idle before the next episode. A call at cadence takes `--call-ms` plus an exponential tail (`--tail-ms`, default none);
one longer than the control step makes the loop's later calls that much late, as the rollout's loop does. Three
rules: `late_replies` (vlaperf's: the forecast is told when each reply went out, session 56), `kept_paces` (the same
forecast told only the arrivals: the newest gaps that agree, else the paces the connection kept, else its newest gap;
session 55) and `newest_gaps` (session 54's: the newest gaps that agree, nothing else). Prints, per rule, the calls at
cadence the windows did not expect, in all and by their place in an episode.

    python benchmarks/cadence_replay.py --jitter-ms 0.2 --run-ms 1 --json out.json
    python benchmarks/cadence_replay.py --hz 60 --call-ms 15.8 --tail-ms 0.9   # a third of the calls overrun
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter

from vlaperf.serve import cadence
from vlaperf.timing import environment_record

RULES = ("late_replies", "kept_paces", "newest_gaps")


def arrivals(rng: random.Random, episodes: int = 2, calls: int = 15, gap_s: float = 0.5, call_s: float = 0.016,
             back_to_back: int = 10, jitter_s: float = 0.0002, period_s: float | None = None,
             tail_s: float = 0.0) -> list[tuple[float, str | None, float]]:
    """(time, "e<episode>c<call>" for a call at cadence else None, its reply's time) of one rollout connection, in
    time order. A call at cadence takes `call_s` plus an exponential tail of mean `tail_s`; where that overruns the
    control period (`period_s`, default the gap: no overrun), the loop's later steps, and so its arrivals, are that
    much late (the rollout sleeps out each step's period from its start)."""
    period_s = gap_s if period_s is None else period_s
    out: list[tuple[float, str | None, float]] = [(0.0, None, call_s)]  # the warm-up call
    t = call_s + 0.003  # its reply, then the first episode's first step
    for ep in range(episodes):
        for c in range(calls):
            arrival = t + rng.gauss(0.0, jitter_s)
            took = call_s + (rng.expovariate(1.0 / tail_s) if tail_s > 0 else 0.0)
            out.append((arrival, f"e{ep}c{c}", arrival + took))
            t += gap_s + max(0.0, took - period_s)
        for _ in range(back_to_back + 1):  # after the episode's last steps: the burst, each call on the last reply
            out.append((t, None, t + call_s))
            t += call_s
        t += gap_s  # a chunk's idle: the next episode's first call as if the loop had run on
    return out


def windows(forecast: cadence.CadenceForecast, rule: str, run_s: float) -> list[tuple[float, float]]:
    """The quiet windows `forecast` gives under `rule` for runs of `run_s`."""
    if rule in ("late_replies", "kept_paces"):  # the same windows; `replay` tells only the first the replies
        return forecast.quiet_windows(run_s)
    if rule == "newest_gaps":  # session 54's: the newest gaps that give a window, and no other
        newest = cadence._newest_window(forecast.last_arrival, forecast._gaps(), run_s)
        return [] if newest is None else [newest[1]]
    raise ValueError(f"rule: expected one of {', '.join(RULES)}, got {rule!r}")


def replay(rule: str, seeds: int = 50, run_s: float = 0.001, **pattern) -> dict:
    """For `seeds` rollouts of the pattern (`arrivals`' keywords): the calls at cadence the windows did not expect,
    in all and by call ({"e1c1": n, ...}), and the windows' summed length per call at cadence (what they hold)."""
    unexpected: Counter[str] = Counter()
    at_cadence, held_s = 0, 0.0
    for seed in range(seeds):
        forecast = cadence.CadenceForecast()
        for t, call, t_reply in arrivals(random.Random(seed), **pattern):
            spans = windows(forecast, rule, run_s)
            if call is not None:
                at_cadence += 1
                held_s += sum(end - start for start, end in spans)
                if not any(start + run_s <= t <= end for start, end in spans):
                    unexpected[call] += 1
            forecast.observe(t)
            if rule == "late_replies":  # vlaperf's server tells its forecasts when each reply went out
                forecast.replied(t, t_reply)
    return {"rule": rule, "calls_at_cadence": at_cadence, "unexpected": sum(unexpected.values()),
            "unexpected_by_call": dict(sorted(unexpected.items(), key=lambda kv: (-kv[1], kv[0]))),
            "held_ms_per_call": held_s / at_cadence * 1e3 if at_cadence else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jitter-ms", type=float, default=0.2, help="a call at cadence's jitter (Gaussian SD), ms")
    p.add_argument("--run-ms", type=float, default=1.0, help="the keep-warm run's length the windows allow for, ms")
    p.add_argument("--hz", type=float, default=10.0, help="the control rate")
    p.add_argument("--replan", type=int, default=5, help="a call every this many steps")
    p.add_argument("--call-ms", type=float, default=16.0, help="a call's shortest length, ms")
    p.add_argument("--tail-ms", type=float, default=0.0,
                   help="the mean of a call's exponential tail beyond --call-ms, ms (0: every call takes --call-ms); "
                        "a call longer than the control period makes the loop's later calls late")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seeds", type=int, default=50, help="rollouts replayed, each its own jitter")
    p.add_argument("--json", help="write the counts here")
    args = p.parse_args()
    for name in ("jitter_ms", "run_ms", "call_ms", "tail_ms"):
        if not getattr(args, name) >= 0:
            p.error(f"--{name.replace('_', '-')}: expected a length >= 0 ms, got {getattr(args, name)}")
    if not args.hz > 0 or args.replan < 1 or args.episodes < 1 or args.seeds < 1:
        p.error("--hz > 0, --replan, --episodes and --seeds at least 1")
    gap_s = args.replan / args.hz
    pattern = {"episodes": args.episodes, "calls": int(7.5 * args.hz) // args.replan, "gap_s": gap_s,
               "jitter_s": args.jitter_ms / 1e3, "call_s": args.call_ms / 1e3, "tail_s": args.tail_ms / 1e3,
               "period_s": 1.0 / args.hz}
    rows = [replay(rule, args.seeds, args.run_ms / 1e3, **pattern) for rule in RULES]
    for r in rows:
        worst = ", ".join(f"{k} {v}" for k, v in list(r["unexpected_by_call"].items())[:8])
        print(f"{r['rule']:12s} unexpected {r['unexpected']} of {r['calls_at_cadence']} calls at cadence; "
              f"windows {r['held_ms_per_call']:.2f} ms a call; most at: {worst}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "cadence-replay", "env": environment_record("cpu"), "jitter_ms": args.jitter_ms,
                       "run_ms": args.run_ms, "call_ms": args.call_ms, "tail_ms": args.tail_ms, "hz": args.hz,
                       "replan": args.replan, "episodes": args.episodes, "seeds": args.seeds, "rules": rows},
                      f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
