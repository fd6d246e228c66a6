"""`PolicyServer`: a websocket policy server that openpi clients can talk to.

    server = PolicyServer(policy, host="127.0.0.1", port=8000)   # a vlaperf Policy, or a
    server.serve_forever()                                        # zero-argument factory of one

Threads and queues:

- One asyncio event loop (the calling thread for `serve_forever`, a background thread for
  `start`) owns every connection. It receives a frame, decodes and validates it (frames
  above `inline_decode_bytes` are decoded on a small decode thread pool instead), puts one
  job per observation on the pending queue, and awaits the job's future. It never runs the
  model. Each connection is served in order: one request at a time, replies in request order
  (as openpi's protocol has no request ids).
- One inference thread owns the policy (and the GPU). It builds the policy when given a
  factory, warms it up (every batch size x every prompt bucket), then loops: take the oldest
  pending job, wait until `max_batch` jobs are pending or `max_wait_ms` after the later of
  "that job was queued" and "the worker became free" (it stops waiting early once every open
  connection already has a job in the batch, since no one else can add one), stack up to `max_batch` of them into one `Policy.infer(list)` call, and hand
  each result back to the event loop (`call_soon_threadsafe`). The observations of an
  explicit list request are queued in one step. A batch takes the connections in turn:
  each one's first queued observation (the connection served longest ago first), then each
  one's second, and so on, so a client that queues a long list shares the GPU with the
  others instead of holding it until the whole list has run (one connection alone: arrival
  order).
- Remote backends (the one hook for them): a policy object with an integer `concurrency`
  N > 1 (vlaperf.serve.ray_backend.RayPolicy: its `infer` only waits on a Ray Serve replica)
  gets N inference threads sharing the one queue, so up to N batches are in flight at once;
  while a batch fills, connections waiting on a batch in flight count as unable to join. If
  `infer` raises `BackendUnavailable` (a replica died or timed out), every job of the batch
  gets an InternalError frame at once instead of the one-by-one retry. A local `Policy` has
  no `concurrency`: one thread, as above.
- Each observation is validated on its own before it is queued, so a bad one never reaches a
  batch. Should a batched call still fail (something the validation missed), the batch is
  re-run one observation at a time so that only the culprit gets the error; NaN or inf actions
  are refused row by row (the finite rows answered, nothing re-run).
- The queue holds at most `max_queued` observations (a request past it: an Overloaded frame),
  and a connection that closes takes its queued observations with it.
- Real-time chunking (a Policy built with an RtcConfig, `vlaperf serve --rtc`): the server keeps the last chunk
  each connection got, per position in its request (the model's own chunk, before unnormalizing), and an
  observation that carries "rtc/executed" and "rtc/delay" is guided toward what is left of it. The state lives on
  the event loop (read when a request is queued, written when its reply is sent), and a connection that closes
  takes it with it. Guided and unguided observations share a batch (zero weights for the unguided rows).

Replies: a binary msgpack frame with the result dict (a list of them for a list request), or
a text frame with a JSON error (`protocol.error_frame`); see docs/serving.md. Plain HTTP: `GET /healthz`, and
`GET /metrics` (vlaperf.serve.metrics: counters and latency histograms, behind the API key where there is one).
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import http
import ipaddress
import itertools
import logging
import math
import signal
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vlaperf import __version__
from vlaperf.inputs import InputError, make_example, warmup_prompts
from vlaperf.policy import ModelChunk, NonFiniteActions, RtcRequest
from vlaperf.serve.cadence import MISSES, CadenceForecast
from vlaperf.serve.metrics import METRICS_PATH, ServerMetrics
from vlaperf.serve.metrics import render as render_metrics
from vlaperf.serve.protocol import (DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, MAX_REQUEST_ID_CHARS,
                                    MIN_MESSAGE_BYTES, REQUEST_ID_KEY, RTC_DELAY_KEY, RTC_EXECUTED_KEY, ProtocolError,
                                    error_frame, packb, printable, unpackb, valid_request_id)

log = logging.getLogger("vlaperf.serve")
LOGGED_ERRORS_PER_CONNECTION = 5
REFUSALS_LOG_S = 10.0  # connections refused at max_connections: one log line at most this often
# Received messages a connection buffers while its current request runs (websockets' max_queue; its default is 16,
# 256 MiB a connection at a 16 MiB message limit). openpi's clients send one request and wait for the reply.
WS_MAX_QUEUE = 4
# keep_warm_ms's runs go on this long after the last batch: through a robot's pause between calls or a short reset
# between episodes, not for a client that has gone (each run holds a CPU core and the GPU's stream: 0.42 ms on
# average for libero-pi0 on an H100 host, session 51)
KEEP_WARM_FOR_S = 10.0
# a keep-warm run longer than this is not the host path it is for (libero-pi0's: 0.42-0.65 ms on the GPU hosts): a
# request with two 1671 x 1671 images made 52 ms runs that held a CPU core through the idle and the next robot's
# request behind them (the serving audit of session 57). After one, runs stop until the next request is served.
KEEP_WARM_MAX_RUN_S = 0.02
# The batcher waits (up to max_wait_ms) for connections that opened or sent a request within this many seconds and
# have none in the batch: a robot's loop, whose next observation is due. One that has been quiet longer (a paused
# robot, a dashboard) is not waited for: it made every other client pay max_wait_ms on every call
# (the serving audit of session 70: one idle connection took a 20 ms loop's queue time from 0.16 to 5.3 ms).
# Robot loops ask every 0.1-1 s (openpi's LIBERO, DROID and ALOHA clients).
ACTIVE_CONNECTION_S = 2.0
# keep_warm_quiet forecasts at most this many connections' cadences (the most recently heard from): a client that
# connects anew for each call would otherwise leave one forecast per call behind until KEEP_WARM_FOR_S has passed
CADENCE_MAX_CONNECTIONS = 64
_KEEP_WARM = object()  # _take_batch's answer when no request waits and a keep-warm run is due
HEALTH_PATH = "/healthz"

try:  # websockets >= 13: the new asyncio implementation
    from websockets.asyncio.server import serve as _serve_new
except ImportError:  # pragma: no cover - websockets 12
    _serve_new = None
from websockets.exceptions import ConnectionClosed


class RequestError(Exception):
    """What goes back to one client as an error frame."""

    def __init__(self, kind: str, message: str, request_id: Any = None, index: int | None = None):
        message = message if len(message) <= 2000 else message[:2000] + "..."  # bounded, whatever was sent
        super().__init__(message)
        self.kind, self.message, self.request_id, self.index = kind, message, request_id, index

    def frame(self) -> str:
        return error_frame(self.kind, self.message, self.request_id, self.index)


class BackendUnavailable(RuntimeError):
    """Raised by a remote backend's `infer` when the call failed for a reason that has nothing
    to do with the observations (the replica died, no reply in time): the whole batch gets an
    InternalError frame at once, without the one-by-one retry that would hit it again."""


@dataclass(eq=False)
class _Job:
    example: dict
    conn: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    t_enqueue: float
    rtc: RtcRequest | None = None  # real-time chunking: this observation's previous chunk, executed and delay
    keep_warm_wait_s: float = 0.0  # of its wait in the queue, what it spent behind a keep-warm run (--keep-warm-ms)


@dataclass
class _Done:
    actions: np.ndarray
    timing: dict
    chunk: ModelChunk | None = None  # real-time chunking: kept for the connection's next request
    guided: bool = False
    t_done: float | None = None  # perf_counter when the inference thread handed it to the event loop


@dataclass(frozen=True)
class _RtcAsk:
    """An observation's "rtc/executed" and "rtc/delay", checked."""

    executed: int
    delay: int


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def checkpoint_metadata(model) -> dict | None:
    """Where the served weights came from, for clients and their result files: the file's name and layout
    (not its path: the metadata goes to remote clients too) and, for weights from the Hugging Face Hub, the repo
    and commit (`vlaperf.hub.origin`); None for random weights."""
    ckpt = getattr(model, "checkpoint", None)
    if not isinstance(ckpt, dict):
        return None
    out = {"name": Path(str(ckpt.get("path", ""))).name, "layout": ckpt.get("layout")}
    if isinstance(ckpt.get("hub"), dict):
        out["hub"] = {"repo": ckpt["hub"].get("repo"), "revision": ckpt["hub"].get("revision")}
    return out


class PolicyServer:
    def __init__(
        self,
        policy: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        max_batch: int = 8,
        max_wait_ms: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        max_list_items: int = 64,
        max_queued: int = 256,
        max_connections: int = 256,
        idle_timeout_s: float | None = None,
        warmup_batch_sizes: tuple[int, ...] | list[int] | None = None,
        metadata: dict | None = None,
        allow_unauthenticated_remote: bool = False,
        drain_timeout_s: float = 30.0,
        inline_decode_bytes: int = 2**20,
        on_ready: Callable[["PolicyServer"], None] | None = None,
        keep_warm_ms: float | None = None,
        keep_warm_quiet: bool = True,
        _legacy_websockets: bool = False,
    ):
        """`policy`: a vlaperf `Policy` (anything with `infer(list_of_dicts)` returning
        {"actions": (B, H, D), ...}; `workload` and `transform` are used when present), or a
        zero-argument callable that returns one; a factory is called on the inference thread,
        so the policy's GPU state is created by the thread that uses it.

        `on_ready(server)` is called (on the event loop) once the server listens.

        `max_queued`: observations that may wait for the inference thread at once, from all connections; a
        request that would queue more gets an "Overloaded" error frame at once (without a bound, many clients
        sending large lists could queue work, and memory, without limit). A connection that closes takes its
        queued observations with it.

        `max_connections`: open websocket connections at once; one more is answered with HTTP 503 at its handshake.
        Each connection buffers at most WS_MAX_QUEUE received messages (a client that sends ahead is slowed by TCP,
        not refused), so what clients can make the server hold is bounded by max_connections x WS_MAX_QUEUE x
        max_message_bytes.

        `idle_timeout_s`: a connection that sends no request for this long is closed (code 1001, "idle for N s"),
        so that clients which connect and go quiet cannot hold all max_connections places (their websocket library
        answers the server's pings, so the pings never close them). None (default): never; a robot between
        episodes keeps its connection, and openpi's client does not reconnect.

        `warmup_batch_sizes`: the batch sizes warmed up (compiled, captured) before the server listens;
        None is 1 and max_batch, as `vlaperf serve` does; () warms up nothing.

        `keep_warm_ms`: while no request waits, the inference thread reruns the last request's host stages (the
        policy's `keep_warm`: transform, upload, device preprocess; no model call) every keep_warm_ms, for up to
        KEEP_WARM_FOR_S after the last request. A robot's closed loop leaves the server idle between calls (0.5 s at
        10 Hz with a chunk replanned every 5 steps), and after an idle the next call's host stages come back slower;
        only running them again kept them warm (docs/serving.md, "Keeping the host path warm"). A request that
        arrives during a run waits for it (counted in stats["keep_warm_delayed"]). None (default): off.

        `keep_warm_quiet`: when the requests come at a steady cadence (one robot's loop), hold the keep-warm runs in
        the span where one would still be running as the next request arrives (vlaperf.serve.cadence; each span
        that held a run back is counted in stats["keep_warm_quiet"]). Each connection's cadence is forecast on its
        own (several robots, one connection each), and so is all the server's requests' together (a client that
        reconnects for each call). False: run on the period regardless.

        Security defaults: binds to loopback; binding any other address without an
        `api_key` raises ValueError unless `allow_unauthenticated_remote=True`.
        """
        if hasattr(policy, "infer"):
            self._policy, self._factory = policy, None
        elif callable(policy):
            self._policy, self._factory = None, policy
        else:
            raise TypeError("policy must be a Policy (with .infer) or a zero-argument factory returning one")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0: any free port), got {port!r}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) or not 0 <= max_wait_ms < math.inf:
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
        if warmup_batch_sizes is None:
            warmup_batch_sizes = (1, max_batch)
        bad = [b for b in warmup_batch_sizes if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= max_batch]
        if bad:
            raise ValueError(f"warmup_batch_sizes must hold integers in [1, max_batch={max_batch}], got {bad[0]!r}")
        if not isinstance(max_message_bytes, int) or not MIN_MESSAGE_BYTES <= max_message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be an integer in [{MIN_MESSAGE_BYTES}, {MAX_MESSAGE_BYTES}] "
                             f"(4 GiB), got {max_message_bytes!r}")
        if isinstance(max_list_items, bool) or not isinstance(max_list_items, int) or max_list_items < 1:
            raise ValueError(f"max_list_items must be an integer >= 1, got {max_list_items!r}")
        if isinstance(drain_timeout_s, bool) or not isinstance(drain_timeout_s, (int, float)) \
                or not 0 <= drain_timeout_s < math.inf:
            raise ValueError(f"drain_timeout_s must be a finite number of seconds >= 0, got {drain_timeout_s!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an integer >= 1, got {max_connections!r}")
        if idle_timeout_s is not None and (isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float))
                                           or not math.isfinite(idle_timeout_s) or idle_timeout_s <= 0):
            raise ValueError(f"idle_timeout_s must be a number > 0 or None, got {idle_timeout_s!r}")
        if isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < max_list_items:
            raise ValueError(f"max_queued must be an integer >= max_list_items ({max_list_items}), so that one list "
                             f"request fits, got {max_queued!r}")
        if keep_warm_ms is not None and (isinstance(keep_warm_ms, bool) or not isinstance(keep_warm_ms, (int, float))
                                         or not 0 < keep_warm_ms < math.inf):
            raise ValueError(f"keep_warm_ms must be None (off) or a finite number of milliseconds > 0, got "
                             f"{keep_warm_ms!r}")
        if not isinstance(keep_warm_quiet, bool):
            raise ValueError(f"keep_warm_quiet must be True or False, got {keep_warm_quiet!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key or api_key != api_key.strip()):
            raise ValueError("api_key must be a non-empty string without surrounding whitespace")
        if not is_loopback(host) and api_key is None and not allow_unauthenticated_remote:
            raise ValueError(
                f"refusing to serve on non-loopback address {host!r} without an API key; set api_key, "
                "or pass allow_unauthenticated_remote=True (--allow-unauthenticated) if this network is trusted"
            )
        self.host, self.port, self.api_key = host, port, api_key
        self.max_batch, self.max_wait_ms = max_batch, float(max_wait_ms)
        self.max_message_bytes, self.max_list_items, self.max_queued = max_message_bytes, max_list_items, max_queued
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.warmup_batch_sizes = tuple(sorted(set(warmup_batch_sizes)))
        self.drain_timeout_s, self.inline_decode_bytes = drain_timeout_s, inline_decode_bytes
        self._extra_metadata = dict(metadata or {})
        self._on_ready = on_ready
        self.keep_warm_ms = None if keep_warm_ms is None else float(keep_warm_ms)
        self.keep_warm_quiet = keep_warm_quiet
        # keep-warm state, inference thread only: what to rerun (the last batch's examples), when a batch last
        # ended and when the last run did; the requests' cadence (each connection's, and under None all requests'
        # together), the last runs' lengths and the last quiet span
        self._warm_examples: list | None = None
        self._last_served = self._last_warmed = 0.0
        # whether the policy has given finite actions yet (the warm-up's or a request's): what tells an observation
        # whose actions come out NaN or inf (its own values: InputError) from a model that may be at fault
        self._finite_seen = False
        self._cadence: dict[int | None, CadenceForecast] = {None: CadenceForecast()}
        self._warm_runs_s: deque[float] = deque(maxlen=16)
        self._quiet_until = -math.inf
        self._legacy = _legacy_websockets or _serve_new is None
        self.metadata: dict = {}
        self.policy: Any = self._policy
        # inference thread <-> event loop
        self._cv = threading.Condition()
        self._pending: deque[_Job] = deque()
        self._owns_process = False  # serve_forever: the server is the process (its heap frozen after the warm-up)
        self._heap_frozen = False  # and unfrozen when serve_forever returns
        # which batch last took a job of each open connection (the batches counted from 1): _take_in_turn's turns
        self._last_taken: dict[int, int] = {}
        self._last_heard: dict[int, float] = {}  # connection -> when it opened or last queued a request (perf_counter)
        self._batches_taken = 0
        self._stopping_worker = False
        self._worker: threading.Thread | None = None
        self._extra_workers: list[threading.Thread] = []  # remote backends only (see _start_extra_workers)
        self._busy: Counter = Counter()  # connection -> its jobs in batches being run
        self._idle_workers = 0  # inference threads inside _next_batch (waiting for work)
        # event loop state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._ws = None
        self._conn_ids = itertools.count(1)
        self._n_connections = 0
        self._inflight = 0
        self._draining = False
        self._force = False
        self._stop_pending = False
        self._decode_pool: ThreadPoolExecutor | None = None
        # background-thread mode
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        # real-time chunking: connection -> {position in its request: the last chunk it got}; event loop only
        self._chunks: dict[int, dict[int, ModelChunk]] = {}
        self._rtc_on, self._rtc_horizon = False, 0  # set once the policy is built
        self.stats = {"requests": 0, "errors": 0, "batches": 0, "batched_observations": 0, "dropped_observations": 0,
                      "rtc_guided": 0, "rtc_unguided": 0, "keep_warm_runs": 0, "keep_warm_delayed": 0, "keep_warm_quiet": 0,
                      "keep_warm_paused": 0, "refused_connections": 0, "idle_closed": 0,
                      **{f"keep_warm_delayed_{why}": 0 for why in MISSES}}
        self._refusals_logged_at, self._refusals_logged = -math.inf, 0  # the refusals' log line: at most one a while
        self.metrics = ServerMetrics()  # the latency histograms of GET /metrics
        self._conn_errors: Counter = Counter()  # connection -> request errors so far (the log keeps the first few)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve in this thread until SIGINT / SIGTERM (or `stop()` from another thread).

        The first signal stops accepting connections and new requests, lets in-flight
        requests finish (at most `drain_timeout_s`), closes the connections (code 1001) and
        returns; a second signal skips the wait for in-flight requests.
        """
        self._owns_process = True
        try:
            asyncio.run(self._main(install_signals=threading.current_thread() is threading.main_thread()))
        finally:
            # Back into the collector's sight for the interpreter's exit, which collects only what it can see: left
            # frozen, objects of extensions that count their own instances at exit (Triton's nanobind bindings) were
            # never freed, and stopping `vlaperf serve` printed dozens of "leaked function" lines (session 59).
            if self._heap_frozen:
                gc.unfreeze()

    def start(self, timeout: float | None = 600.0) -> "PolicyServer":
        """Serve from a background thread; returns once listening (`self.port` is then the
        bound port, also when 0 was asked for). Raises what startup raised."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._thread = threading.Thread(target=self._thread_main, name="vlaperf-serve", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"server did not start within {timeout} s")
        if self._startup_error is not None:
            self._thread.join(5)
            raise self._startup_error
        return self

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main(False))
        except BaseException:
            if self._startup_error is None:  # a startup error is raised by start() instead
                log.exception("policy server thread failed")

    def stop(self, timeout: float | None = 60.0) -> None:
        """Graceful stop from any thread (as one SIGTERM); waits for the server to finish."""
        self._stop_pending = True  # also seen by a server still starting up
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._request_stop)
            except RuntimeError:
                pass  # the loop closed meanwhile
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _request_stop(self) -> None:
        if self._stop_requested is None:
            return
        if self._stop_requested.is_set():
            self._force = True
            log.warning("second stop request: not waiting for in-flight requests")
        self._stop_requested.set()

    async def _main(self, install_signals: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._decode_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vlaperf-decode")
        try:
            try:
                ready: ThreadFuture = ThreadFuture()
                self._worker = threading.Thread(target=self._worker_main, args=(ready,), name="vlaperf-infer", daemon=True)
                self._worker.start()
                await asyncio.wrap_future(ready)
                self._start_extra_workers()
                self.metadata = self._build_metadata()
                self._metadata_frame = packb(self.metadata)
                self._ws = await self._listen()
                self.port = self._ws.sockets[0].getsockname()[1]
            except BaseException as e:
                self._startup_error = e
                self._stop_worker(join=False)  # it may be busy warming up; it is a daemon thread
                raise
            finally:
                self._started.set()
            if install_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self._loop.add_signal_handler(sig, self._request_stop)
            log.info("vlaperf policy server listening on %s (workload %s)", self.url, self.metadata.get("workload"))
            if self._on_ready is not None:
                self._on_ready(self)
            if self._stop_pending:
                self._stop_requested.set()
            await self._stop_requested.wait()
            await self._shutdown()
        except BaseException:
            if self._startup_error is None:
                log.exception("policy server failed")
            raise
        finally:
            if install_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self._loop.remove_signal_handler(sig)
            self._decode_pool.shutdown(wait=False, cancel_futures=True)

    async def _listen(self):
        kwargs = dict(max_size=self.max_message_bytes, max_queue=WS_MAX_QUEUE, compression=None, ping_interval=20,
                      ping_timeout=20, close_timeout=5)
        if not self._legacy:
            return await _serve_new(self._handler, self.host, self.port, process_request=self._process_request, **kwargs)
        try:  # websockets 12 (legacy implementation; also importable from later versions)
            from websockets.legacy.server import serve as serve_legacy
        except ImportError:  # pragma: no cover
            from websockets.server import serve as serve_legacy
        return await serve_legacy(self._handler, self.host, self.port, process_request=self._process_request_legacy, **kwargs)

    async def _shutdown(self) -> None:
        self._draining = True
        log.info("shutting down: no new connections or requests; finishing %d in-flight", self._inflight)
        self._ws.server.close()  # stop accepting connections
        deadline = time.monotonic() + self.drain_timeout_s
        while self._inflight and not self._force and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._inflight:
            log.warning("closing with %d requests still in flight", self._inflight)
            with self._cv:  # what has not started yet is answered now instead of run
                dropped = list(self._pending)
                self._pending.clear()
            for job in dropped:
                self._deliver(job, RequestError("ShuttingDown", "the server stopped before this request ran"))
            # Let their handlers send those frames before the connections close (a connection has one request in
            # flight at a time, so each connection with a dropped job has one reply to send). Bounded: a request
            # whose other observations are still running waits for them, not for this.
            target = self._inflight - len({job.conn for job in dropped})
            deadline = time.monotonic() + 1.0
            while self._inflight > target and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        self._ws.close()  # closes the open connections with 1001 (going away)
        deadline = time.monotonic() + 10.0  # their close handshakes (close_timeout 5 s a connection)
        while self._n_connections and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self._n_connections:
            log.warning("%d connections did not close in time", self._n_connections)
        try:  # what else the websockets server waits for: opening handshakes a client left unfinished (a TCP probe,
            # a scanner), which it gives its open timeout (10 s): none is a client of ours yet, so not waited for
            await asyncio.wait_for(self._ws.wait_closed(), timeout=0.5)
        except asyncio.TimeoutError:
            log.info("dropped connections whose opening handshake had not finished")
        await asyncio.get_running_loop().run_in_executor(None, self._stop_worker)
        log.info("server stopped: %s", self.served_summary())

    def served_summary(self) -> str:
        """What this server did, in words (its last log line): requests and their errors, then the observations and
        the policy calls they took (warm-up calls not counted)."""
        st = self.stats

        def count(n: int, noun: str) -> str:
            return f"{n} {noun}{'' if n == 1 else 's'}"

        words = (f"{count(st['requests'], 'request')} ({count(st['errors'], 'error')}), "
                 f"{count(st['batched_observations'], 'observation')} answered in {count(st['batches'], 'policy call')}")
        if st["batches"]:
            words += f" (mean batch {st['batched_observations'] / st['batches']:.2f})"
        if st["keep_warm_runs"]:
            words += f", {count(st['keep_warm_runs'], 'keep-warm run')}"
        return words

    # ------------------------------------------------------------------ HTTP hooks

    def _check_request(self, path: str, authorization: list[str]) -> tuple[int, str] | None:
        """(status, body) to answer with plain HTTP, or None to open the websocket."""
        path = path.split("?", 1)[0]
        if path == HEALTH_PATH:
            return (503, "shutting down\n") if self._draining else (200, "ok\n")
        if self.api_key is not None:
            expected = f"Api-Key {self.api_key}".encode()
            if len(authorization) != 1 or not hmac.compare_digest(authorization[0].encode("utf-8", "replace"), expected):
                return 401, "missing or invalid API key (send the header 'Authorization: Api-Key <key>')\n"
        if path == METRICS_PATH:  # behind the key where there is one: the load of a fleet is not for anyone to read
            return 200, self._metrics_text()
        if self._draining:
            return 503, "shutting down\n"
        if self._n_connections >= self.max_connections:
            self._refused_connection()
            return 503, f"too many connections: {self._n_connections} open, the server's limit is {self.max_connections}\n"
        return None

    def _refused_connection(self) -> None:
        """Count a connection refused at the limit, and say so in the log at most once every REFUSALS_LOG_S (with the
        count since the last line): an operator sees robots turned away, not a flood of lines."""
        self.stats["refused_connections"] += 1
        now = time.monotonic()
        if now - self._refusals_logged_at >= REFUSALS_LOG_S:
            log.warning("refused %d connection(s) at the limit of %d open (--max-connections) since the last such "
                        "line", self.stats["refused_connections"] - self._refusals_logged, self.max_connections)
            self._refusals_logged_at, self._refusals_logged = now, self.stats["refused_connections"]

    def _metrics_text(self) -> str:
        with self._cv:
            queued = len(self._pending)
        gauges = {"connections": self._n_connections, "inflight_requests": self._inflight, "queued_observations": queued}
        return render_metrics(self.stats, gauges, self.metrics)

    def _process_request(self, connection, request):
        answer = self._check_request(request.path, request.headers.get_all("Authorization"))
        if answer is None:
            return None
        response = connection.respond(http.HTTPStatus(answer[0]), answer[1])
        if answer[0] == 401:
            response.headers["WWW-Authenticate"] = "Api-Key"
        return response

    async def _process_request_legacy(self, path, headers):  # the legacy API wants a coroutine
        answer = self._check_request(path, headers.get_all("Authorization"))
        if answer is None:
            return None
        extra = [("WWW-Authenticate", "Api-Key")] if answer[0] == 401 else []
        return http.HTTPStatus(answer[0]), [("Content-Type", "text/plain; charset=utf-8"), *extra], answer[1].encode()

    # ------------------------------------------------------------------ connections

    async def _handler(self, ws) -> None:
        conn = next(self._conn_ids)
        self._n_connections += 1
        with self._cv:  # a client that just connected is about to ask: the batcher waits for it as for a robot's loop
            self._last_heard[conn] = time.perf_counter()
        try:
            await ws.send(self._metadata_frame)
            prev_total_ms = None
            while True:
                try:
                    if self.idle_timeout_s is None:  # (the default: the hot path as it was)
                        message = await ws.recv()
                    else:  # recv is cancellation-safe: a timeout loses no message
                        message = await asyncio.wait_for(ws.recv(), self.idle_timeout_s)
                except ConnectionClosed:
                    break
                except asyncio.TimeoutError:  # quiet for idle_timeout_s: its place goes to another client
                    self.stats["idle_closed"] += 1
                    log.info("connection %d closed: no request for %g s (--idle-timeout-s)", conn, self.idle_timeout_s)
                    await ws.close(1001, f"idle for {self.idle_timeout_s:g} s (the server's --idle-timeout-s)")
                    break
                t_recv = time.perf_counter()
                self._inflight += 1
                try:
                    reply = await self._reply(message, conn, prev_total_ms, ws)
                    try:
                        await ws.send(reply)
                    except ConnectionClosed:
                        break
                finally:
                    self._inflight -= 1
                prev_total_ms = (time.perf_counter() - t_recv) * 1e3
                self.metrics.request_seconds.observe(prev_total_ms / 1e3)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("connection %d failed", conn)
        finally:
            self._n_connections -= 1
            self._chunks.pop(conn, None)
            self._drop_queued(conn)
            errors = self._conn_errors.pop(conn, 0)
            if errors > LOGGED_ERRORS_PER_CONNECTION:
                log.info("connection %d closed after %d request errors (the first %d logged)", conn, errors,
                         LOGGED_ERRORS_PER_CONNECTION)

    def _drop_queued(self, conn: int) -> None:
        """The queued observations of connection `conn`, which closed: nobody would read their actions. Those in a
        batch already running finish; the batcher stops waiting for this connection."""
        with self._cv:
            self._last_taken.pop(conn, None)
            self._last_heard.pop(conn, None)
            kept = [job for job in self._pending if job.conn != conn]
            dropped = len(self._pending) - len(kept)
            if dropped:
                self._pending = deque(kept)
                self.stats["dropped_observations"] += dropped
            self._cv.notify()
        if dropped:
            log.info("connection %d closed with %d observations queued: dropped", conn, dropped)

    async def _results(self, futures: list[asyncio.Future], conn: int, ws) -> list | None:
        """The jobs' results, or None once the connection closes first (its queued jobs dropped)."""
        # return_exceptions: the jobs' futures only ever get values, but the ones cancelled below must not leave a
        # gathered CancelledError that nobody retrieves
        results = asyncio.gather(*futures, return_exceptions=True)
        closed = getattr(ws, "wait_closed", None)
        if closed is None:
            return await results
        closing = asyncio.ensure_future(closed())
        try:
            await asyncio.wait({results, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
        if results.done():
            return results.result()
        self._drop_queued(conn)
        for future in futures:  # those of jobs already in a running batch: their results go nowhere
            future.cancel()
        return None

    async def _reply(self, message: Any, conn: int, prev_total_ms: float | None, ws=None) -> bytes | str:
        """The frame to send back for one received frame. Never raises."""
        self.stats["requests"] += 1
        try:
            if self._draining:
                raise RequestError("ShuttingDown", "the server is shutting down and accepts no new requests")
            t0 = time.perf_counter()
            if isinstance(message, str):
                raise RequestError("ProtocolError", "expected a binary msgpack frame, got a text frame")
            if len(message) > self.inline_decode_bytes:
                items, is_list = await self._loop.run_in_executor(self._decode_pool, self._decode, message)
            else:
                items, is_list = self._decode(message)
            t1 = time.perf_counter()
            rtc = None
            if self._rtc_on:  # every request: the chunks it gets are the next request's previous ones
                kept = self._chunks.get(conn, {})
                rtc = [None if ask is None or i not in kept else RtcRequest(kept[i], ask.executed, ask.delay)
                       for i, (_, _, ask) in enumerate(items)]
            try:
                futures = self._submit([ex for ex, _, _ in items], conn, rtc)
            except RequestError as e:
                e.request_id = None if is_list else items[0][1]
                raise
            results = await self._results(futures, conn, ws)
            t_back = time.perf_counter()  # the event loop has the results
            if results is None:  # the client is gone: nothing to send
                return error_frame("ConnectionClosed", "the connection closed before the reply")
            replies = []
            for i, ((_, request_id, ask), result) in enumerate(zip(items, results)):
                if isinstance(result, RequestError):
                    raise RequestError(result.kind, (f"[{i}] " if is_list else "") + result.message, request_id,
                                       i if is_list else None)
                reply = self._response(result, request_id, (t1 - t0) * 1e3, prev_total_ms, t0, t_back)
                if ask is not None:
                    reply["rtc"] = self._rtc_reply(ask, result, had_previous=rtc[i] is not None)
                    self.stats["rtc_guided" if result.guided else "rtc_unguided"] += 1
                replies.append(reply)
            if self._rtc_on:  # the whole request answered: its chunks are what the robot executes next
                kept = self._chunks.setdefault(conn, {})
                for i, result in enumerate(results):
                    if result.chunk is not None:
                        kept[i] = result.chunk
            return packb(replies if is_list else replies[0])
        except RequestError as e:
            self.stats["errors"] += 1
            self._conn_errors[conn] += 1
            if self._conn_errors[conn] <= LOGGED_ERRORS_PER_CONNECTION:  # a flood of bad frames is not a flood of logs
                log.info("request error on connection %d: %s: %s", conn, e.kind, printable(e.message))
            return e.frame()
        except Exception as e:  # never let one request take the connection or the server down
            self.stats["errors"] += 1
            log.exception("internal error on connection %d", conn)
            return error_frame("InternalError", f"{type(e).__name__}: {e}")

    def _rtc_reply(self, ask: _RtcAsk, done: _Done, had_previous: bool) -> dict:
        """What the reply says of a request's real-time chunking: whether it was guided, and if not, why."""
        out: dict[str, Any] = {"guided": bool(done.guided), "executed": ask.executed, "delay": ask.delay}
        if not done.guided:
            out["reason"] = ("no previous chunk on this connection at this position (nothing answered there yet)"
                             if not had_previous else
                             f"nothing of the previous chunk is left (executed = the horizon, {self._rtc_horizon})")
        return out

    def _response(self, done: _Done, request_id: Any, decode_ms: float, prev_total_ms: float | None,
                  t_received: float | None = None, t_back: float | None = None) -> dict:
        server_timing = {k: (int(v) if k == "batch_size" else float(v)) for k, v in done.timing.items()}
        server_timing["decode_ms"] = decode_ms
        # where a call's time outside the policy goes on the server (files from session 51 on): the event loop's
        # wake-up for the result (the inference thread's hand-off), and this request's time here so far (from its
        # frame received to this reply built; the packing and the send are not in it)
        if done.t_done is not None and t_back is not None:
            server_timing["handoff_ms"] = (t_back - done.t_done) * 1e3
        if t_received is not None:
            server_timing["server_ms"] = (time.perf_counter() - t_received) * 1e3
            # the frame received on this server's clock (time.perf_counter, seconds): a client on this host (one
            # clock) places its uplink with it (vlaperf.serve.broker.call_split; from session 52 on)
            server_timing["received_at_s"] = t_received
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        out = {"actions": done.actions, "server_timing": server_timing,
               "policy_timing": {k: server_timing[k] for k in ("infer_ms", "transform_ms", "sample_and_copy_ms")
                                 if k in server_timing}}
        if request_id is not None:
            out[REQUEST_ID_KEY] = request_id
        return out

    # ------------------------------------------------------------------ decode + validate

    def _decode(self, message: bytes) -> tuple[list[tuple[dict, Any, _RtcAsk | None]], bool]:
        """[(example without request_id and rtc keys, request_id, rtc ask or None)], is_list. Raises RequestError."""
        try:
            payload = unpackb(message, max_bytes=self.max_message_bytes)
        except ProtocolError as e:
            raise RequestError("ProtocolError", str(e), e.request_id, e.index) from None
        if isinstance(payload, dict):
            return [self._validate(payload, None)], False
        if isinstance(payload, list):
            if not payload:
                raise RequestError("InputError", "an explicit batch must hold at least one observation dict")
            if len(payload) > self.max_list_items:
                raise RequestError("InputError", f"an explicit batch holds at most {self.max_list_items} observations, "
                                                 f"got {len(payload)}")
            return [self._validate(ex, i) for i, ex in enumerate(payload)], True
        raise RequestError("InputError", f"message must be an observation dict (a msgpack map) or a list of them, "
                                         f"got {_type_name(payload)}")

    def _validate(self, example: Any, index: int | None) -> tuple[dict, Any, _RtcAsk | None]:
        where = f"[{index}] " if index is not None else ""
        if not isinstance(example, dict):
            raise RequestError("InputError", f"{where}observation must be a dict (a msgpack map), got {_type_name(example)}",
                               index=index)
        request_id = example.get(REQUEST_ID_KEY)
        if request_id is not None:
            if not valid_request_id(request_id):
                raise RequestError("InputError", f"{where}{REQUEST_ID_KEY}: expected a string of at most "
                                   f"{MAX_REQUEST_ID_CHARS} characters or an integer", index=index)
            example = {k: v for k, v in example.items() if k != REQUEST_ID_KEY}
        ask = None
        if RTC_EXECUTED_KEY in example or RTC_DELAY_KEY in example:
            ask = self._rtc_ask(example, where, request_id, index)
            example = {k: v for k, v in example.items() if k not in (RTC_EXECUTED_KEY, RTC_DELAY_KEY)}
        # The transform's own checks (same messages as Policy.infer would raise), run per
        # observation before any batching. A policy without a transform is checked only by
        # the per-observation retry in the worker.
        transform = getattr(self.policy, "transform", None)
        try:
            if transform is not None:
                transform.validate(example)
        except InputError as e:
            raise RequestError("InputError", f"{where}{e}", request_id, index) from None
        except Exception as e:
            raise RequestError("InputError", f"{where}malformed observation ({type(e).__name__}: {e})",
                               request_id, index) from None
        return example, request_id, ask

    def _rtc_ask(self, example: dict, where: str, request_id: Any, index: int | None) -> _RtcAsk:
        def refuse(message: str):
            return RequestError("InputError", f"{where}{message}", request_id, index)

        if not self._rtc_on:
            key = RTC_EXECUTED_KEY if RTC_EXECUTED_KEY in example else RTC_DELAY_KEY
            raise refuse(f"{key}: this server does not run real-time chunking (start it with `vlaperf serve --rtc`, "
                         "or a Policy built with rtc=RtcConfig())")
        values = []
        for key in (RTC_EXECUTED_KEY, RTC_DELAY_KEY):
            if key not in example:
                raise refuse(f"{key}: missing; real-time chunking takes both {RTC_EXECUTED_KEY} and {RTC_DELAY_KEY}")
            value = example[key]
            if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
                value = value.item()  # a numpy scalar integer
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value <= self._rtc_horizon:
                # a string quoted: "got 3" for the text "3" read as a valid integer refused
                shown = repr(value) if isinstance(value, str) else value
                raise refuse(f"{key}: expected an integer in [0, {self._rtc_horizon}] (the chunk's horizon), got "
                             f"{printable(shown)}")
            values.append(int(value))
        return _RtcAsk(*values)

    # ------------------------------------------------------------------ inference thread

    def _submit(self, examples: list[dict], conn: int, rtc: list[RtcRequest | None] | None = None) -> list[asyncio.Future]:
        loop, now = self._loop, time.perf_counter()
        rtc = rtc or [None] * len(examples)
        jobs = [_Job(ex, conn, loop.create_future(), loop, now, r) for ex, r in zip(examples, rtc)]
        with self._cv:
            if len(self._pending) + len(jobs) > self.max_queued:
                raise RequestError("Overloaded", f"{len(self._pending)} observations are queued and this request adds "
                                   f"{len(jobs)}, over the server's limit of {self.max_queued}: retry later")
            self._pending.extend(jobs)  # one step: a list request stays together
            self._last_heard[conn] = now
            self._cv.notify()
        return [j.future for j in jobs]

    def _worker_main(self, ready: ThreadFuture) -> None:
        import torch

        torch.set_grad_enabled(False)  # thread-local
        try:
            if self._policy is None:
                self._policy = self._factory()
                if not hasattr(self._policy, "infer"):
                    raise TypeError(f"the policy factory returned {type(self._policy).__name__}, which has no infer()")
            self.policy = self._policy
            if self.keep_warm_ms is not None and not callable(getattr(self._policy, "keep_warm", None)):
                raise TypeError(f"keep_warm_ms: {type(self._policy).__name__} has no keep_warm(examples) to rerun its "
                                "host stages with (vlaperf's Policy and WamPolicy have; a Ray Serve replicas' front "
                                "end does not)")
            self._rtc_on = getattr(self._policy, "rtc", None) is not None
            if self._rtc_on:
                self._rtc_horizon = int(self._policy.model.config.action_horizon)
            self._warmup()
            if self._owns_process:
                # Everything alive now (torch, the model, the warm-up's caches) stays for the server's life: move it
                # out of the garbage collector's sight, so that a collection set off by a request that makes many
                # objects (a frame of a million nested lists) does not walk the whole heap. On the CPU machine such
                # a frame took 0.61-0.91 s to refuse without this, 0.17-0.25 s with it (session 57). Only for
                # serve_forever: a server start()ed inside someone's process leaves that process's collector alone.
                gc.collect()
                gc.freeze()
                self._heap_frozen = True
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(None)
        self._worker_loop()

    def _worker_loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if batch is _KEEP_WARM:
                self._keep_warm()
                continue
            if not batch:  # another inference thread took the jobs (remote backends run several)
                continue
            try:
                self._run_batch(batch)
            except BaseException as e:  # the inference thread must survive anything
                log.exception("inference thread error")
                for job in batch:
                    self._deliver(job, RequestError("InternalError", f"{type(e).__name__}: {e}"))
            finally:
                t_replied = time.perf_counter()
                with self._cv:
                    if self.keep_warm_ms is not None and self.keep_warm_quiet:  # a call that ran long: the next is late
                        for job in batch:
                            for key in (None, job.conn):
                                if key in self._cadence:
                                    self._cadence[key].replied(job.t_enqueue, t_replied)
                    self._busy.subtract(job.conn for job in batch)
                    for conn in [c for c, n in self._busy.items() if n <= 0]:
                        del self._busy[conn]

    def _start_extra_workers(self) -> None:
        """The hook for remote backends: a policy with `concurrency` N > 1 (its infer() waits on
        another process, e.g. a Ray Serve replica) gets N - 1 more inference threads on the same
        queue, so N batches are in flight at once. A local Policy keeps the single thread."""
        n = getattr(self._policy, "concurrency", 1)
        n = n if isinstance(n, int) and n > 1 else 1
        for i in range(1, n):
            t = threading.Thread(target=self._worker_loop, name=f"vlaperf-infer-{i}", daemon=True)
            t.start()
            self._extra_workers.append(t)

    def _warmup(self) -> None:
        workload = getattr(self._policy, "workload", None)

        def infer(*args, **kwargs):  # infer raises NonFiniteActions rather than return NaN or inf: this came out finite
            out = self._policy.infer(*args, **kwargs)
            self._finite_seen = True
            return out

        t0 = time.perf_counter()
        if hasattr(self._policy, "warmup_examples"):  # a policy that knows its own warm-up (the world-action model)
            for b in self.warmup_batch_sizes:
                infer(self._policy.warmup_examples(b))
        elif workload is not None:
            # Every batch size x every prompt bucket: with CUDA graphs each pair is its own
            # capture, and a capture inside a client's request costs it about a second. With
            # real-time chunking, the guided call of each pair too (its own graph).
            for prompt in warmup_prompts(workload.prompt_slots):
                for b in self.warmup_batch_sizes:
                    examples = [make_example(workload, seed=i) for i in range(b)]
                    for ex in examples:
                        ex["prompt"] = prompt
                    if not self._rtc_on:
                        infer(examples)
                        continue
                    chunks = infer(examples, rtc=[None] * b)["chunks"]
                    infer(examples, rtc=[RtcRequest(c, 1, 1) for c in chunks])
        self.warmup_s = time.perf_counter() - t0

    def _others_may_join(self) -> bool:
        """Whether an active connection (opened or asked within ACTIVE_CONNECTION_S) has none in the batch yet."""
        conns = {job.conn for job in itertools.islice(self._pending, self.max_batch)}
        conns.update(self._busy)  # waiting on a batch in flight: cannot send (several threads only)
        since = time.perf_counter() - ACTIVE_CONNECTION_S
        return any(t >= since and c not in conns for c, t in self._last_heard.items())

    def _next_batch(self) -> list[_Job] | None:
        with self._cv:
            self._idle_workers += 1
            try:
                return self._take_batch()
            finally:
                self._idle_workers -= 1

    def _take_batch(self) -> list[_Job] | None:
        """_next_batch under the lock. With several inference threads (one per remote
        replica), the pending jobs are shared among the idle threads instead of all going
        to the first one: 8 clients on 2 replicas run as two batches of 4 on two GPUs (on
        an H200, batch 4 takes ~60 ms and batch 8 ~92 ms), not one batch of 8 on one GPU."""
        while not self._pending:
            if self._stopping_worker:
                return None
            wait = self._keep_warm_wait()
            if wait == 0.0:
                return _KEEP_WARM
            self._cv.wait(wait)
        # Wait up to max_wait after the later of "oldest request arrived" and "the GPU
        # became free": requests that queued during the previous batch would otherwise
        # leave at once, and a closed loop of N clients settles into alternating
        # half-size batches (seen with 8 clients on an H200: mean batch 4.25).
        free_at = time.perf_counter()
        deadline = max(self._pending[0].t_enqueue, free_at) + self.max_wait_ms / 1e3
        while len(self._pending) < self.max_batch and not self._stopping_worker and self._others_may_join():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            self._cv.wait(remaining)
        share = -(-len(self._pending) // max(1, self._idle_workers))
        batch = self._take_in_turn(min(self.max_batch, share))
        if self.keep_warm_ms is not None and self.keep_warm_quiet:
            for job in batch:
                self._cadence[None].observe(job.t_enqueue)
                if job.conn not in self._cadence and len(self._cadence) > CADENCE_MAX_CONNECTIONS:
                    del self._cadence[min((c for c in self._cadence if c is not None),
                                          key=lambda c: self._cadence[c].last_arrival)]
                self._cadence.setdefault(job.conn, CadenceForecast()).observe(job.t_enqueue)
        self._busy.update(job.conn for job in batch)
        if self._pending:
            self._cv.notify()  # another idle thread takes the rest now
        return batch

    def _take_in_turn(self, n: int) -> list[_Job]:
        """n queued jobs, the connections in turn (under the lock). The k-th queued job of a connection has rank k;
        the batch is the n of lowest rank; within a rank, the connection whose jobs last left longest ago (never
        first) goes first, then the earlier arrival; each connection's jobs leave in the order they came. So another
        robot's single observation queued behind one connection's list of 64 runs in the next batch, not after all
        64 (the serving audit of session 57: that robot's p50 went from 16 to 90 ms beside one such client, to 1.5 s
        beside five)."""
        self._batches_taken += 1
        if n >= len(self._pending):
            batch = list(self._pending)
            self._pending.clear()
        else:
            seen: Counter = Counter()
            order = []
            for position, job in enumerate(self._pending):
                order.append((seen[job.conn], self._last_taken.get(job.conn, 0), position))
                seen[job.conn] += 1
            chosen = {position for *_, position in sorted(order)[:n]}
            batch, kept = [], deque()
            for position, job in enumerate(self._pending):
                (batch if position in chosen else kept).append(job)
            self._pending = kept
        for job in batch:
            self._last_taken[job.conn] = self._batches_taken
        return batch

    def _keep_warm_wait(self) -> float | None:
        """Seconds until the next keep-warm run is due (0.0: now); None when there is none to wait for: keep_warm_ms
        off, nothing served yet, or KEEP_WARM_FOR_S gone since the last batch (a robot between episodes, or gone)."""
        if self.keep_warm_ms is None or self._warm_examples is None:
            return None
        now = time.perf_counter()
        if now - self._last_served > KEEP_WARM_FOR_S:
            return None
        due = self._last_warmed + self.keep_warm_ms / 1e3
        if self.keep_warm_quiet and self._warm_runs_s:
            due = self._after_quiet_windows(due, now)
        return max(0.0, due - now)

    def _after_quiet_windows(self, due: float, now: float) -> float:
        """`due`, or where it falls in a quiet window (a run then would meet a steady connection's next request),
        that window's end, and so on through any window overlapping it. A connection silent for KEEP_WARM_FOR_S (gone,
        or a robot between episodes) is forgotten; its next request starts a new forecast."""
        for conn in [c for c, f in self._cadence.items() if c is not None and now - f.last_arrival > KEEP_WARM_FOR_S]:
            del self._cadence[conn]
        run_s = max(self._warm_runs_s)
        windows = sorted(w for f in self._cadence.values() for w in f.quiet_windows(run_s))
        for start, end in windows:  # by start: moving `due` to one's end can only put it in a later one
            if start < due < end:  # the run would meet the next request: after it
                if end > self._quiet_until:
                    self.stats["keep_warm_quiet"] += 1
                    self._quiet_until = end
                due = end
        return due

    def _keep_warm(self) -> None:
        """One keep-warm run, outside the lock; a request that arrived during it is counted as delayed."""
        t0 = time.perf_counter()
        try:
            self._policy.keep_warm(self._warm_examples)
        except Exception:  # never the server's end: the next request is served as it would have been without it
            log.exception("keep-warm run failed; keep-warm is off from now on")
            self.keep_warm_ms = None
        t1 = self._last_warmed = time.perf_counter()
        held_for_s = max(self._warm_runs_s, default=0.0)  # the run length the quiet windows were made for
        self._warm_runs_s.append(t1 - t0)
        self.stats["keep_warm_runs"] += 1
        self.metrics.keep_warm_seconds.observe(t1 - t0)
        if t1 - t0 > KEEP_WARM_MAX_RUN_S:  # not the cheap host path keep-warm is for: no more runs of these examples
            self._warm_examples = None  # (the next request served sets them again, and its run is timed in turn)
            self.stats["keep_warm_paused"] += 1
            if self.stats["keep_warm_paused"] == 1:
                log.info("keep-warm: a run took %.1f ms, over %.0f ms: no more runs until the next request (each "
                         "such pause is counted in /metrics)", (t1 - t0) * 1e3, KEEP_WARM_MAX_RUN_S * 1e3)
        with self._cv:
            for job in self._pending:
                if job.t_enqueue > t0:  # arrived during the run: it waited for the rest of it
                    job.keep_warm_wait_s = t1 - job.t_enqueue
                    self.stats["keep_warm_delayed"] += 1
                    if self.keep_warm_quiet:
                        self.stats[f"keep_warm_delayed_{self._missed(job, held_for_s)}"] += 1

    def _missed(self, job: _Job, run_s: float) -> str:
        """Why quiet did not hold back the run `job` met (CadenceForecast.miss): judged by its connection's
        forecast, or where that has no window, all requests' together."""
        for key in (job.conn, None):
            forecast = self._cadence.get(key)
            why = "no_forecast" if forecast is None else forecast.miss(job.t_enqueue, run_s)
            if why != "no_forecast":
                return why
        return "no_forecast"

    def _run_batch(self, batch: list[_Job]) -> None:
        t_start = time.perf_counter()
        try:
            if self._rtc_on:
                out = self._policy.infer([job.example for job in batch], rtc=[job.rtc for job in batch])
            else:
                out = self._policy.infer([job.example for job in batch])
            actions = np.asarray(out["actions"])
            if actions.ndim < 1 or actions.shape[0] != len(batch):
                raise RuntimeError(f"policy returned actions of shape {actions.shape} for a batch of {len(batch)}")
            if self.keep_warm_ms is not None:  # what a keep-warm run reruns: requests that were served as they are
                self._warm_examples = [job.example for job in batch]
                self._last_served = self._last_warmed = time.perf_counter()
        except Exception as e:
            if isinstance(e, NonFiniteActions) and (e.rows is not None and e.actions is not None or len(batch) == 1):
                self._deliver_rows(batch, e, t_start)  # which rows is known: no re-run
                return
            if len(batch) > 1 and not isinstance(e, BackendUnavailable):
                log.info("batch of %d failed (%s: %s); retrying one by one", len(batch), type(e).__name__, printable(e))
                for job in batch:
                    self._run_batch([job])
                return
            kind = "InputError" if isinstance(e, InputError) else "InternalError"
            if kind == "InternalError":
                log.exception("inference failed")
            error = RequestError(kind, str(e) if kind == "InputError" else f"{type(e).__name__}: {e}")
            for job in batch:  # one job, or a batch not retried (BackendUnavailable): every job gets the error
                self._deliver(job, error)
            return
        self._deliver_actions(batch, actions, out.get("policy_timing") or {}, t_start, out.get("chunks"),
                              out.get("guided"))

    def _deliver_rows(self, batch: list[_Job], e: NonFiniteActions, t_start: float) -> None:
        """A batch whose actions hold NaN or inf in some rows (withheld from the robot; the message says why, no
        traceback): the finite rows are answered as usual and only the others refused, without a re-run. Once the
        policy has given finite actions for other observations (this batch's others, the warm-up's or an earlier
        request's), the refused one's own values are the cause: an InputError, whichever observations it shared
        its batch with. Before that (no warm-up, and nothing served yet) the model may be at fault: an
        InternalError."""
        bad = set(e.rows) if e.rows is not None and e.actions is not None else set(range(len(batch)))  # alone
        # logged while a connection it refuses is within its first few errors (the connection's closing line counts
        # the rest): 366 such requests of one connection wrote 372 lines in 5 s before (the serving audit)
        if any(self._conn_errors.get(batch[i].conn, 0) < LOGGED_ERRORS_PER_CONNECTION for i in bad):
            log.warning("withheld non-finite actions for %d of %d observations: %s", len(bad), len(batch),
                        printable(e))
        if len(bad) < len(batch):
            good = [i for i in range(len(batch)) if i not in bad]
            chunks = [e.chunks[i] for i in good] if e.chunks is not None else None
            guided = [e.guided[i] for i in good] if e.guided is not None else None
            self._deliver_actions([batch[i] for i in good], np.asarray(e.actions)[good], e.timing or {}, t_start,
                                  chunks, guided)
            for i in sorted(bad):
                self._deliver(batch[i], RequestError("InputError", f"NonFiniteActions: {e} (the other {len(good)} "
                                                     f"observations of its batch of {len(batch)} came out finite, so "
                                                     "this observation's values are the cause)"))
            return
        if self._finite_seen:
            why = ("the policy gave finite actions for other observations before, so this observation's values "
                   "are the cause")
            for job in batch:
                self._deliver(job, RequestError("InputError", f"NonFiniteActions: {e} ({why})"))
            return
        why = "no observation has come out finite yet, with no warm-up run: the model may be at fault"
        for job in batch:
            self._deliver(job, RequestError("InternalError", f"NonFiniteActions: {e} ({why})"))

    def _deliver_actions(self, batch: list[_Job], actions: np.ndarray, policy_timing: dict, t_start: float,
                         chunks: list | None = None, guided: list | None = None) -> None:
        t_done = time.perf_counter()
        infer_ms = (t_done - t_start) * 1e3
        self._finite_seen = True
        self.stats["batches"] += 1
        self.stats["batched_observations"] += len(batch)
        self.metrics.infer_seconds.observe(infer_ms / 1e3)
        self.metrics.batch_size.observe(len(batch))
        for job in batch:
            self.metrics.queue_seconds.observe(t_start - job.t_enqueue)
        for i, job in enumerate(batch):
            timing = {
                "infer_ms": infer_ms,
                "queue_ms": (t_start - job.t_enqueue) * 1e3,
                "batch_size": len(batch),
                "transform_ms": policy_timing.get("transform_ms", float("nan")),
                "sample_and_copy_ms": policy_timing.get("sample_and_copy_ms", float("nan")),
            }
            if self.keep_warm_ms is not None or job.keep_warm_wait_s:  # a server with keep-warm says it, 0 or not
                timing["keep_warm_wait_ms"] = job.keep_warm_wait_s * 1e3
            self._deliver(job, _Done(np.ascontiguousarray(actions[i], dtype=np.float32), timing,
                                     chunks[i] if chunks is not None else None,
                                     bool(guided[i]) if guided is not None else False, t_done))

    @staticmethod
    def _deliver(job: _Job, value: Any) -> None:
        def set_result():
            if not job.future.done():
                job.future.set_result(value)

        try:
            job.loop.call_soon_threadsafe(set_result)
        except RuntimeError:
            pass  # the event loop is gone (shutdown); nobody is waiting any more

    def _stop_worker(self, join: bool = True) -> None:
        """Let the inference thread finish the pending jobs, then end it."""
        with self._cv:
            self._stopping_worker = True
            self._cv.notify_all()
        if join and self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(self.drain_timeout_s + 10)
        for t in self._extra_workers if join else ():
            t.join(self.drain_timeout_s + 10)

    # ------------------------------------------------------------------ metadata

    def _build_metadata(self) -> dict:
        policy = self._policy
        meta: dict[str, Any] = {"server": "vlaperf", "vlaperf_version": __version__, "wire_format": "openpi msgpack-numpy"}
        workload = getattr(policy, "workload", None)
        if hasattr(policy, "workload_metadata"):  # the policy describes its own workload (the world-action model)
            meta.update(policy.workload_metadata())
        elif workload is not None:
            overrides = {}
            try:
                from vlaperf.workloads import get_workload

                overrides = workload.overrides_vs(get_workload(workload.id))
            except Exception:
                pass
            meta.update(workload=workload.id, workload_overrides=overrides, action_horizon=workload.horizon,
                        robot_action_dim=workload.robot_action_dim, action_dim=workload.action_dim,
                        state_dim=workload.state_dim, layout=workload.layout)
        if getattr(policy, "num_steps", None) is not None:
            meta["num_steps"] = int(policy.num_steps)
        transform = getattr(policy, "transform", None)
        if getattr(transform, "tokenizer", None) is not None:
            meta["tokenizer"] = type(transform.tokenizer).__name__
        if hasattr(policy, "norm_stats"):
            meta["normalization"] = policy.norm_stats.describe() if policy.norm_stats is not None else None
        if getattr(policy, "conventions", None) is not None:
            meta["conventions"] = policy.conventions.name
        if self._rtc_on:
            rtc = policy.rtc
            meta["rtc"] = {"keys": [RTC_EXECUTED_KEY, RTC_DELAY_KEY], "execution_horizon": rtc.execution_horizon,
                           "max_guidance_weight": float(rtc.max_guidance_weight), "schedule": rtc.schedule}
        model = getattr(policy, "model", None)
        meta["checkpoint"] = checkpoint_metadata(model)
        config = getattr(model, "config", None)
        if config is not None and getattr(config, "vision", None) is not None:
            meta["image_size"] = int(config.vision.image_size)
        if getattr(model, "dtype", None) is not None:
            meta["dtype"] = str(model.dtype).replace("torch.", "")
        if getattr(policy, "device", None) is not None:
            meta["device"] = str(policy.device)
        import torch

        # the CPU threads torch runs the policy's host operators in (and the whole model on a CPU): a client's file
        # records its own environment, not the server's, and a closed loop's timing depends on it (docs/serving.md)
        meta["torch_threads"] = torch.get_num_threads()
        owner = getattr(getattr(policy, "sample", None), "__self__", None)
        levers = getattr(owner, "levers", None)
        if levers is not None and hasattr(levers, "names"):
            meta["levers"], meta["levers_label"] = list(levers.names()), str(getattr(owner, "name", ""))
        elif owner is not None and owner is model:
            meta["levers"], meta["levers_label"] = [], "reference"
        else:
            meta["levers"], meta["levers_label"] = [], "unknown"
        meta.update(max_batch=self.max_batch, max_wait_ms=self.max_wait_ms, max_message_bytes=self.max_message_bytes,
                    max_list_items=self.max_list_items, max_queued=self.max_queued, max_connections=self.max_connections,
                    idle_timeout_s=self.idle_timeout_s,
                    request_id_key=REQUEST_ID_KEY,
                    auth="api-key" if self.api_key else "none", warmup_s=round(getattr(self, "warmup_s", 0.0), 3),
                    keep_warm_ms=self.keep_warm_ms,
                    keep_warm_quiet=self.keep_warm_quiet if self.keep_warm_ms is not None else None)
        meta.update(self._extra_metadata)
        return meta


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__
