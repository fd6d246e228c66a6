"""Closed-loop load generator for the policy server.

N clients, each on its own websocket connection, send `requests` observations one after
another (each waits for its reply before sending the next), all clients starting together.
Per request it records the round trip (pack + send + server + receive + unpack) and the
server's own `server_timing`, and checks the reply: an `actions` float32 array of shape
(action_horizon, robot_action_dim), finite, and the `request_id` it sent (unique per request)
echoed back, so a reply routed to the wrong client or request is caught.

Observations are `vlaperf.inputs.make_example` (random pixels and state), made before the
clock starts. Bounded: at most 256 clients, 10 000 requests per client and one hour per
phase; loopback servers only (this is a benchmark tool, not a way to load someone's host).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vlaperf.inputs import make_example
from vlaperf.serve.broker import call_split
from vlaperf.serve.client import ServerError, connect_async, decode_reply, normalize_url
from vlaperf.serve.protocol import ProtocolError, packb
from vlaperf.serve.server import REQUEST_ID_KEY, is_loopback
from vlaperf.timing import summarize

MAX_CLIENTS, MAX_REQUESTS, MAX_TIMEOUT_S, MAX_WARMUP = 256, 10_000, 3600.0, 100
ERROR_SAMPLES = 5


class LoadgenError(ValueError):
    """Bad arguments, a non-loopback URL, or a server that cannot be reached."""


def check_loopback_url(url: str) -> str:
    try:
        url = normalize_url(url)
    except ValueError as e:
        raise LoadgenError(str(e)) from None
    host = urlsplit(url).hostname or ""
    if not is_loopback(host):
        raise LoadgenError(f"refusing to send load to {host!r}: loadgen and rollout only target loopback servers "
                           "(127.0.0.0/8, ::1, localhost), e.g. ws://127.0.0.1:8000")
    return url


def _summary(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return summarize(values) if values else None


class _Client:
    def __init__(self, index: int):
        self.index = index
        self.ok = self.errors = self.misrouted = self.invalid = 0
        self.sent = 0  # timed requests sent: a closed loop sends the next after the last reply
        self.round_trip_ms: list[float] = []
        self.infer_ms: list[float] = []
        self.queue_ms: list[float] = []
        self.overhead_ms: list[float] = []
        # of the overhead (servers from session 51 on): the event loop's wake-up for the result, and what is outside
        # the server (round trip - its received-to-reply-built time: the client, the network, packing and sending)
        self.handoff_ms: list[float] = []
        self.client_side_ms: list[float] = []
        # of what is outside the server (servers from session 52 on; one host, one clock): the request's way to the
        # server (packing, send, the server's event loop reading it) and the reply's way back
        self.uplink_ms: list[float] = []
        self.downlink_ms: list[float] = []
        self.pack_ms: list[float] = []  # of those, the request's packing and the reply's unpacking here
        self.unpack_ms: list[float] = []
        # the batch each request was served in: summarized over requests, a call of 4 counts 4 times (not the
        # server's observations per call)
        self.batch_size: list[float] = []
        self.error_kinds: Counter = Counter()
        self.error_samples: list[str] = []
        self.t_first: float | None = None  # when its first timed request was sent
        self.t_last: float | None = None

    def error(self, kind: str, message: str) -> None:
        self.errors += 1
        self.error_kinds[kind] += 1
        if len(self.error_samples) < ERROR_SAMPLES:
            self.error_samples.append(f"client {self.index}: {kind}: {message}"[:500])


def check_reply(reply: Any, request_id: str, horizon: int | None, action_dim: int | None) -> str | None:
    """None if `reply` is a well-formed result for `request_id`, else what is wrong."""
    if not isinstance(reply, dict):
        return f"reply is a {type(reply).__name__}, not a dict"
    if reply.get(REQUEST_ID_KEY) != request_id:
        return f"misrouted: sent request_id {request_id!r}, got {reply.get(REQUEST_ID_KEY)!r}"
    actions = reply.get("actions")
    if not isinstance(actions, np.ndarray) or actions.dtype != np.float32:
        return f"actions: expected a float32 array, got {type(actions).__name__} {getattr(actions, 'dtype', '')}"
    if horizon is not None and action_dim is not None and actions.shape != (horizon, action_dim):
        return f"actions: expected shape ({horizon}, {action_dim}), got {actions.shape}"
    if not np.isfinite(actions).all():
        return "actions hold NaN or inf"
    if not isinstance(reply.get("server_timing"), dict):
        return "server_timing missing"
    return None


async def _run_client(c: _Client, url: str, api_key: str | None, examples: list[dict], requests: int, warmup: int,
                      nonce: str, ready: list, start: asyncio.Event, n_clients: int, meta_box: dict) -> None:
    try:
        ws = await connect_async(url, api_key)
    except Exception as e:
        c.error("ConnectError", f"{type(e).__name__}: {e}")
        _arrive(ready, start, n_clients)
        return
    try:
        meta = decode_reply(await ws.recv())
        meta_box.setdefault("metadata", meta)
        horizon, dim = meta.get("action_horizon"), meta.get("robot_action_dim")
        for w in range(warmup):
            ex = dict(examples[w % len(examples)], **{REQUEST_ID_KEY: f"{nonce}-c{c.index}-w{w}"})
            await ws.send(packb(ex))
            await ws.recv()
        _arrive(ready, start, n_clients)
        await start.wait()
        for r in range(requests):
            rid = f"{nonce}-c{c.index}-r{r}"
            ex = dict(examples[r % len(examples)], **{REQUEST_ID_KEY: rid})
            t0 = time.perf_counter()
            if c.t_first is None:
                c.t_first = t0
            frame = packb(ex)
            pack_ms = (time.perf_counter() - t0) * 1e3
            await ws.send(frame)
            c.sent += 1
            frame = await ws.recv()
            t_got = time.perf_counter()
            try:
                reply = decode_reply(frame)
            except ServerError as e:
                t1 = time.perf_counter()
                c.error(e.kind, e.message)
                c.t_last = t1
                continue
            except ProtocolError as e:
                c.error("BadReply", str(e))
                continue
            t1 = time.perf_counter()
            c.t_last = t1
            problem = check_reply(reply, rid, horizon, dim)
            if problem is not None:
                if problem.startswith("misrouted"):
                    c.misrouted += 1
                else:
                    c.invalid += 1
                c.error("Misrouted" if problem.startswith("misrouted") else "InvalidReply", problem)
                continue
            rtt = (t1 - t0) * 1e3
            st = reply["server_timing"]
            infer, queue = float(st.get("infer_ms", math.nan)), float(st.get("queue_ms", 0.0))
            c.ok += 1
            c.round_trip_ms.append(rtt)
            c.infer_ms.append(infer)
            c.queue_ms.append(queue)
            c.overhead_ms.append(rtt - infer - queue)
            # the pieces a rollout records too, NaN from an older server
            _, split = call_split(reply, rtt, t0, pack_ms, (t1 - t_got) * 1e3)
            if not (math.isnan(split["server_handoff_ms"]) or math.isnan(split["client_side_ms"])):
                c.handoff_ms.append(split["server_handoff_ms"])
                c.client_side_ms.append(split["client_side_ms"])
            if not math.isnan(split["uplink_ms"]):
                c.uplink_ms.append(split["uplink_ms"])
                c.downlink_ms.append(split["downlink_ms"])
            c.pack_ms.append(split["client_pack_ms"])
            c.unpack_ms.append(split["client_unpack_ms"])
            c.batch_size.append(float(st.get("batch_size", 1)))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        c.error("ConnectionError", f"{type(e).__name__}: {e}")
    finally:
        _arrive(ready, start, n_clients)  # no-op if already counted
        await ws.close()


def _arrive(ready: list, start: asyncio.Event, n: int) -> None:
    """A start barrier (asyncio.Barrier needs Python 3.11): the last client to arrive starts all."""
    task = asyncio.current_task()
    if task in ready[0]:
        return
    ready[0].add(task)
    if len(ready[0]) >= n:
        start.set()


async def _phase(url: str, api_key: str | None, workload, n_clients: int, requests: int, warmup: int,
                 timeout_s: float, image_size: int, seed: int, meta_box: dict) -> dict:
    nonce = secrets.token_hex(4)
    pool = 4  # distinct observations per client, cycled
    examples = [[example_for(workload, seed=seed + 1000 * i + k, image_size=image_size) for k in range(pool)]
                for i in range(n_clients)]
    clients = [_Client(i) for i in range(n_clients)]
    ready: list = [set()]
    start = asyncio.Event()
    tasks = [asyncio.create_task(_run_client(c, url, api_key, examples[c.index], requests, warmup, nonce, ready, start,
                                             n_clients, meta_box)) for c in clients]
    timed_out = False
    t_begin = time.perf_counter()
    waiter = asyncio.ensure_future(start.wait())
    try:
        await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        t_start = time.perf_counter()
        remaining = max(0.0, timeout_s - (t_start - t_begin))
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        timed_out = bool(pending)
    except asyncio.TimeoutError:
        timed_out = True
    for t in tasks:
        if not t.done():
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()
    # from the first timed request to the last reply: the clients send as the barrier opens, before this coroutine
    # reads its clock again (counted from its wake-up, 2 clients x 1 request took "0.27 ms" for 0.49 ms round trips)
    firsts = [c.t_first for c in clients if c.t_first is not None]
    ends = [c.t_last for c in clients if c.t_last is not None]
    wall = max(ends) - min(firsts) if ends else 0.0
    ok = sum(c.ok for c in clients)
    errors = sum(c.errors for c in clients)
    horizon = (meta_box.get("metadata") or {}).get("action_horizon") or 0
    expected = n_clients * requests
    kinds: Counter = Counter()
    for c in clients:
        kinds.update(c.error_kinds)
    return {
        "clients": n_clients,
        "requests_per_client": requests,
        "expected": expected,
        "ok": ok,
        "errors": errors,
        "misrouted": sum(c.misrouted for c in clients),
        "invalid": sum(c.invalid for c in clients),
        # sent and never answered (at most one a client when the time limit stops it), apart from those the limit
        # left unsent: only the first are lost replies
        "lost": sum(max(0, c.sent - c.ok - c.errors) for c in clients),
        "unsent": expected - sum(c.sent for c in clients),
        "timed_out": timed_out,
        "wall_s": wall,
        "requests_per_s": ok / wall if wall > 0 else None,
        "action_chunks_per_s": ok / wall if wall > 0 else None,
        "actions_per_s": ok * horizon / wall if wall > 0 else None,
        "round_trip_ms": _summary([v for c in clients for v in c.round_trip_ms]),
        "server_infer_ms": _summary([v for c in clients for v in c.infer_ms]),
        "queue_ms": _summary([v for c in clients for v in c.queue_ms]),
        "overhead_ms": _summary([v for c in clients for v in c.overhead_ms]),
        "handoff_ms": _summary([v for c in clients for v in c.handoff_ms]),
        "client_side_ms": _summary([v for c in clients for v in c.client_side_ms]),
        "uplink_ms": _summary([v for c in clients for v in c.uplink_ms]),
        "downlink_ms": _summary([v for c in clients for v in c.downlink_ms]),
        "pack_ms": _summary([v for c in clients for v in c.pack_ms]),
        "unpack_ms": _summary([v for c in clients for v in c.unpack_ms]),
        "batch_size": _summary([v for c in clients for v in c.batch_size]),
        "error_kinds": dict(kinds),
        "error_samples": [s for c in clients for s in c.error_samples][:ERROR_SAMPLES],
        "per_client": [{"client": c.index, "ok": c.ok, "errors": c.errors, "misrouted": c.misrouted,
                        "round_trip_ms": _summary(c.round_trip_ms)} for c in clients],
    }


def check_request_size(metadata: dict, example, image_size: int) -> None:
    """LoadgenError if one request is larger than the server's message limit (from its metadata): sent, it would
    be refused with the connection closed (1009) in the middle of the run. `example` is the request as sent, with
    its request_id at its longest and any other key the request adds (measured without them, a request within
    ~30 bytes of the limit passed here and closed the connection mid-run)."""
    limit = metadata.get("max_message_bytes")
    size = len(packb(example))
    if isinstance(limit, int) and size > limit:
        raise LoadgenError(f"image_size {image_size}: one request is {size / 2**20:.1f} MiB, above the server's "
                           f"{limit / 2**20:g} MiB message limit (its --max-message-mb); use a smaller image size "
                           f"(the model's own: {metadata.get('image_size', '?')})")


async def fetch_metadata(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> dict:
    ws = await connect_async(url, api_key, timeout_s=timeout_s)
    try:
        frame = await asyncio.wait_for(ws.recv(), timeout_s)
    except asyncio.TimeoutError:  # bare, it said only "cannot connect to ...: TimeoutError: "
        raise TimeoutError(f"connected, but the server sent no metadata within {timeout_s:g} s (a policy server "
                           "sends it first)") from None
    else:
        return decode_reply(frame)
    finally:
        await ws.close()


def example_for(workload, seed: int, image_size: int) -> dict:
    """A synthetic observation for the served workload: camera images for the pi0 family, the
    observed frame's latents for the world-action model."""
    from vlaperf.workloads import is_wam_workload

    if is_wam_workload(workload.id):
        from vlaperf.policy import make_wam_example

        return make_wam_example(workload, seed=seed)
    return make_example(workload, seed=seed, image_size=image_size)


def check_workload_id(workload_id: str | None) -> None:
    """LoadgenError for a --workload no workload has, with the known ones, before the server is asked (it was
    compared with the served one first: "the server serves workload 'tiny', not 'nosuch'")."""
    from vlaperf.workloads import get_wam_workload, get_workload, is_wam_workload

    if not workload_id:
        return
    try:
        get_wam_workload(workload_id) if is_wam_workload(workload_id) else get_workload(workload_id)
    except ValueError as e:
        raise LoadgenError(str(e)) from None


def resolve_workload(metadata: dict, workload_id: str | None):
    from vlaperf.workloads import get_wam_workload, get_workload, is_wam_workload

    served = metadata.get("workload")
    if workload_id and served and workload_id != served:
        raise LoadgenError(f"the server serves workload {served!r}, not {workload_id!r}")
    wid = workload_id or served
    if not wid:
        raise LoadgenError("the server does not say which workload it serves; pass --workload")
    try:
        return get_wam_workload(wid) if is_wam_workload(wid) else get_workload(wid)
    except ValueError as e:
        raise LoadgenError(str(e)) from None


def result_header(command: str, metadata: dict, workload) -> dict:
    from vlaperf.report.schema import SCHEMA
    from vlaperf.timing import environment_record

    return {
        "schema": SCHEMA,
        "command": command,
        "workload": {"id": workload.id, "overrides": metadata.get("workload_overrides", {})},
        "variant": {"levers": metadata.get("levers", []), "label": metadata.get("levers_label", ""),
                    "dtype": metadata.get("dtype"), "checkpoint": metadata.get("checkpoint")},
        "mode": "serve",
        # loopback only: the server runs on this machine, so this is its environment too
        "env": environment_record(metadata.get("device") or "cpu"),
        "server": metadata,
    }


def run_loadgen(url: str = "ws://127.0.0.1:8000", clients: tuple[int, ...] | list[int] = (1, 4, 8), requests: int = 20,
                timeout_s: float = 120.0, api_key: str | None = None, workload: str | None = None, warmup: int = 1,
                image_size: int = 224, seed: int = 0) -> dict:
    """One phase per entry of `clients`; returns a vlaperf result dict (numbers under "loadgen")."""
    url = check_loopback_url(url)
    clients = list(clients)
    if not clients or any(not isinstance(n, int) or not 1 <= n <= MAX_CLIENTS for n in clients):
        raise LoadgenError(f"clients must be integers in [1, {MAX_CLIENTS}], got {clients}")
    if not isinstance(requests, int) or not 1 <= requests <= MAX_REQUESTS:
        raise LoadgenError(f"requests must be an integer in [1, {MAX_REQUESTS}], got {requests!r}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise LoadgenError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:.0f}], got {timeout_s!r}")
    if not isinstance(warmup, int) or not 0 <= warmup <= MAX_WARMUP:
        raise LoadgenError(f"warmup must be an integer in [0, {MAX_WARMUP}], got {warmup!r}")
    check_workload_id(workload)

    async def main() -> dict:
        try:
            metadata = await fetch_metadata(url, api_key, timeout_s=min(timeout_s, 30.0))
        except ServerError as e:
            raise LoadgenError(f"server at {url} answered with an error: {e}") from None
        except Exception as e:
            raise LoadgenError(f"cannot connect to {url}: {type(e).__name__}: {e}") from None
        wl = resolve_workload(metadata, workload)
        # as sent: with a request_id as long as any a run can send (nonce-c<client>-r<request>, 8 hex digits of
        # nonce; a warm-up's -w<k> is shorter), a few bytes more than this run's at most
        longest_id = f"{'0' * 8}-c{MAX_CLIENTS - 1}-r{MAX_REQUESTS - 1}"
        check_request_size(metadata, dict(example_for(wl, seed=seed, image_size=image_size),
                                          **{REQUEST_ID_KEY: longest_id}), image_size)
        phases = []
        for n in clients:
            box: dict = {"metadata": metadata}
            phases.append(await _phase(url, api_key, wl, n, requests, warmup, timeout_s, image_size, seed, box))
        return {"metadata": metadata, "workload": wl, "phases": phases}

    out = asyncio.run(main())
    result = result_header("loadgen", out["metadata"], out["workload"])
    phases = out["phases"]
    result["loadgen"] = {
        "url": url,
        "clients": clients,
        "requests_per_client": requests,
        "warmup_per_client": warmup,
        "timeout_s": timeout_s,
        "image_size": image_size,
        "seed": seed,
        "observations": "synthetic: vlaperf.inputs.make_example (random pixels and state; the world-action model: "
                        "vlaperf.policy.make_wam_example, random latents and state), made before timing",
        "phases": phases,
        "passed": all(p["errors"] == 0 and p["lost"] == 0 and not p["timed_out"] for p in phases),
    }
    return result
