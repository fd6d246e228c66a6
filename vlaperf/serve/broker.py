"""`ChunkBroker`: one action per control step from a policy server, the next chunk asked for in the background
while the current one runs (real-time chunking's execution). openpi-client's ActionChunkBroker waits for each
chunk instead; with this one a robot waits only where its chunk runs out before the next arrives.

    from vlaperf.serve.client import Client
    from vlaperf.serve.broker import ChunkBroker

    with Client("ws://127.0.0.1:8000") as client:
        broker = ChunkBroker(client, control_hz=50, replan_every=5, rtc=True)   # rtc: a `vlaperf serve --rtc` server
        for step in range(steps):
            robot.apply(broker.act(observation()))   # (robot_action_dim,) float32, the action for this step
        broker.reset()                                # a new episode: its first chunk unguided
        broker.close()

How a switch works: after `replan_every` actions of the current chunk, `act` sends the observation it was given
from a background thread and keeps handing out the chunk's next actions. When the reply arrives, the new chunk
takes over at the position that matches the steps handed out since that observation (its first ones stand for
time already gone). With `rtc=True` each request also carries "rtc/executed" (the position in the running chunk
when the observation was taken) and "rtc/delay" (the last round trip in control steps, rounded up), so the server
holds the new chunk's start to what the robot does meanwhile. `stats` counts what happened: calls, the time `act`
waited, stalls, switches (guided, late), and each switch's jump (how far the action handed out next moved from
the one the old chunk had there, L2 in the robot's units).

A request the server refuses (ServerError) leaves the running chunk in use and is counted in `stats.errors`; where
no chunk is running yet (an episode's first call), `act` raises it. A failed connection raises. With
`asynchronous=False` the broker waits for each chunk instead, as openpi-client's ActionChunkBroker does.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from vlaperf.serve.client import ServerError
from vlaperf.serve.protocol import RTC_DELAY_KEY, RTC_EXECUTED_KEY


# How `call_split` places one answered call's round trip (ms), besides the server's policy call (`infer_ms`):
SPLIT_KEYS = (
    "server_queue_ms",  # its wait for the server's inference thread (the thread's wake-up when it was idle)
    "front_end_ms",  # the rest of the round trip: round trip - infer - queue
    "server_handoff_ms",  # of that rest, the event loop's wake-up for the result (servers from session 51 on)
    "client_side_ms",  # of that rest, what is outside the server: round trip - its frame-received-to-reply-built time
    # of what is outside the server, where the client and the server share a clock (one host: rollout and loadgen
    # take loopback URLs only): from the client's send to the server's frame received (the request's packing and
    # send, the loopback, the server's event loop waking to read it), and the rest (the reply's packing and send,
    # the loopback, the client waking to read it and unpacking it); servers from session 52 on
    "uplink_ms",
    "downlink_ms",
    # the client's own pieces of those two ways (any server): the request's packing, the reply's unpacking
    "client_pack_ms",
    "client_unpack_ms",
    # of the wait for the inference thread, what the request spent behind a keep-warm run (servers with
    # --keep-warm-ms from session 53 on; 0.0 for a request that found no run going)
    "keep_warm_wait_ms",
)


def call_split(reply: dict, round_trip_ms: float, sent_at_s: float | None = None, pack_ms: float | None = None,
               unpack_ms: float | None = None) -> tuple[float, dict[str, float]]:
    """(the server's policy call, {SPLIT_KEYS: ms}) of one answered call from its reply's server_timing; NaN where the
    server did not say (an older server has no handoff_ms / server_ms / received_at_s). `sent_at_s`: the client's
    time.perf_counter() as it began the call; with the reply's `received_at_s` (the server's, at the frame received)
    it places the uplink and the downlink, which are NaN without it, or where the two clocks are not one (the
    uplink would be negative or longer than what is outside the server). `pack_ms`, `unpack_ms`: the client's own
    (Client.last_pack_ms / last_unpack_ms), NaN without."""
    timing = reply.get("server_timing") or {}
    get = lambda key: float(timing.get(key, float("nan")))  # noqa: E731
    infer, queue = get("infer_ms"), get("queue_ms")
    outside = round_trip_ms - get("server_ms")
    uplink = math.nan if sent_at_s is None else (get("received_at_s") - sent_at_s) * 1e3
    if not 0.0 <= uplink <= outside:  # NaN stays NaN
        uplink = math.nan
    return infer, {"server_queue_ms": queue, "front_end_ms": round_trip_ms - infer - queue,
                   "server_handoff_ms": get("handoff_ms"), "client_side_ms": outside,
                   "uplink_ms": uplink, "downlink_ms": outside - uplink,
                   "client_pack_ms": math.nan if pack_ms is None else float(pack_ms),
                   "client_unpack_ms": math.nan if unpack_ms is None else float(unpack_ms),
                   "keep_warm_wait_ms": get("keep_warm_wait_ms")}


def client_stamps(client, sent_at_s: float) -> dict:
    """call_split's client-side arguments for the call `client` has just made (begun at `sent_at_s`, on the caller's
    time.perf_counter()); a client without vlaperf's Client's `last_pack_ms` gives NaN pieces."""
    return {"sent_at_s": sent_at_s, "pack_ms": getattr(client, "last_pack_ms", None),
            "unpack_ms": getattr(client, "last_unpack_ms", None)}


@dataclass
class BrokerStats:
    """What a broker did since its last `reset()`."""

    call_ms: list[float] = field(default_factory=list)  # each answered or refused call's round trip
    infer_ms: list[float] = field(default_factory=list)  # the server's own inference time of each answered call
    # each answered call's round trip placed by call_split, one list per SPLIT_KEYS key
    split: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SPLIT_KEYS})
    wait_s: float = 0.0  # time `act` spent blocked on the server (first calls and stalls)
    stalls: int = 0  # steps whose chunk ran out before the next arrived
    switches: int = 0  # new chunks that took over from a running one
    guided_switches: int = 0  # of them, chunks the server guided (its reply's rtc.guided)
    late_switches: int = 0  # of them, replies later than the delay their request declared
    jumps: list[float] = field(default_factory=list)  # per switch (where both chunks had the step): the jump
    errors: int = 0  # requests the server refused


class ChunkBroker:
    def __init__(self, client, control_hz: float, replan_every: int, rtc: bool = False,
                 round_trip_s: float | None = None, asynchronous: bool = True):
        """`client`: a connected vlaperf.serve.client.Client (only this broker's thread uses it while a call is
        in flight). `control_hz`: the rate `act` is called at, for the delay a request declares. `replan_every`:
        actions of a chunk handed out before the next is asked for. `round_trip_s`: a first estimate of a call's
        round trip (default: the episode's first call's). `asynchronous=False`: wait for each chunk where the
        next is asked for, as openpi-client's ActionChunkBroker does (`vlaperf rollout` without --async); its
        switches are counted and their jumps recorded the same way."""
        if not 0 < control_hz < math.inf:
            raise ValueError(f"control_hz: expected a finite number > 0, got {control_hz!r}")
        if isinstance(replan_every, bool) or not isinstance(replan_every, int) or replan_every < 1:
            raise ValueError(f"replan_every: expected an integer >= 1, got {replan_every!r}")
        if rtc and not asynchronous:
            raise ValueError("rtc: real-time chunking guides a chunk computed while the robot moves; it needs "
                             "asynchronous=True")
        self.client, self.period, self.replan_every, self.rtc = client, 1.0 / control_hz, replan_every, rtc
        self.asynchronous = asynchronous
        self.round_trip_s = round_trip_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlaperf-broker")
        self.stats = BrokerStats()
        self._chunk: np.ndarray | None = None
        self._pos = 0  # the next action of the running chunk to hand out
        self._step = 0  # `act` calls since reset
        self._pending: tuple[Future, int, int, int] | None = None  # (call, step sent, position sent, delay declared)

    def _call(self, request: dict):
        """(reply or None, the error or None, round trip s, call_split's client stamps)"""
        t0 = time.perf_counter()
        try:
            reply = self.client.infer(request)
            return reply, None, time.perf_counter() - t0, client_stamps(self.client, t0)
        except Exception as e:  # ServerError, or the connection gone: the caller tells them apart
            return None, e, time.perf_counter() - t0, None

    def _answered(self, reply: dict, round_trip_s: float, stamps: dict | None = None) -> np.ndarray:
        self.round_trip_s = round_trip_s
        infer, split = call_split(reply, round_trip_s * 1e3, **(stamps or {}))
        self.stats.infer_ms.append(infer)
        for k, v in split.items():
            self.stats.split[k].append(v)
        return np.asarray(reply["actions"])

    def act(self, obs: dict) -> np.ndarray:
        """The action for this control step; `obs` is the observation taken now (sent only when a chunk is asked
        for). Blocks only for an episode's first chunk or where the running chunk ran out."""
        step, self._step = self._step, self._step + 1
        if self._chunk is None or (not self.asynchronous and self._pos >= min(self.replan_every, len(self._chunk))):
            self._ask_and_wait(obs)  # nothing to execute (or a synchronous broker's turn): ask and wait
        if self._pending is not None and (self._pending[0].done() or self._pos >= len(self._chunk)):
            self._switch(step)
        if self.asynchronous and self._pending is None and self._pos >= min(self.replan_every, len(self._chunk)):
            delay = min(math.ceil((self.round_trip_s or 0.0) / self.period), len(self._chunk) - self._pos)
            request = dict(obs)
            if self.rtc:
                request.update({RTC_EXECUTED_KEY: int(self._pos), RTC_DELAY_KEY: int(delay)})
            self._pending = (self._pool.submit(self._call, request), step, self._pos, delay)
            if self._pos >= len(self._chunk):
                # asked for as the chunk ran out (replan_every = its length, or a shorter reply): this step has no
                # action but the new chunk's first, so it waits for it, a stall (it repeated the old chunk's last
                # action, no stall counted, and the switch a step later skipped the new chunk's first action)
                self._switch(step)
        if self._pos >= len(self._chunk):  # ran out and its next chunk was refused (asked for again): hold the last
            return self._chunk[-1]
        action = self._chunk[self._pos]
        self._pos += 1
        return action

    def _ask_and_wait(self, obs: dict) -> None:
        t0 = time.perf_counter()
        reply, error, rt, stamps = self._call(dict(obs))
        self.stats.wait_s += time.perf_counter() - t0
        if error is not None and not isinstance(error, ServerError):
            raise error  # the connection failed: no round trip to count
        self.stats.call_ms.append(rt * 1e3)
        if error is not None:
            self.stats.errors += 1
            if self._chunk is None:
                raise error
            return  # a synchronous broker's refused call: the running chunk goes on
        new = self._answered(reply, rt, stamps)
        if self._chunk is not None:  # a synchronous switch: the new chunk takes over at once
            self.stats.switches += 1
            if self._pos < len(self._chunk):
                self.stats.jumps.append(float(np.linalg.norm(new[0] - self._chunk[self._pos])))
        self._chunk, self._pos = new, 0

    def _switch(self, step: int) -> None:
        future, sent_step, sent_pos, delay = self._pending
        if not future.done():  # the running chunk ran out first: the robot stands still until the reply
            self.stats.stalls += 1
            t0 = time.perf_counter()
            future.result()
            self.stats.wait_s += time.perf_counter() - t0
        self._pending = None
        reply, error, rt, stamps = future.result()
        if error is not None and not isinstance(error, ServerError):
            raise error  # the connection failed: no round trip to count
        self.stats.call_ms.append(rt * 1e3)
        if error is not None:
            self.stats.errors += 1  # the robot goes on with the chunk it has
            return
        new = self._answered(reply, rt, stamps)
        gone = step - sent_step  # actions handed out since the observation: the new chunk's first ones
        self.stats.late_switches += gone > delay
        self.stats.guided_switches += bool((reply.get("rtc") or {}).get("guided"))
        if gone < len(new) and sent_pos + gone < len(self._chunk):  # what would run next, old and new
            self.stats.jumps.append(float(np.linalg.norm(new[gone] - self._chunk[sent_pos + gone])))
        self.stats.switches += 1
        self._chunk, self._pos = new, min(gone, len(new))

    def reset(self) -> None:
        """A new episode: the running chunk dropped (the next `act` asks and waits, unguided), a call still in
        flight waited for and its reply discarded, the stats zeroed."""
        if self._pending is not None:
            self._pending[0].result()
            self._pending = None
        self._chunk, self._pos, self._step = None, 0, 0
        self.stats = BrokerStats()

    def close(self) -> None:
        self.reset()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "ChunkBroker":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Ctrl-C (or exit): a call in flight is not waited for. Against a server that hangs, that wait lasted
            # until the client's timeout or its keepalive gave up (`vlaperf rollout --async`: 44 s after Ctrl-C);
            # the call's thread ends as the client's connection is closed.
            self._pending = None
            self._pool.shutdown(wait=False, cancel_futures=True)
            return
        self.close()
