"""End-to-end rollout timing against a running policy server.

A stand-in for a robot control loop, to see how much of an episode is spent waiting for the
policy. THE OBSERVATIONS ARE SYNTHETIC: random images and states from
`vlaperf.inputs.make_example`; there is no simulator or robot, and the actions are not
applied to anything. What is real is the timing: the network round trip, the server and the
control-loop schedule.

The loop runs at `control_hz`. At a step with no action left to execute it sends the current
observation and blocks until the action chunk arrives (as openpi's synchronous runtime
does); the chunk is then executed open loop, one action per step, for `replan_every` steps
(openpi's ActionChunkBroker does the same with its action horizon). After each step the loop
sleeps out the rest of the control period; a step that took longer than the period (because
it waited for the policy) overruns, and the episode takes longer than steps / control_hz.

`execution="async"` (`--async`) runs the robot as real-time chunking does: after `replan_every`
actions the observation is sent from a background thread and the loop goes on executing the
chunk it has; when the reply arrives, the new chunk takes over at the position that matches the
steps executed since the observation (its first ones stand for time already gone). The loop waits
only where the old chunk runs out first (a stall). `rtc=True` (`--rtc`, async as well) also sends
"rtc/executed" and "rtc/delay" (the last round trip in control steps, rounded up) so that a server
started with `--rtc` guides each chunk toward what is left of the one running; every switch
records how far the action executed next moves from the one the old chunk had there (the
"switch jump", in the robot's units), which the guidance makes small. Each episode's first call
is synchronous and unguided. The async loop is vlaperf.serve.broker.ChunkBroker's, which a robot's
own control loop can use.

`back_to_back=N` (`--back-to-back`, the CLI's default 10) sends, after each episode, one untimed call and
then N more in a closed loop (each sent when the previous reply is in) on the same connection, with the
same observations (with `rtc`, as guided requests). A control loop's calls each follow an idle, and the
host's state goes cold in it (docs/profiling.md, "The call after an idle"); against these calls,
`at_cadence_over_back_to_back` says what that costs end to end, the websocket included, where
`vlaperf bench --idle-ms` says it for the policy alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vlaperf.serve.broker import SPLIT_KEYS, call_split, client_stamps
from vlaperf.serve.client import Client, ServerError
from vlaperf.serve.loadgen import (LoadgenError, check_loopback_url, check_request_size, check_workload_id, example_for,
                                   resolve_workload, result_header)
from vlaperf.serve.protocol import RTC_DELAY_KEY, RTC_EXECUTED_KEY
from vlaperf.timing import summarize

MAX_EPISODES, MAX_STEPS, MAX_CONTROL_HZ, MAX_TIMEOUT_S = 1000, 100_000, 1000.0, 24 * 3600.0
MAX_BACK_TO_BACK = 10_000
MAX_CLIENT_KEEP_WARM_MS = 1000.0  # a ping a second at least: slower keeps nothing warm
DEFAULT_REPLAN_EVERY = 5  # or the action horizon, where the served model's chunk is shorter (wam-tiny: 4)


def run_rollout(url: str = "ws://127.0.0.1:8000", episodes: int = 3, steps_per_episode: int = 50,
                control_hz: float = 10.0, replan_every: int | None = None, api_key: str | None = None,
                workload: str | None = None, timeout_s: float = 600.0, image_size: int = 224, seed: int = 0,
                sleep=time.sleep, execution: str = "sync", rtc: bool = False, back_to_back: int = 0,
                client_keep_warm_ms: float | None = None) -> dict:
    """Returns a vlaperf result dict with the numbers under "rollout". `execution`: "sync" (wait for each chunk)
    or "async" (execute while the next is computed); `rtc` asks for real-time chunking (async execution);
    `back_to_back`: closed-loop calls after each episode, the loop's calls' baseline (0: none);
    `client_keep_warm_ms`: the client pings the server this often between calls (Client's keep_warm_ms)."""
    if execution not in ("sync", "async"):
        raise LoadgenError(f"execution must be 'sync' or 'async', got {execution!r}")
    if rtc:
        execution = "async"
    url = check_loopback_url(url)
    if not isinstance(episodes, int) or not 1 <= episodes <= MAX_EPISODES:
        raise LoadgenError(f"episodes must be an integer in [1, {MAX_EPISODES}], got {episodes!r}")
    if not isinstance(steps_per_episode, int) or not 1 <= steps_per_episode <= MAX_STEPS:
        raise LoadgenError(f"steps_per_episode must be an integer in [1, {MAX_STEPS}], got {steps_per_episode!r}")
    if not 0 < control_hz <= MAX_CONTROL_HZ:
        raise LoadgenError(f"control_hz must be in (0, {MAX_CONTROL_HZ:g}], got {control_hz!r}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise LoadgenError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}], got {timeout_s!r}")
    if isinstance(back_to_back, bool) or not isinstance(back_to_back, int) or not 0 <= back_to_back <= MAX_BACK_TO_BACK:
        raise LoadgenError(f"back_to_back must be an integer in [0, {MAX_BACK_TO_BACK}], got {back_to_back!r}")
    if client_keep_warm_ms is not None and (isinstance(client_keep_warm_ms, bool) or
                                            not isinstance(client_keep_warm_ms, (int, float)) or
                                            not 0 < client_keep_warm_ms <= MAX_CLIENT_KEEP_WARM_MS):
        raise LoadgenError(f"client_keep_warm_ms must be a number of ms in (0, {MAX_CLIENT_KEEP_WARM_MS:g}], or None; "
                           f"got {client_keep_warm_ms!r}")
    check_workload_id(workload)
    try:
        client = Client(url, api_key=api_key, timeout_s=min(timeout_s, 60.0), keep_warm_ms=client_keep_warm_ms)
    except Exception as e:
        raise LoadgenError(f"cannot connect to {url}: {type(e).__name__}: {e}") from None
    with client:
        meta = client.metadata
        wl = resolve_workload(meta, workload)
        horizon = int(meta.get("action_horizon") or getattr(wl, "horizon", 0))
        if replan_every is None:
            replan_every = min(DEFAULT_REPLAN_EVERY, horizon)
        if not isinstance(replan_every, int) or not 1 <= replan_every <= horizon:
            raise LoadgenError(f"replan_every (--replan-every) must be an integer in [1, {horizon}] (the served action "
                               f"horizon), got {replan_every!r}")
        if rtc and not meta.get("rtc"):
            raise LoadgenError(f"rtc (--rtc): the server at {url} does not serve real-time chunking (start it with "
                               "`vlaperf serve --rtc`); --async executes while the next chunk is computed without it")
        period = 1.0 / control_hz
        frames = [example_for(wl, seed=seed + k, image_size=image_size) for k in range(8)]
        # as sent: with a request_id as long as any a run can send (e<episode>-s<step>, or -b<call> back to back) and,
        # with rtc, the two rtc keys at their largest (the position and delay, at most the horizon)
        sent = dict(frames[0], request_id=f"e{MAX_EPISODES - 1}-s{MAX_STEPS - 1}",
                    **({RTC_EXECUTED_KEY: horizon, RTC_DELAY_KEY: horizon} if rtc else {}))
        check_request_size(meta, sent, image_size)
        t_warm = time.perf_counter()
        try:  # connection warm-up, not timed; a server that refuses the observation says why here, once
            client.infer(dict(frames[0]))
        except ServerError as e:
            raise LoadgenError(f"the server refused the first observation: {e}") from None
        except TimeoutError:  # each call has the run's limit (at most 60 s): say so, not a bare TimeoutError
            raise LoadgenError(f"the first call had no reply within {client.timeout_s:g} s (timeout_s, --timeout-s, "
                               "which is also each call's limit up to 60 s)") from None
        except Exception as e:  # the connection closed (e.g. a message over the server's size limit)
            raise LoadgenError(f"the first call failed: {type(e).__name__}: {e}") from None
        deadline = time.perf_counter() + timeout_s
        rows, all_calls, all_infer, errors, timed_out, connection_lost, b2b, split = _episodes(
            client, frames, episodes, steps_per_episode, period, replan_every, execution, rtc, deadline, sleep,
            round_trip_s=time.perf_counter() - t_warm, back_to_back=back_to_back)
        pings = client.keep_warm_pings
    total_wall = sum(r["wall_s"] for r in rows)
    total_wait = sum(r["policy_wait_s"] for r in rows)
    result = result_header("rollout", meta, wl)
    result["rollout"] = {
        "url": url,
        "observations": "SYNTHETIC: random images (pi0 family: vlaperf.inputs.make_example) or latents (world-action model: "
                        "vlaperf.policy.make_wam_example) and state; no simulator or robot, "
                        "actions are not applied",
        "episodes": episodes,
        "steps_per_episode": steps_per_episode,
        "control_hz": control_hz,
        "replan_every": replan_every,
        "execution": execution,
        "rtc": rtc,
        # the client's own keep-warm (files from session 52 on): its period and the pings it sent
        "client_keep_warm_ms": client_keep_warm_ms,
        "client_keep_warm_pings": pings,
        "action_horizon": horizon,
        "image_size": image_size,
        "seed": seed,
        "timed_out": timed_out,
        "connection_lost": connection_lost,
        "errors": errors,
        "per_episode": rows,
        "wall_s": total_wall,
        "policy_wait_s": total_wait,
        "policy_wait_share": total_wait / total_wall if total_wall > 0 else None,
        "overrun_steps": sum(r["overrun_steps"] for r in rows),
        "policy_call_ms": summarize(all_calls) if all_calls else None,
        "server_infer_ms": summarize(all_infer) if all_infer else None,
        # the answered calls' round trips placed piece by piece (vlaperf.serve.broker.SPLIT_KEYS; files from session
        # 51 on): the wait for the server's inference thread, the rest of the round trip, and of that the event
        # loop's wake-up for the result and what is outside the server
        **{k: summarize(split[k]) if split[k] else None for k in SPLIT_KEYS},
        # the calls that arrived during one of the server's keep-warm runs and waited for it (None: the server has
        # no keep-warm, or is older than session 53)
        "keep_warm_waited_calls": _waited(split["keep_warm_wait_ms"]),
        "back_to_back": None,
        "at_cadence_over_back_to_back": None,
        "at_cadence_extra_ms": None,
    }
    if back_to_back:
        base = {"policy_call_ms": summarize(b2b.call_ms) if b2b.call_ms else None,
                "server_infer_ms": summarize(b2b.infer_ms) if b2b.infer_ms else None}
        parts = {k: summarize(b2b.split[k]) if b2b.split[k] else None for k in SPLIT_KEYS}
        ro = result["rollout"]
        ro["back_to_back"] = {"calls_per_episode": back_to_back, "errors": b2b.errors,
                              **({"guided": b2b.guided} if rtc else {}), **base, **parts,
                              "keep_warm_waited_calls": _waited(b2b.split["keep_warm_wait_ms"])}
        ro["at_cadence_over_back_to_back"] = {
            k: (ro[k]["median"] / base[k]["median"] if ro[k] and base[k] and base[k]["median"] > 0 else None)
            for k in base}
        # where the loop's extra time goes: the medians' differences, piece by piece (medians do not add up exactly)
        ro["at_cadence_extra_ms"] = {k: (ro[k]["median"] - v["median"] if ro[k] and v else None)
                                     for k, v in {**base, **parts}.items()}
    if execution == "async":
        jumps = [j for r in rows for j in r["switch_jumps"]]
        result["rollout"].update({
            "stall_steps": sum(r["stall_steps"] for r in rows),
            "switches": sum(r["switches"] for r in rows),
            "guided_switches": sum(r["guided_switches"] for r in rows),
            "late_switches": sum(r["late_switches"] for r in rows),
            "switch_jump": summarize(jumps) if jumps else None,
        })
    return result


def _waited(waits_ms: list[float]) -> int | None:
    return sum(w > 0 for w in waits_ms) if waits_ms else None


def _waited_at(waits_ms: list[float]) -> list[int] | None:
    """Which of an episode's answered calls (counted from 0, its first) waited for a keep-warm run: where in the
    episode they fall tells a server's forecast (none for an episode's first calls, whose arrivals follow the
    closed-loop burst or the reset) from a keep-warm period that meets a steady loop. None: the server said nothing
    (no keep-warm, or older than session 53)."""
    if not any(w == w for w in waits_ms):
        return None
    return [i for i, w in enumerate(waits_ms) if w == w and w > 0]


@dataclass
class BackToBack:
    """The closed-loop calls after the episodes (`back_to_back`)."""

    call_ms: list[float] = field(default_factory=list)  # each timed call's round trip, answered or refused
    infer_ms: list[float] = field(default_factory=list)  # the server's own inference time of each answered one
    # each answered one's round trip placed by call_split, one list per SPLIT_KEYS key
    split: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SPLIT_KEYS})
    errors: int = 0  # refused (the untimed first call of a burst included)
    guided: int = 0  # answered with rtc.guided (real-time chunking)


def _failure(e: Exception, client) -> str:
    """Why a call ended the run: a reply overdue past each call's limit is named as such (its late reply would
    answer the next request), any other error as the connection failing."""
    if isinstance(e, TimeoutError):
        return f"no reply within {client.timeout_s:g} s (each call's limit: --timeout-s, at most 60 s)"
    return f"the connection failed: {type(e).__name__}: {e}"


def _back_to_back(client, frames, calls: int, rtc: bool, replan_every: int, deadline: float, into: BackToBack,
                  episode: int) -> tuple[bool, str | None]:
    """One untimed call (the one after the episode's idle), then `calls` timed ones, each sent when the previous
    reply is in; with `rtc` each as the loop's guided requests are (the server holds this connection's last chunk).
    Returns (timed_out, connection_lost)."""
    for k in range(calls + 1):
        if time.perf_counter() > deadline:
            return True, None
        obs = dict(frames[k % len(frames)], request_id=f"e{episode}-b{k}")
        if rtc:
            obs.update({RTC_EXECUTED_KEY: replan_every, RTC_DELAY_KEY: 1})
        t0 = time.perf_counter()
        try:
            reply = client.infer(obs)
        except ServerError:
            reply = None
        except Exception as e:  # the connection is gone (or its reply overdue)
            return False, f"episode {episode}, back-to-back call {k}: " + _failure(e, client)
        rt_ms = (time.perf_counter() - t0) * 1e3
        if reply is None:
            into.errors += 1
        if k == 0:
            continue
        into.call_ms.append(rt_ms)
        if reply is not None:
            infer, split = call_split(reply, rt_ms, **client_stamps(client, t0))
            if infer == infer:
                into.infer_ms.append(infer)
            for k, v in split.items():
                if v == v:
                    into.split[k].append(v)
            into.guided += bool((reply.get("rtc") or {}).get("guided"))
    return False, None


def _episodes(client, frames, episodes: int, steps: int, period: float, replan_every: int, execution: str, rtc: bool,
              deadline: float, sleep, round_trip_s: float, back_to_back: int = 0):
    """The episodes, each through a `ChunkBroker` (vlaperf.serve.broker; synchronous or not), each followed by
    `back_to_back` closed-loop calls: (rows, calls, server inference times, errors, timed_out, connection_lost:
    where the connection failed; the episodes up to there are kept and reported, BackToBack, the loop's calls'
    {SPLIT_KEYS: ms})."""
    from vlaperf.serve.broker import ChunkBroker

    asynchronous = execution == "async"
    b2b = BackToBack()
    rows, all_calls, all_infer, errors, timed_out, connection_lost = [], [], [], 0, False, None
    split: dict[str, list[float]] = {k: [] for k in SPLIT_KEYS}
    with ChunkBroker(client, 1.0 / period, replan_every, rtc=rtc, round_trip_s=round_trip_s,
                     asynchronous=asynchronous) as broker:
        for ep in range(episodes):
            broker.reset()
            overruns, steps_done, overran_at = 0, 0, []
            t_ep = time.perf_counter()
            for step in range(steps):
                t_step = time.perf_counter()
                if t_step > deadline:
                    timed_out = True
                    break
                obs = dict(frames[(ep * steps + step) % len(frames)], request_id=f"e{ep}-s{step}")
                answered = len(broker.stats.infer_ms)  # one entry per answered call, as keep_warm_waited_at counts
                try:
                    broker.act(obs)  # the action is "executed": there is no robot to send it to
                except ServerError:
                    pass  # counted in the broker's stats; the step passes without an action
                except Exception as e:  # the connection is gone (or its reply overdue): no later call can succeed
                    connection_lost = f"episode {ep}, step {step}: " + _failure(e, client)
                    break
                steps_done += 1
                elapsed = time.perf_counter() - t_step
                if elapsed > period:
                    overruns += 1
                    if len(broker.stats.infer_ms) > answered:  # the step's call made it overrun
                        overran_at.append(answered)
                else:
                    sleep(period - elapsed)
            wall, st = time.perf_counter() - t_ep, broker.stats
            row = {
                "episode": ep, "steps": steps_done, "policy_calls": len(st.call_ms), "wall_s": wall,
                "ideal_wall_s": steps_done * period, "policy_wait_s": st.wait_s,
                "policy_wait_share": st.wait_s / wall if wall > 0 else None, "overrun_steps": overruns,
                "policy_call_ms": summarize(st.call_ms) if st.call_ms else None,
                "keep_warm_waited_at": _waited_at(st.split["keep_warm_wait_ms"]),
                # which answered calls (counted from 0, as keep_warm_waited_at) made their step overrun its period
                # (synchronous only): the loop's later requests come late by as much
                "overran_at": None if asynchronous else overran_at,
            }
            if asynchronous:
                row.update({"stall_steps": st.stalls, "switches": st.switches, "guided_switches": st.guided_switches,
                            "late_switches": st.late_switches, "switch_jumps": list(st.jumps)})
            rows.append(row)
            all_calls += st.call_ms
            all_infer += [v for v in st.infer_ms if v == v]
            for k in split:
                split[k] += [v for v in st.split[k] if v == v]
            errors += st.errors
            if timed_out or connection_lost:
                break
            if back_to_back:
                broker.reset()  # a call still in flight (async) is waited for first: the connection is free
                timed_out, connection_lost = _back_to_back(client, frames, back_to_back, rtc, replan_every, deadline,
                                                           b2b, ep)
                if timed_out or connection_lost:
                    break
                if ep < episodes - 1:
                    # the next episode's first call after a chunk's worth of idle, as if its episode had run on: not
                    # straight after the burst, which would make it a closed-loop call too
                    sleep(replan_every * period)
    # a refused closed-loop call counts among the errors (the exit code) as a refused loop call does
    return rows, all_calls, all_infer, errors + b2b.errors, timed_out, connection_lost, b2b, split
