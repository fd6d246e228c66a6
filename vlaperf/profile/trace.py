"""`trace(fn, path)`: a torch.profiler trace of policy calls, for chrome://tracing or Perfetto.

Stage markers show up in the trace: a StageRecorder opens a record_function range per
stage while a profiler is active (and NVTX ranges on CUDA, for Nsight Systems), so

    rec = StageRecorder(device)
    trace(lambda: run_one_call_with(rec), "call.json")

gives a timeline with the kernels under named stages. Open the file at
https://ui.perfetto.dev (works offline once loaded) or chrome://tracing.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def trace(fn: Callable[[], Any], path: str | Path, *, device: torch.device | str | None = None, warmup: int = 1,
          calls: int = 1, record_shapes: bool = False, with_stack: bool = False) -> dict[str, Any]:
    """Run `fn` `warmup` times untraced, then `calls` times under torch.profiler, and write a
    Chrome/Perfetto JSON trace to `path`. Each traced call is wrapped in a "policy_call_<i>"
    range. Returns {"path", "events", "stages": names of user ranges found in the trace}."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    # acc_events: one cycle either way; without it torch 2.11 warns at the start that events are cleared each cycle
    extra = {"acc_events": True} if "acc_events" in inspect.signature(profile.__init__).parameters else {}
    with without_profiler_log_lines(), profile(activities=activities, record_shapes=record_shapes,
                                                with_stack=with_stack, **extra) as prof:
        for i in range(calls):
            with record_function(f"policy_call_{i}"):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    events, stages = 0, []
    try:
        data = json.loads(path.read_text())
        evs = data.get("traceEvents", []) if isinstance(data, dict) else data
        events = len(evs)
        seen = {}
        for e in evs:
            if e.get("cat") == "user_annotation" and not str(e.get("name", "")).startswith("policy_call_"):
                seen.setdefault(e["name"], None)
        stages = list(seen)
    except (OSError, ValueError):
        pass
    return {"path": str(path), "events": events, "stages": stages}


# What kineto writes to stderr itself at the profiler's start and stop (torch 2.13: "USDT:<date> <time>
# <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start"; older versions "STAGE:... Completed Stage"):
# notices for its own tracing hooks, in the middle of the command's output, that no environment variable turns off.
_KINETO_LINE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d \S+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def without_profiler_log_lines():
    """Inside the block, what goes to file descriptor 2 is held in a temporary file; afterwards every line of it
    but kineto's own notices goes back to descriptor 2 as it came (warnings of the traced call included)."""
    fd = 2
    try:
        saved = os.dup(fd)
    except OSError:  # no descriptor 2 (a daemon with it closed): nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not _KINETO_LINE.match(line.decode(errors="replace"))]
            if kept:
                os.write(fd, b"".join(kept))
