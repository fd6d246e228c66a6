"""Clients of the policy server: a blocking one (`Client`, like openpi-client's
WebsocketClientPolicy but raising `ServerError` with the parsed error frame) and an asyncio
connect helper used by the load generator.

    with Client("ws://127.0.0.1:8000") as c:
        print(c.metadata["workload"])
        actions = c.infer(obs)["actions"]          # (H, robot_action_dim) float32
        results = c.infer_batch([obs1, obs2])      # list of result dicts

`Client(url, keep_warm_ms=5)` keeps the connection's path warm between a control loop's calls: a websocket ping
every 5 ms while no call is in flight, for up to KEEP_WARM_FOR_S after the last call (docs/serving.md, "Keeping the
host path warm"). `KeepWarmPolicy(policy)` does the same for openpi-client's WebsocketClientPolicy.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from vlaperf.serve.protocol import DEFAULT_MAX_MESSAGE_BYTES, packb, parse_error_frame, unpackb


class ServerError(RuntimeError):
    """The server answered with an error frame."""

    def __init__(self, body: dict):
        self.kind = body.get("error", "ServerError")
        self.message = body.get("message", "")
        self.request_id = body.get("request_id")
        self.index = body.get("index")
        self.body = body
        super().__init__(f"{self.kind}: {self.message}")


class AuthenticationError(ConnectionError):
    """The server refused the websocket handshake with HTTP 401: no API key was sent, or a wrong one."""


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Api-Key {api_key}"} if api_key else None


def auth_refusal(exc: BaseException, api_key: str | None) -> AuthenticationError | None:
    """The handshake's HTTP 401 as an AuthenticationError that says what to do; None for any other failure.
    websockets raises InvalidStatus (its response's status_code; InvalidStatusCode's status_code on 12), which
    alone says only 'HTTP 401'."""
    status = getattr(getattr(exc, "response", None), "status_code", None) or getattr(exc, "status_code", None)
    if status != 401:
        return None
    hint = ("no API key was sent: pass api_key (--api-key) or set $VLAPERF_API_KEY" if not api_key
            else "the server refused the API key sent: check it against the server's --api-key / $VLAPERF_API_KEY")
    return AuthenticationError(f"server rejected the connection with HTTP 401 ({hint})")


@contextlib.contextmanager
def handshake(api_key: str | None):
    """Around a websocket connect (sync or async): its HTTP 401 raised as `auth_refusal`'s AuthenticationError."""
    try:
        yield
    except Exception as e:
        refusal = auth_refusal(e, api_key)
        if refusal is None:
            raise
        raise refusal from None


def normalize_url(url: str) -> str:
    if "://" not in url:
        url = "ws://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"expected a ws:// or wss:// URL, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"URL {url!r} has no host")
    return url


def decode_reply(frame: bytes | str, max_bytes: int | None = None) -> Any:
    """A reply frame -> its decoded value; an error (text) frame -> ServerError."""
    if isinstance(frame, str):
        raise ServerError(parse_error_frame(frame))
    return unpackb(frame, max_bytes=max_bytes)


# A keep-warm client pings for this long after its last call, then waits for the next (the server's keep-warm stops
# after as long: vlaperf.serve.server.KEEP_WARM_FOR_S).
KEEP_WARM_FOR_S = 10.0


def check_keep_warm_ms(every_ms) -> None:
    """A keep-warm period must be a finite number of milliseconds > 0."""
    if isinstance(every_ms, bool) or not isinstance(every_ms, (int, float)) or not 0 < every_ms < math.inf:
        raise ValueError(f"keep_warm_ms: expected a number of milliseconds > 0, or None, got {every_ms!r}")


class ConnectionWarmer:
    """Pings a blocking websockets connection every `every_ms` ms from a thread of its own while no call is in flight,
    for up to KEEP_WARM_FOR_S after the last call: the request's way to the server (this host's send path, the
    loopback, the server's event loop) stays warm through a control loop's idle. Calls go through `call()`, which
    keeps pings out of them. The server's websockets library answers each ping; no request is involved."""

    def __init__(self, ws, every_ms: float):
        check_keep_warm_ms(every_ms)
        self.ws, self.every_ms = ws, every_ms
        self.pings = 0  # pings sent
        self._calling = threading.Lock()  # held through a call: no ping goes out during one
        self._last_call = time.monotonic()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="vlaperf-client-keep-warm")
        self._thread.start()

    @contextlib.contextmanager
    def call(self):
        """Around one call on the connection: no ping goes out until it ends, and its end opens the window again."""
        with self._calling:
            try:
                yield
            finally:
                self._last_call = time.monotonic()

    def _run(self) -> None:
        """A ping every period while no call is in flight and the last one ended less than KEEP_WARM_FOR_S ago. Ends
        with `stop()` or at a failing ping (the connection is gone: the next call says what went wrong)."""
        while not self._closing.wait(self.every_ms / 1e3):
            if time.monotonic() - self._last_call > KEEP_WARM_FOR_S or not self._calling.acquire(blocking=False):
                continue
            try:
                self.ws.ping()  # the pong is the library's to read; nothing waits for it
            except Exception:
                return
            finally:
                self._calling.release()
            self.pings += 1

    def stop(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5.0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class Client:
    def __init__(self, url: str = "ws://127.0.0.1:8000", api_key: str | None = None, timeout_s: float = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, keep_warm_ms: float | None = None):
        """`keep_warm_ms`: while no call is in flight, a websocket ping this often (ms, > 0), for up to
        KEEP_WARM_FOR_S after the last call: the request's way to the server (this host's send path, the loopback,
        the server's event loop) stays warm through a control loop's idle. None (default): no pings but the
        websockets library's own keepalive."""
        from websockets.sync.client import connect

        if keep_warm_ms is not None:
            check_keep_warm_ms(keep_warm_ms)  # before connecting
        self.url, self.timeout_s = normalize_url(url), timeout_s
        self._max = max_message_bytes
        self.last_pack_ms: float | None = None  # the last `infer`'s packing and unpacking, ms
        self.last_unpack_ms: float | None = None
        self.keep_warm_ms = keep_warm_ms
        self._warmer: ConnectionWarmer | None = None
        # why the connection is out of step (a call ended before its reply came), or None: the late reply would be
        # read as the next call's, the actions of an older observation, so no call may follow on this connection
        self._out_of_step: str | None = None
        with handshake(api_key):
            self._ws = connect(self.url, additional_headers=auth_headers(api_key), compression=None,
                               max_size=max_message_bytes, open_timeout=timeout_s, **connect_options(connect))
        try:
            self.metadata: dict = decode_reply(self._ws.recv(timeout=timeout_s), self._max)
        except BaseException:
            self._ws.close()
            raise
        if keep_warm_ms is not None:
            self._warmer = ConnectionWarmer(self._ws, keep_warm_ms)

    @property
    def keep_warm_pings(self) -> int:
        """Pings sent to keep the path warm (0 without keep_warm_ms)."""
        return 0 if self._warmer is None else self._warmer.pings

    def send_raw(self, frame: bytes | str) -> bytes | str:
        """Send any frame, return the raw reply frame (tests and debugging). After a call that ended without its
        reply (TimeoutError past timeout_s, or interrupted), every later call raises ConnectionError: open a new
        Client."""
        if self._out_of_step is not None:
            raise ConnectionError(f"{self._out_of_step}; its late reply would answer this call, so the connection "
                                  f"takes no more calls: open a new Client")
        with self._warmer.call() if self._warmer is not None else contextlib.nullcontext():
            self._ws.send(frame)
            try:
                return self._ws.recv(timeout=self.timeout_s)
            except TimeoutError:
                self._out_of_step = f"an earlier call had no reply within {self.timeout_s:g} s (timeout_s)"
                raise
            except KeyboardInterrupt:
                self._out_of_step = "an earlier call was interrupted before its reply came"
                raise

    def infer(self, obs: dict) -> dict:
        t0 = time.perf_counter()
        frame = packb(obs)
        t1 = time.perf_counter()
        answer = self.send_raw(frame)
        t2 = time.perf_counter()
        try:
            return decode_reply(answer, self._max)
        finally:
            # the client's own part of this call's round trip, ms (vlaperf.serve.broker.call_split places it)
            self.last_pack_ms, self.last_unpack_ms = (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3

    def infer_batch(self, observations: list[dict]) -> list[dict]:
        return decode_reply(self.send_raw(packb(list(observations))), self._max)

    def close(self) -> None:
        if self._warmer is not None:
            self._warmer.stop()
        self._ws.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def connect_async(url: str, api_key: str | None = None, timeout_s: float = 30.0,
                        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
    """An open asyncio websocket connection (websockets' new API, or the legacy one on 12)."""
    url = normalize_url(url)
    headers = auth_headers(api_key)
    try:
        from websockets.asyncio.client import connect
    except ImportError:  # pragma: no cover - websockets 12
        from websockets.client import connect

        with handshake(api_key):
            return await connect(url, extra_headers=headers, compression=None, max_size=max_message_bytes,
                                 open_timeout=timeout_s)
    with handshake(api_key):
        return await connect(url, additional_headers=headers, compression=None, max_size=max_message_bytes,
                             open_timeout=timeout_s, **connect_options(connect))


def connect_options(connect) -> dict:
    """Keyword arguments for websockets' `connect` that only some versions take:
    proxy=None (>= 15 would otherwise route through HTTP(S)_PROXY from the environment; the
    policy server is reached directly) and, for the sync client, legacy=True (>= 17 warns
    about a connection that is not used as a context manager; `Client` holds its own)."""
    import inspect

    try:
        params = inspect.signature(connect).parameters
    except (TypeError, ValueError):
        return {}
    options = {"proxy": None} if "proxy" in params else {}
    if "legacy" in params:
        options["legacy"] = True
    return options


class KeepWarmPolicy:
    """openpi-client's WebsocketClientPolicy with its connection kept warm between calls, as `Client(keep_warm_ms=)`
    keeps vlaperf's: a ping every `every_ms` ms while no call is in flight (ConnectionWarmer). It wraps the policy
    and reaches its connection (`_ws`, openpi-client 0.1's attribute). The policy's own methods are passed through,
    so openpi's ActionChunkBroker and runtime take it as they take the policy.

        from openpi_client.websocket_client_policy import WebsocketClientPolicy
        policy = KeepWarmPolicy(WebsocketClientPolicy("127.0.0.1", 8000), every_ms=5)
    """

    def __init__(self, policy, every_ms: float = 5.0):
        ws = getattr(policy, "_ws", None)
        if not callable(getattr(ws, "ping", None)) or not callable(getattr(policy, "infer", None)):
            raise TypeError(f"policy: expected an openpi-client WebsocketClientPolicy (a blocking websocket connection "
                            f"at `_ws` and an `infer`), got {type(policy).__name__}")
        self.policy = policy
        self.warmer = ConnectionWarmer(ws, every_ms)

    def infer(self, obs: dict) -> dict:
        with self.warmer.call():
            return self.policy.infer(obs)

    def get_server_metadata(self) -> dict:
        return self.policy.get_server_metadata()

    def reset(self) -> None:
        self.policy.reset()

    @property
    def pings(self) -> int:
        return self.warmer.pings

    def close(self) -> None:
        """Stops the pings; the policy's connection stays the policy's to close."""
        self.warmer.stop()

    def __enter__(self) -> "KeepWarmPolicy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
