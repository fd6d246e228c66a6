"""Timing for the kernel benchmarks: many calls captured in one CUDA graph, so launch
overhead from Python does not count, only what the GPU spends per call."""

from __future__ import annotations

import torch


def graph_time_ms(fn, reps: int = 200) -> float:
    """One graph holding `reps` calls of `fn`, replayed 5 times; the fastest replay / reps, in ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return min(times)
