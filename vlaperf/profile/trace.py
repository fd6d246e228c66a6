"""`trace(fn, path)`: a torch.profiler trace of policy calls, for chrome://tracing or Perfetto.

Stage markers show up in the trace: a StageRecorder opens a record_function range per
stage while a profiler is active (and NVTX ranges on CUDA, for Nsight Systems), so

    rec = StageRecorder(device)
    trace(lambda: run_one_call_with(rec), "call.json")

gives a timeline with the kernels under named stages. Open the file at
https://ui.perfetto.dev (works offline once loaded) or chrome://tracing.
"""

from __future__ import annotations

import json
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
    with profile(activities=activities, record_shapes=record_shapes, with_stack=with_stack) as prof:
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
