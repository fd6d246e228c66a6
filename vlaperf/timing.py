"""Timers, warm-up, summaries, interleaved A/B comparison and the environment record.

Everything vlaperf reports as a latency goes through this file, so the rules live here once:

- Every timed call is bracketed by a device synchronize on both sides. A robot policy is
  called one observation at a time and its caller needs the actions on the host, so the
  latency that matters is "idle device -> result ready", not the throughput of a queue of
  back-to-back launches.
- On CUDA each call is measured two ways at once: a CUDA event pair (device time between
  the first and last kernel on the current stream, blind to host-side gaps before the first
  launch) and host wall clock around the synchronized call (what the caller sees, including
  Python/launch overhead). Both numbers come from the same call, so they can be compared
  sample by sample.
- The first call is timed on its own and never mixed into the statistics: it is where
  torch.compile, autotuning, lazy CUDA init and cudagraph capture cost show up.
- A/B comparisons interleave the variants round by round with a rotating order, so slow
  drift (clocks, thermals, other tenants) hits every variant alike and no variant always
  holds the same position in a round (e.g. first, on caches the previous one left cold).

Units: samples and summaries are in milliseconds, first_call_s / warmup_s in seconds,
memory in bytes.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vlaperf.gpu_state import GPU_STATE_FIELDS, parse_gpu_state

# Environment variables that change what torch.compile / the CUDA runtime do and so change
# the numbers. TORCHINDUCTOR_* are collected by prefix (all that are set).
ENV_VARS = (
    "TORCHDYNAMO_DISABLE",
    "TORCH_COMPILE_DISABLE",
    # torch's switches that change what a compiled call runs (read at its import): another backend for the graphs
    # named, inductor settings for them, and a compile error falling back to eager
    "TORCH_COMPILE_OVERRIDE_BACKENDS",
    "TORCH_COMPILE_OVERRIDE_INDUCTOR_CONFIGS",
    "TORCHDYNAMO_SUPPRESS_ERRORS",
    "CUDA_LAUNCH_BLOCKING",
    "TORCH_LOGS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "TRITON_CACHE_DIR",  # a warm cache makes the first call seconds instead of tens of seconds
    # fused multiply-add in Triton's kernels: the default for kernels that do not ask (its default turns it off in
    # Triton 3.10), and the switch that turns it off in every kernel, inductor's and vlaperf's included
    "TRITON_DEFAULT_FP_FUSION",
    "TRITON_FORCE_DISABLE_FP_FUSION",
    "TRITON_INTERPRET",  # Triton's kernels run in its Python interpreter, on the host
    "PYTORCH_NO_CUDA_MEMORY_CACHING",  # a cudaMalloc / cudaFree per tensor instead of torch's cache
    "NVIDIA_TF32_OVERRIDE",  # 0 keeps cuBLAS off TF32 whatever torch asks (best's SigLIP patch matmul uses it)
)
# cuBLAS's and cuBLASLt's workspace sizes (CUBLAS_WORKSPACE_CONFIG, CUBLASLT_WORKSPACE_SIZE) change which GEMM
# kernels their heuristics pick: SigLIP's fc2 on the H200 ran 15.5 us at torch's default and 13.4 us with a 32 MiB
# cuBLASLt workspace (benchmarks/cublaslt_probe.py, docs/perf-notes.md session 23)
ENV_PREFIXES = ("TORCHINDUCTOR_", "CUBLAS")


# ----------------------------------------------------------------------------- statistics


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, by linear interpolation.

    Same rule as numpy.percentile's default method="linear": the percentile sits at the
    fractional rank r = q/100 * (n - 1) (0-based) and is interpolated between the two
    closest ranks floor(r) and ceil(r). E.g. 1..100 -> p90 = 90.1, median = 50.5.
    """
    n = len(sorted_values)
    rank = q / 100.0 * (n - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    a, b = sorted_values[lo], sorted_values[hi]
    # Return an exact rank as is (also keeps inf values from turning into inf - inf = nan).
    if frac == 0.0 or a == b:
        return float(a)
    return float(a + (b - a) * frac)


def summarize(values_ms: Sequence[float]) -> dict[str, float | int]:
    """count, mean, median, p90, p95, p99, min, max, std of a list of timings.

    Percentiles (median included) use linear interpolation between the closest ranks, as
    numpy.percentile's default method. std is the *population* standard deviation (divide
    by n, numpy's default ddof=0), so a single sample has std 0.
    """
    values = sorted(float(v) for v in values_ms)
    if not values:
        raise ValueError("summarize: need at least one value")
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / n
    return {
        "count": n,
        "mean": mean,
        "median": _percentile(values, 50),
        "p90": _percentile(values, 90),
        "p95": _percentile(values, 95),
        "p99": _percentile(values, 99),
        "min": values[0],
        "max": values[-1],
        "std": math.sqrt(var),
    }


# ----------------------------------------------------------------------------- timers


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on `device`. No-op on CPU (CPU ops run synchronously)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Timer:
    """Times one call of a zero-argument function both ways: CUDA events and synced wall clock.

    Per call:  sync; t0 = perf_counter; start.record(); fn(); end.record(); sync; t1.
    The events are recorded on the current stream of `device`; work that `fn` puts on other
    streams is seen by the wall clock (the sync waits for the whole device) but not by the
    events. On CPU only the wall clock exists and the event time is None.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():  # torch's own: "dummy base class Event"
            raise ValueError(f"device: {self.device} requested, but CUDA is not available here (time on 'cpu')")
        self.use_events = self.device.type == "cuda"
        if self.use_events:
            # One reusable pair: we synchronize after every call, so the pair is free again
            # before the next call records into it.
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def __call__(self, fn: Callable[[], object]) -> tuple[float, float | None]:
        """Run fn once; return (wall_ms, cuda_event_ms or None)."""
        if not self.use_events:
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            return (t1 - t0) * 1e3, None
        stream = torch.cuda.current_stream(self.device)
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self._start.record(stream)
        fn()
        self._end.record(stream)
        torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        return (t1 - t0) * 1e3, self._start.elapsed_time(self._end)

    def wall_s(self, fn: Callable[[], object]) -> float:
        """Run fn once between two syncs; return wall seconds (used for untimed warm-up)."""
        synchronize(self.device)
        t0 = time.perf_counter()
        fn()
        synchronize(self.device)
        return time.perf_counter() - t0


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


class _Progress:
    """A rich progress bar, or nothing.

    It is a no-op when progress=False, when rich is missing, or when stderr is not a
    terminal (logs, CI, pytest). The bar is redrawn by hand at most ~10 times a second and
    only between timed calls: rich's default auto-refresh thread would compete with the
    measured call for the GIL and add jitter to the wall clock.
    """

    def __init__(self, total: int, label: str, enabled: bool):
        self._bar = None
        self._last_refresh = 0.0
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(stderr=True)
            if not console.is_terminal:
                return
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                auto_refresh=False,
                transient=True,
            )
            self._label = label or "timing"
            self._task = self._bar.add_task(self._label, total=total)
            self._bar.start()
        except Exception:  # a progress bar must never break a measurement
            self._bar = None

    def phase(self, name: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self._label} [{name}]")
            self._bar.refresh()

    def advance(self) -> None:
        if self._bar is None:
            return
        self._bar.advance(self._task)
        now = time.perf_counter()
        if now - self._last_refresh > 0.1:
            self._bar.refresh()
            self._last_refresh = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_counts(fn_name: str, warmup: int, iters: int, min_warmup: int = 0, iters_name: str = "iters") -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < min_warmup:
        raise ValueError(f"{fn_name}: warmup must be an integer >= {min_warmup}, got {warmup!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"{fn_name}: {iters_name} must be an integer >= 1, got {iters!r}")


def wait_idle(ms: float, spin: bool = False, rewarm: Callable[[], object] | None = None, rewarm_every_ms: float = 5.0,
              device: torch.device | str = "cpu") -> None:
    """The idle before a call (`idle_ms` below): asleep, as a control loop waits for its next tick, or with `spin`
    on the clock, busy, so the core stays awake at its clock. The two apart say whether a cost after the idle comes
    from the core's sleep (its clock, its idle state) or from state that decays whatever the core does. `rewarm`
    (spinning): called, untimed and synchronized on `device`, every `rewarm_every_ms` through the idle, none started
    within that period of its end: what keeping the call's own state warm wins back
    (benchmarks/idle_decay_probe.py)."""
    if not ms:
        return
    if not spin and rewarm is None:
        time.sleep(ms / 1e3)
        return
    end = time.perf_counter() + ms / 1e3
    next_call = time.perf_counter()
    while (now := time.perf_counter()) < end:
        if rewarm is not None and now >= next_call and end - now > rewarm_every_ms / 1e3:
            rewarm()
            synchronize(device)
            next_call = now + rewarm_every_ms / 1e3


def time_calls(
    fn: Callable[[], object],
    *,
    device: torch.device | str,
    warmup: int = 30,
    iters: int = 100,
    progress: bool = True,
    label: str = "",
    collect_garbage: bool = True,
    idle_ms: float = 0.0,
    idle_spin: bool = False,
    first_call_s: float | None = None,
) -> dict[str, Any]:
    """Time `iters` calls of `fn` after `warmup` warm-up calls.

    - first_call_s: wall seconds of the very first call, synced before and after (compile,
      autotune, lazy init). With warmup=0 there is no separate warm-up call, so the first
      call is the first timed sample and first_call_s is that sample, in seconds.
    - warmup_s: wall seconds of the warm-up calls *after* the first one (warmup - 1 calls);
      first_call_s + warmup_s is the whole warm-up. Kept apart because cost that shows up
      here (e.g. cudagraph trees recording on the 2nd/3rd call, recompiles) is a finding.
    - first_call_s given: the caller made and timed the first call itself (bench: before its
      equivalence check). It is the first of the `warmup` calls, so warmup - 1 follow here, all
      of them in warmup_s; with warmup 0 it is still the one untimed call, and warmup says 1.
    - peak_memory_bytes: torch.cuda.max_memory_allocated over the timed calls only (peak
      stats are reset after warm-up); None on CPU.
    - idle_ms: sleep that long before each timed call, outside its timer (interleaved's
      idle_ms: a control loop's wait between calls); with idle_spin, spin on the clock instead
      (wait_idle).

    Returns {"timers": {"cuda_event_ms": summary | None, "wall_ms": summary},
             "samples": {"cuda_event_ms": [...] | None, "wall_ms": [...]},
             "first_call_s", "warmup_s", "warmup", "iters", "peak_memory_bytes"}.
    """
    _check_counts("time_calls", warmup, iters)
    device = torch.device(device)
    timer = Timer(device)
    wall_ms: list[float] = []
    event_ms: list[float] = []
    warmup_s = 0.0
    if first_call_s is not None:
        # Made already: counting it here again put one more untimed call before the timed ones than `warmup`
        # says, and that call's time (the process's second, where cudagraph trees record) in neither field.
        warmup = max(warmup, 1)

    with _Progress(warmup + iters, label, progress) as bar:
        if warmup >= 1:
            bar.phase("first call")
            if first_call_s is None:
                first_call_s = timer.wall_s(fn)
            bar.advance()
            bar.phase("warm-up")
            for _ in range(warmup - 1):
                warmup_s += timer.wall_s(fn)
                bar.advance()

        # Collect garbage from warm-up now rather than letting a gen-2 collection land
        # inside a timed call (a caller that times one call at a time collects once itself:
        # a collection walks every object and leaves the next short call's caches cold).
        if collect_garbage:
            gc.collect()
        _reset_peak_memory(device)

        bar.phase("timed")
        for _ in range(iters):
            wait_idle(idle_ms, idle_spin)
            w, e = timer(fn)
            wall_ms.append(w)
            if e is not None:
                event_ms.append(e)
            bar.advance()
        peak = _peak_memory(device)

    if first_call_s is None:
        first_call_s = wall_ms[0] / 1e3
    events = event_ms if timer.use_events else None
    return {
        "timers": {"cuda_event_ms": summarize(events) if events else None, "wall_ms": summarize(wall_ms)},
        "samples": {"cuda_event_ms": events, "wall_ms": wall_ms},
        "first_call_s": first_call_s,
        "warmup_s": warmup_s,
        "warmup": warmup,
        "iters": iters,
        "peak_memory_bytes": peak,
    }


# ----------------------------------------------------------------------------- A/B


def _ratio_stats(baseline: list[float], variant: list[float]) -> dict[str, float | bool]:
    """Speedup of `variant` over `baseline` (>1 means variant is faster) and its spread.

    speedup = median(baseline) / median(variant). The spread is the p10..p90 of the
    per-round ratios baseline_i / variant_i (both from the same round, so drift cancels).
    significant iff that interval excludes 1.0, i.e. in at least ~80% of rounds the same
    variant won, and the medians' ratio says the same. A variant compared with itself is never significant.
    """

    def ratio(b: float, v: float) -> float:
        if v > 0:
            return b / v
        return 1.0 if b == v else math.inf  # a 0.0 reading is below timer resolution: two of them are a tie

    per_round = sorted(ratio(b, v) for b, v in zip(baseline, variant))
    p10, p90 = _percentile(per_round, 10), _percentile(per_round, 90)
    speedup = ratio(summarize(baseline)["median"], summarize(variant)["median"])
    return {
        "speedup": speedup,
        "ratio_median": _percentile(per_round, 50),
        "ratio_p10": p10,
        "ratio_p90": p90,
        # the rounds' ratios on one side of 1, and the medians' ratio on that side too: one slow round at the low
        # load of two (a busy host) can put the medians' ratio at 0.69x while 19 of 20 rounds say 1.03x
        "significant": bool((p10 > 1.0 and speedup > 1.0) or (p90 < 1.0 and speedup < 1.0)),
    }


def interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    device: torch.device | str,
    warmup: int = 10,
    iters: int = 50,
    baseline: str | None = None,
    progress: bool = True,
    idle_ms: dict[str, float] | None = None,
    idle_spin: bool = False,
    settle: Sequence[str] = (),
    idle_rewarm: dict[str, Callable[[], object]] | None = None,
    rewarm_every_ms: float = 5.0,
) -> dict[str, Any]:
    """Compare variants by calling them in interleaved rounds with a rotating order.

    Warm-up: variant by variant, the first call is timed on its own (first_call_s), then
    warmup - 1 untimed calls (warmup_s). warmup must be >= 1 here: a first call (compile,
    capture) inside the rounds would make that round's ratio meaningless.

    Rounds: `iters` rounds; round r calls the variants in the key order rotated left by r
    (A B C, B C A, C A B, A B C, ...), each call timed like time_calls (CUDA events + synced
    wall clock), so every variant sees every position equally often.

    peak_memory_bytes per variant (CUDA; None on CPU): peak stats are reset right before
    that variant's first call and read after its warm-up, so it is the peak over first call
    + warm-up, which is what a user of that variant sees. It is the allocator-wide peak,
    so it includes tensors held by other variants at the time (e.g. their weights).

    idle_ms: {name: ms} sleeps that long before each of that variant's timed calls, outside
    its timers (the device is already idle: the previous call was synchronized). A robot
    calls its policy once per control period and waits in between; a variant that repeats
    another with an idle before it says what that wait costs the next call (caches and
    clocks gone cold), against the same call back to back. idle_spin: spin on the clock
    instead of sleeping (wait_idle). idle_rewarm: {name: fn}, that variant's idle spun with
    fn called every rewarm_every_ms through it (wait_idle's rewarm).

    settle: names whose timed calls are each preceded by one untimed call of the same
    variant, so that the call timed follows its own kind, as in a loop of that policy. The
    round's order puts a fast variant right after a slow one: a call after LeRobot's eager
    guided predict (autograd on the host for 0.5 s) took 1.0-1.3 ms longer than the same call
    after another of its own (perf-notes, session 49), a cost of the neighbour, not of it.

    Returns {
      "variants": {name: {"timers", "samples", "first_call_s", "warmup_s", "peak_memory_bytes"}},
      "ratios": {name: {"wall_ms": R, "cuda_event_ms": R | None}}  (baseline included, = 1.0),
      "baseline": name, "warmup": int, "iters": int,
    } where R = {"speedup", "ratio_median", "ratio_p10", "ratio_p90", "significant"}
    (see _ratio_stats; speedup > 1 means the variant is faster than the baseline).
    """
    if not fns:
        raise ValueError("interleaved: need at least one function")
    names = list(fns)
    if baseline is None:
        baseline = names[0]
    if baseline not in fns:
        raise ValueError(f"interleaved: baseline {baseline!r} is not one of {names}")
    _check_counts("interleaved", warmup, iters, min_warmup=1)
    idle_ms = dict(idle_ms or {})
    idle_rewarm = dict(idle_rewarm or {})
    if not set(idle_rewarm) <= set(idle_ms):
        raise ValueError(f"interleaved: idle_rewarm names {sorted(set(idle_rewarm) - set(idle_ms))}, which have no "
                         "idle_ms to rewarm through")
    settle = set(settle)
    if not settle <= set(fns):
        raise ValueError(f"interleaved: settle names {sorted(settle - set(fns))}, not among {names}")
    for name, ms in idle_ms.items():
        if name not in fns:
            raise ValueError(f"interleaved: idle_ms names {name!r}, which is not one of {names}")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < math.inf:
            raise ValueError(f"interleaved: idle_ms[{name!r}]: expected milliseconds >= 0, got {ms!r}")
    device = torch.device(device)
    timer = Timer(device)
    n = len(names)

    first_call_s: dict[str, float] = {}
    warmup_s: dict[str, float] = {name: 0.0 for name in names}
    peak: dict[str, int | None] = {}
    wall_ms: dict[str, list[float]] = {name: [] for name in names}
    event_ms: dict[str, list[float]] = {name: [] for name in names}

    with _Progress(n * (warmup + iters), "interleaved", progress) as bar:
        for name in names:
            bar.phase(f"warm-up {name}")
            _reset_peak_memory(device)
            first_call_s[name] = timer.wall_s(fns[name])
            bar.advance()
            for _ in range(warmup - 1):
                warmup_s[name] += timer.wall_s(fns[name])
                bar.advance()
            peak[name] = _peak_memory(device)

        gc.collect()  # see time_calls
        bar.phase("rounds")
        for r in range(iters):
            order = names[r % n :] + names[: r % n]
            for name in order:
                if name in settle:
                    fns[name]()
                    synchronize(device)
                wait_idle(idle_ms.get(name, 0.0), idle_spin, rewarm=idle_rewarm.get(name),
                          rewarm_every_ms=rewarm_every_ms, device=device)
                w, e = timer(fns[name])
                wall_ms[name].append(w)
                if e is not None:
                    event_ms[name].append(e)
                bar.advance()

    variants: dict[str, dict[str, Any]] = {}
    for name in names:
        events = event_ms[name] if timer.use_events else None
        variants[name] = {
            "timers": {"cuda_event_ms": summarize(events) if events else None, "wall_ms": summarize(wall_ms[name])},
            "samples": {"cuda_event_ms": events, "wall_ms": wall_ms[name]},
            "first_call_s": first_call_s[name],
            "warmup_s": warmup_s[name],
            "peak_memory_bytes": peak[name],
        }

    ratios: dict[str, dict[str, Any]] = {}
    for name in names:
        ratios[name] = {
            "wall_ms": _ratio_stats(wall_ms[baseline], wall_ms[name]),
            "cuda_event_ms": _ratio_stats(event_ms[baseline], event_ms[name]) if timer.use_events else None,
        }

    return {
        "variants": variants,
        "ratios": ratios,
        "baseline": baseline,
        "warmup": warmup,
        "iters": iters,
    }


# ----------------------------------------------------------------------------- environment


def _probe(fn: Callable[[], Any], default: Any = None) -> Any:
    """fn(), or `default` if it raises anything: the environment record must never fail."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. deprecation notes on the tf32 flags
            return fn()
    except Exception:
        return default


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    """stdout of a short command, stripped; None if it is missing, fails or hangs."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except Exception:
        return None
    return out.stdout.strip()


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def device_uuid(device: torch.device) -> str | None:
    """The UUID of the GPU this process uses for `device`, as nvidia-smi writes it without its
    'GPU-' prefix (lower case), or None where torch cannot say (no CUDA, old torch)."""
    try:
        return str(torch.cuda.get_device_properties(device).uuid).lower().removeprefix("gpu-")
    except Exception:
        return None


def _gpu_state(dev: torch.device) -> dict[str, Any] | None:
    uuid = device_uuid(dev)  # by UUID: CUDA_VISIBLE_DEVICES renumbers GPUs for torch, not for nvidia-smi
    if shutil.which("nvidia-smi") is None or uuid is None:
        return None
    select = f"--id=GPU-{uuid}"
    fields = ",".join(GPU_STATE_FIELDS.values())
    out = _run(["nvidia-smi", select, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if out is None:  # drivers before 535 name the reasons field "clocks_throttle_reasons"
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
        out = _run(["nvidia-smi", select, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    return parse_gpu_state(out.splitlines()[0]) if out else None


def _triton_version() -> str | None:
    # Read the installed metadata instead of importing triton (slow, and may fail on CPU).
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _cpu_name() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or None


def cpu_id(cpuinfo: str) -> str | None:
    """The first processor's vendor, family, model and stepping in /proc/cpuinfo's text, e.g. "GenuineIntel family 6
    model 143 stepping 8": what tells two hosts apart where a VM reports its model name as a bare "Intel(R) Xeon(R)
    Processor" (session 42's served-path host stages took twice session 30's time, on hosts whose model names read
    alike)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the end of the first processor's block
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    if not all(k in fields for k in ("vendor_id", "cpu family", "model")):
        return None
    return (f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"
            + (f" stepping {fields['stepping']}" if "stepping" in fields else ""))


def _cpu_id() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    return cpu_id(cpuinfo.read_text(errors="replace")) if cpuinfo.exists() else None


def _usable_cpus() -> int | None:
    """The CPUs this process may run on (its affinity: a container's or `taskset`'s limit), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


CPU_SYSFS = Path("/sys/devices/system/cpu")


def cpu_power(root: Path = CPU_SYSFS) -> dict[str, Any] | None:
    """How the CPUs may slow down between calls, from Linux's sysfs: the frequency governors of the CPUs this process
    may use (`cpufreq`; e.g. "performance", or "powersave" / "schedutil", which lower the clock of an idle core), the
    idle governor and the idle states of the first such CPU that are enabled, shallowest first (a deeper state takes
    longer to leave). A robot's policy waits between its calls, and the call after the wait pays for both (`bench
    --idle-ms`). None where sysfs says nothing (not Linux, or a container without it); a missing part is null."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))

    def read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    governors = sorted({g for c in cpus if (g := read(root / f"cpu{c}" / "cpufreq" / "scaling_governor"))})
    states = []
    idle_dir = root / f"cpu{cpus[0]}" / "cpuidle" if cpus else None
    if idle_dir is not None and idle_dir.is_dir():
        for state in sorted(idle_dir.glob("state*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else 0):
            name = read(state / "name")
            if name and read(state / "disable") != "1":
                states.append(name)
    idle_governor = read(root / "cpuidle" / "current_governor") or read(root / "cpuidle" / "current_governor_ro")
    if not governors and not states and idle_governor is None:
        return None
    return {"frequency_governors": governors or None, "idle_governor": idle_governor, "idle_states": states or None}


def _memory_bytes() -> int | None:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _vlaperf_version() -> str:
    try:
        import vlaperf

        return str(vlaperf.__version__)
    except Exception:
        pass
    try:
        from importlib.metadata import version

        return version("vlaperf")
    except Exception:
        return "unknown"


def _git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the git checkout holding this package, or (None, None).

    Only counts when the package itself is tracked there: an installed copy in a
    site-packages that happens to sit inside some other repository must not report that
    repository's commit. dirty means tracked files differ from HEAD (untracked files, e.g.
    result folders, do not count).
    """
    pkg_dir = str(Path(__file__).resolve().parent)
    if os.environ.get("VLAPERF_GIT_COMMIT"):
        # A copy of the tree shipped to another machine (a GPU box) may carry no .git, or a
        # .git whose HEAD is not the commit the files came from: the caller says which it is.
        return os.environ["VLAPERF_GIT_COMMIT"], None
    if not _run(["git", "ls-files", "--", "."], cwd=pkg_dir):
        return None, None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=pkg_dir)
    if not commit:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=pkg_dir)
    return commit, (None if status is None else bool(status))


# What the process started with: torch sets TORCHINDUCTOR_CACHE_DIR to its default itself when inductor
# first looks for its cache, and a record should not report that as the user's setting
_ENV_AT_IMPORT = frozenset(os.environ)


def behaviour_env_vars() -> dict[str, str]:
    """Values of the variables that change compile/runtime behaviour; unset ones are absent, and so is
    TORCHINDUCTOR_CACHE_DIR where torch set it to its own default in this process."""
    found = {name: os.environ[name] for name in ENV_VARS if name in os.environ}
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIXES):
            found[name] = os.environ[name]
    if "TORCHINDUCTOR_CACHE_DIR" in found and "TORCHINDUCTOR_CACHE_DIR" not in _ENV_AT_IMPORT:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            if found["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir():
                del found["TORCHINDUCTOR_CACHE_DIR"]
        except (ImportError, OSError):  # importing inductor makes its cache folder, which can fail
            pass
    return found


def _c_compiler(device_type: str) -> str | None:
    # The compiler torch.compile's inductor runs on this device (Triton's C compiler for its launchers on a GPU,
    # a C++ compiler for the kernels on the CPU), found as it finds it; which one is a common cause of "works here,
    # fails there".
    from vlaperf.engine.compile import inductor_compiler

    return inductor_compiler(device_type)


def device_label(device: torch.device | str) -> str:
    """What a table's title calls the device: a CUDA device's GPU name ('NVIDIA H200'; 'cuda' said nothing of which
    card a figure is from), else the device as torch names it ('cpu')."""
    dev = _probe(lambda: torch.device(device))
    if dev is not None and dev.type == "cuda":
        return _probe(lambda: torch.cuda.get_device_name(dev)) or str(dev)
    return str(dev if dev is not None else device)


def require_cuda(script: str, device: str = "cuda") -> None:
    """For the GPU-only scripts of benchmarks/: where `device` is a CUDA device and torch sees no GPU, exit with one
    line naming the script, instead of torch's "Torch not compiled with CUDA enabled" traceback from deep inside it.
    --help still answers."""
    import sys

    if not str(device).startswith("cuda") or torch.cuda.is_available() or {"-h", "--help"} & set(sys.argv[1:]):
        return
    where = "" if device == "cuda" else f" ({device})"
    raise SystemExit(f"{Path(script).name}: needs a CUDA GPU{where}, and torch {torch.__version__} sees none "
                     "(docs/profiling.md says which scripts of benchmarks/ run on a CPU)")


# A bench whose p90 is this many times its median spread too widely to be a quiet machine's: `best` on an H200 spreads
# 1.01x; a 2-core CPU machine running a second process beside the bench gave p90 2101 ms over a median of 77 ms
WIDE_P90_OVER_MEDIAN = 1.5


def spread_note(wall: dict | None, env: dict) -> str | None:
    """What `vlaperf bench` says below its table when the wall-clock samples spread widely (p90 at least
    WIDE_P90_OVER_MEDIAN x the median), with the host's load where the record has it; None otherwise."""
    if not wall or not wall.get("median") or wall["p90"] < WIDE_P90_OVER_MEDIAN * wall["median"]:
        return None
    load, cpus = env.get("load_avg"), env.get("cpus")
    host = f" (1-minute load average {load:g} on {cpus} CPUs, this process included)" if load is not None and cpus else ""
    return (f"the timed calls spread widely: p90 {wall['p90']:.3f} ms is {wall['p90'] / wall['median']:.1f}x the "
            f"median, max {wall['max']:.3f} ms. Something else may be using this machine{host}; time on a quiet one, "
            "and `--processes N` shows how far the figure moves between processes")


def environment_record(device: torch.device | str) -> dict[str, Any]:
    """Everything about this machine and software stack that can move the numbers.

    Never raises: each probe that fails yields None (or "unknown" for vlaperf's version).
    gpu is the name of `device` when it is a CUDA device, else None; gpu_count counts all
    visible CUDA devices; gpu_state is that GPU's clocks, power and temperature as nvidia-smi
    reports them when the record is taken (GPU_STATE_FIELDS), else None. tf32_matmul /
    tf32_cudnn are torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32. cpu is the
    processor's model name, cpu_id its vendor, family, model and stepping (`cpu_id`), cpus the CPUs this process
    may use, cpu_power their frequency governors and idle states (`cpu_power`), memory_bytes the machine's physical
    memory: which host a figure came from. load_avg is the host's 1-minute load average when the record is taken
    (this process's own threads included): beside wide timings, whether something else was running.
    timestamp is UTC ISO 8601.
    """
    dev = _probe(lambda: torch.device(device))
    is_cuda = dev is not None and dev.type == "cuda"
    commit, dirty = _probe(_git_state, (None, None))
    return {
        "device": str(dev) if dev is not None else str(device),
        "gpu": _probe(lambda: torch.cuda.get_device_name(dev)) if is_cuda else None,
        "gpu_count": _probe(torch.cuda.device_count, 0),
        "gpu_state": _probe(lambda: _gpu_state(dev)) if is_cuda else None,
        "driver": _probe(_driver_version),
        "cuda": _probe(lambda: torch.version.cuda),
        "cudnn": _probe(lambda: torch.backends.cudnn.version()),
        "torch": _probe(lambda: torch.__version__),
        "triton": _probe(_triton_version),
        "python": _probe(lambda: f"{platform.python_implementation()} {platform.python_version()}"),
        "platform": _probe(platform.platform),
        "cpu": _probe(_cpu_name),
        "cpu_id": _probe(_cpu_id),
        "cpus": _probe(_usable_cpus),
        "cpu_power": _probe(cpu_power),
        "memory_bytes": _probe(_memory_bytes),
        "load_avg": _probe(lambda: round(os.getloadavg()[0], 2)),
        "vlaperf": _probe(_vlaperf_version, "unknown"),
        "git_commit": commit,
        "git_dirty": dirty,
        "env_vars": _probe(behaviour_env_vars, {}),
        "c_compiler": _probe(lambda: _c_compiler(torch.device(device).type)),
        "matmul_precision": _probe(torch.get_float32_matmul_precision),
        "tf32_matmul": _probe(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "tf32_cudnn": _probe(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "torch_threads": _probe(torch.get_num_threads),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": _probe(socket.gethostname),
    }
