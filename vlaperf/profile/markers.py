"""Stage markers for any policy: vlaperf's own paths and bring-your-own (BYO) models.

Two ways to say where a stage is, freely mixed:

    rec = StageRecorder("cuda")
    with rec.call():                       # one policy call
        with rec.stage("encode"):          # a stage is a block ...
            z = encoder(obs)
        rec.mark("denoise")                # ... or starts at a boundary and lasts until
        for i in range(10):                #     the next mark, the end of the enclosing
            x = step(x, z)                 #     stage or "end"
        rec.mark("end")

`mark(name)` has the signature of `Engine.stage_hook`, so `engine.stage_hook = rec.mark`
works; an engine with cuda_graph then times its stages inside the graph instead, and
`for name, event in engine.last_stage_events: rec.mark(name, token=event)` after the call
hands them over. `@rec.stage("encode")` decorates a function. Code that should run with or without
a profiler uses the module-level `stage` / `mark` / `staged`, which forward to the
recorder activated with `with rec.activate():` and do nothing otherwise.

How stages are timed, per device:
- CUDA: every boundary records one CUDA event on the current stream; nothing waits for the
  device between stages. When the call ends, the recorder waits once for its last event
  and reads all elapsed times. Each stage also opens an NVTX range
  (torch.cuda.nvtx.range_push/pop), so Nsight Systems shows the stages on its timeline.
- CPU (and anything else): time.perf_counter at each boundary (CPU work is synchronous).
- While a torch.profiler session is active, each stage also opens a record_function range,
  so the stage names show up in Chrome/Perfetto traces on any device (see trace.py).

A call's span runs from `call()` entry to exit. The time inside the span that no top-level
stage covers is reported as the stage "(unmarked)", so the stages of a call always add up
to its span exactly; the profiler compares that span with an untimed call separately.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

UNMARKED = "(unmarked)"
END = "end"


# ----------------------------------------------------------------------------- clocks


class HostClock:
    """perf_counter timestamps; `finish` has nothing to wait for."""

    kind = "perf_counter"

    def now(self) -> float:
        return time.perf_counter()

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def finish(self, last: float) -> None:
        return None


class CudaEventClock:
    """One CUDA event per boundary, recorded on the current stream; `finish` waits once for
    the last one (the only host/device synchronization the recorder adds per call)."""

    kind = "cuda_event"

    def __init__(self, device: torch.device):
        self.device = device
        self.syncs = 0

    def now(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def elapsed_ms(self, start, end) -> float:
        return float(start.elapsed_time(end))

    def finish(self, last) -> None:
        last.synchronize()
        self.syncs += 1


def default_clock(device: torch.device):
    return CudaEventClock(device) if device.type == "cuda" else HostClock()


# ----------------------------------------------------------------------------- records


@dataclass
class Interval:
    name: str  # full name: enclosing stage names joined by "/" for nested stages
    depth: int  # 0 = a top-level stage of the call
    start: Any  # clock tokens
    end: Any = None


@dataclass
class CallRecord:
    """One call's stages, in the order they started. ms values are floats."""

    stages: list[tuple[str, int, float]] = field(default_factory=list)  # (name, depth, ms)
    span_ms: float = 0.0
    unmarked_ms: float = 0.0

    def totals(self, depth: int = 0) -> dict[str, float]:
        """name -> summed ms over the call (a name can occur many times, e.g. per step)."""
        out: dict[str, float] = {}
        for name, d, ms in self.stages:
            if d == depth:
                out[name] = out.get(name, 0.0) + ms
        return out


class _Ranges:
    """NVTX (CUDA) and record_function (while a profiler runs) ranges of open stages."""

    def __init__(self, nvtx: bool, record_function: bool):
        self.nvtx, self.record_function = nvtx, record_function

    def open(self, name: str) -> list:
        handles = []
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
            handles.append("nvtx")
        if self.record_function and torch.autograd._profiler_enabled():
            rf = torch.autograd.profiler.record_function(name)
            rf.__enter__()
            handles.append(rf)
        return handles

    def close(self, handles: list) -> None:
        for h in reversed(handles):
            if h == "nvtx":
                torch.cuda.nvtx.range_pop()
            else:
                h.__exit__(None, None, None)


# ----------------------------------------------------------------------------- recorder


class StageRecorder:
    """Collects stage times over many calls of a policy. See the module docstring.

    device: where the policy runs ("cuda" -> CUDA events + NVTX, else perf_counter).
    clock:  replaces the timestamp source (tests pass a fake CUDA-event clock).
    nvtx:   push NVTX ranges (default: on for CUDA devices).
    record_function: open torch.profiler ranges while a profiler is active (default on).
    """

    def __init__(self, device: torch.device | str = "cpu", *, clock=None, nvtx: bool | None = None,
                 record_function: bool = True):
        self.device = torch.device(device)
        self.clock = clock if clock is not None else default_clock(self.device)
        self._ranges = _Ranges(self.device.type == "cuda" if nvtx is None else nvtx, record_function)
        self.calls: list[CallRecord] = []
        self._reset_call()

    # ---------------------------------------------------------------- call bracketing

    def _reset_call(self) -> None:
        self._in_call = False
        self._call_start = None
        self._intervals: list[Interval] = []
        self._stack: list[tuple[Interval, list]] = []  # open block stages (context managers)
        self._open: dict[int, tuple[Interval, list]] = {}  # open boundary stage per depth

    @property
    def timer(self) -> str:
        return self.clock.kind

    def begin_call(self) -> None:
        if self._in_call:
            raise RuntimeError("StageRecorder: begin_call inside a call (calls do not nest)")
        self._reset_call()
        self._in_call = True
        self._call_start = self.clock.now()

    def end_call(self) -> CallRecord:
        """Close what is open, wait once for the device, turn tokens into milliseconds."""
        if not self._in_call:
            raise RuntimeError("StageRecorder: end_call without begin_call")
        end = self.clock.now()
        while self._stack:  # a block left open by an exception
            self._exit_block(end)
        self._close_boundary_from(0, end)
        for it in self._intervals:
            if it.end is None:
                it.end = end
        self.clock.finish(end)
        ms = self.clock.elapsed_ms
        record = CallRecord()
        record.span_ms = ms(self._call_start, end)
        top = []
        for it in self._intervals:
            d = ms(it.start, it.end)
            record.stages.append((it.name, it.depth, d))
            if it.depth == 0:
                top.append(d)
        record.unmarked_ms = max(record.span_ms - sum(top), 0.0)
        record.stages.append((UNMARKED, 0, record.unmarked_ms))
        self.calls.append(record)
        self._reset_call()
        return record

    @contextlib.contextmanager
    def call(self) -> Iterator["StageRecorder"]:
        """Bracket one policy call; its record is appended to `self.calls` on exit."""
        self.begin_call()
        try:
            yield self
        finally:
            self.end_call()

    def _ensure_call(self) -> None:
        if not self._in_call:
            self.begin_call()  # marks outside call(): an implicit call until end_call()

    # ---------------------------------------------------------------- stages

    def _prefix(self) -> str:
        return self._stack[-1][0].name if self._stack else ""

    def _full(self, name: str) -> str:
        p = self._prefix()
        return f"{p}/{name}" if p else name

    def _close_boundary_from(self, depth: int, token) -> None:
        """Close the open boundary stages at `depth` and deeper."""
        for d in sorted([d for d in self._open if d >= depth], reverse=True):
            it, handles = self._open.pop(d)
            it.end = token if token is not None else self.clock.now()
            self._ranges.close(handles)

    def mark(self, name: str, token=None) -> None:
        """A stage called `name` starts here; "end" only closes the open one.

        Same signature as `Engine.stage_hook`. The stage lasts until the next mark at the
        same level, the end of the enclosing block stage, or the end of the call.
        token: a timestamp taken elsewhere, in this clock's kind (a CUDA event recorded on the
        call's stream, e.g. one of `Engine.last_stage_events` that a graph replay recorded),
        used instead of now; such a mark opens no NVTX range (the host's time is not its time)."""
        self._ensure_call()
        depth = len(self._stack)
        ranged = token is None
        token = self.clock.now() if token is None else token
        self._close_boundary_from(depth, token)
        if name == END:
            return
        it = Interval(self._full(name), depth, token)
        self._intervals.append(it)
        self._open[depth] = (it, self._ranges.open(name) if ranged else [])

    __call__ = mark

    def _enter_block(self, name: str) -> None:
        self._ensure_call()
        depth = len(self._stack)
        token = self.clock.now()
        self._close_boundary_from(depth, token)  # a block ends the boundary stage before it
        it = Interval(self._full(name), depth, token)
        self._intervals.append(it)
        self._stack.append((it, self._ranges.open(name)))

    def _exit_block(self, token=None) -> None:
        it, handles = self._stack[-1]
        token = token if token is not None else self.clock.now()
        self._close_boundary_from(len(self._stack), token)  # boundary stages inside it
        it.end = token
        self._ranges.close(handles)
        self._stack.pop()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """`with rec.stage("encode"):` times the block; `@rec.stage("encode")` a function."""
        self._enter_block(name)
        try:
            yield
        finally:
            self._exit_block()

    def staged(self, name: str | None = None) -> Callable:
        """Decorator: `@rec.staged()` uses the function's name as the stage name."""

        def wrap(fn):
            import functools

            @functools.wraps(fn)
            def inner(*args, **kwargs):
                with self.stage(name or fn.__name__):
                    return fn(*args, **kwargs)

            return inner

        return wrap

    # ---------------------------------------------------------------- BYO activation

    @contextlib.contextmanager
    def activate(self) -> Iterator["StageRecorder"]:
        """Route the module-level `stage` / `mark` / `staged` to this recorder."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    # ---------------------------------------------------------------- results

    def clear(self) -> None:
        self.calls.clear()

    def stage_names(self, depth: int = 0) -> list[str]:
        """Stage names in order of first appearance over all calls ("(unmarked)" last)."""
        seen: dict[str, None] = {}
        for rec in self.calls:
            for name, d, _ in rec.stages:
                if d == depth and name != UNMARKED:
                    seen.setdefault(name, None)
        return list(seen) + [UNMARKED]


class NullRecorder:
    """Same interface, records nothing: the default for instrumented code run untimed."""

    timer = "none"

    def mark(self, name: str, token=None) -> None:
        return None

    __call__ = mark

    def stage(self, name: str):
        return contextlib.nullcontext()

    def staged(self, name: str | None = None) -> Callable:
        return lambda fn: fn

    def call(self):
        return contextlib.nullcontext(self)


NULL_RECORDER = NullRecorder()


class _MarksTo:
    """What `marks_to` activates: boundary marks go to one function; block stages are not timed."""

    def __init__(self, fn: Callable[[str], None]):
        self.mark = fn

    def stage(self, name: str):
        return contextlib.nullcontext()


_ACTIVE: contextvars.ContextVar[StageRecorder | _MarksTo | None] = contextvars.ContextVar("vlaperf_stage_recorder",
                                                                                       default=None)


def active_recorder() -> StageRecorder | NullRecorder:
    return _ACTIVE.get() or NULL_RECORDER


@contextlib.contextmanager
def marks_to(fn: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, the module-level `mark(name)` calls `fn(name)` instead of the active
    recorder's mark. For code that records its stage boundaries elsewhere while it runs: a CUDA
    graph's capture turns each into an event node (engine/graphs.py, `GraphCache.record_stage`),
    whose times the recorder gets after the replay through `mark(name, token=event)`."""
    token = _ACTIVE.set(_MarksTo(fn))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def mark(name: str) -> None:
    """Module-level boundary mark: forwards to the active recorder, else does nothing."""
    rec = _ACTIVE.get()
    if rec is not None:
        rec.mark(name)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Module-level block stage (context manager or decorator); a no-op without an active
    recorder, so instrumented policy code costs nothing in production."""
    rec = _ACTIVE.get()
    if rec is None:
        yield
        return
    with rec.stage(name):
        yield


def staged(name: str | None = None) -> Callable:
    """Module-level decorator: `@staged("encode")` (default name: the function's)."""

    def wrap(fn):
        import functools

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with stage(name or fn.__name__):
                return fn(*args, **kwargs)

        return inner

    return wrap
