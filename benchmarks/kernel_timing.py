"""Timing for the kernel benchmarks: many calls captured in one CUDA graph, so launch
overhead from Python does not count, only what the GPU spends per call."""

from __future__ import annotations

import torch


def capture(fn, reps: int = 1, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """`fn` run `warmup` times on a side stream (lazy set-up stays out of the capture), then `reps`
    calls of it captured in one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def replay_ms(g: torch.cuda.CUDAGraph) -> float:
    """One replay of `g`, timed with CUDA events, in ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_time_ms(fn, reps: int = 200) -> float:
    """One graph holding `reps` calls of `fn`, replayed 5 times; the fastest replay / reps, in ms."""
    g = capture(fn, reps)
    return min(replay_ms(g) for _ in range(5)) / reps
