"""`cuda_graph`: the whole sample_actions (prefix + every step) as one CUDA graph per input
layout, replayed per call.

A graph is keyed by everything that fixes its shapes and host-side decisions (batch, the
prefix plan, number of steps); a new key captures once (seconds), a known key only copies
the inputs into the graph's static buffers and replays. All graphs share one memory pool.

Stage timing inside a graph (the profiler's breakdown of a graphed call): a graph captured
with `timed=True` holds an event-record node at each stage boundary the captured code marks
(`record_stage`), on timing events created for that capture; every replay records them again,
so the time between two of them is that stage of this replay, read after it ends. It is its
own capture under its own key: the untimed graph of the same call keeps no event nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch
from torch import Tensor


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[Tensor]
    output: Tensor
    capture_s: float
    stage_events: list[tuple[str, torch.cuda.Event]] = field(default_factory=list)  # (stage, event), timed graphs


class GraphCache:
    def __init__(self, warmup_runs: int = 2, keep_graphs: bool = False):
        self.entries: dict[Hashable, CapturedGraph] = {}
        self.warmup_runs = warmup_runs
        # keep each captured cudaGraph_t beside its executable one (torch's keep_graph), so a probe can read its
        # nodes (`graph.raw_cuda_graph()`); off: torch frees it after instantiating
        self.keep_graphs = keep_graphs
        self.pool = None
        self._stage_sink: list[tuple[str, torch.cuda.Event]] | None = None  # set while a timed graph is captured
        # the stage events of the last replay: those of a timed graph, recorded again by that replay; [] after an
        # untimed one
        self.last_stage_events: list[tuple[str, torch.cuda.Event]] = []

    def run(self, key: Hashable, build: Callable[[], Callable[..., Tensor]], inputs: list[Tensor],
            before_capture: Callable[[], None] | None = None, timed: bool = False) -> Tensor:
        """Replay the graph for `key` on `inputs` (captured from `build()` the first time, after
        the warm-up runs and `before_capture()`). Returns a fresh tensor (the graph's output
        buffer is overwritten by the next replay). timed: the graph with an event node at each
        stage boundary (a capture of its own, beside the untimed one); see the module docstring."""
        key = (key, "timed") if timed else key
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._capture(build(), inputs, before_capture, timed)
        # one call for every input (one dispatch from Python, not one per tensor)
        torch._foreach_copy_(entry.static_inputs, inputs, non_blocking=True)
        entry.graph.replay()
        self.last_stage_events = entry.stage_events
        return entry.output.clone()

    def has_shape(self, key: Hashable) -> bool:
        """Whether a graph of `key`, timed or not, was captured (its kernels are compiled then)."""
        return key in self.entries or (key, "timed") in self.entries

    def record_stage(self, name: str) -> None:
        """Called by the captured code where stage `name` starts: during a timed capture, an
        event-record node there; otherwise (warm-up runs, untimed captures) nothing."""
        if self._stage_sink is not None:
            event = torch.cuda.Event(enable_timing=True, external=True)  # external: a node of the graph
            event.record()
            self._stage_sink.append((name, event))

    def _capture(self, fn: Callable[..., Tensor], inputs: list[Tensor],
                 before_capture: Callable[[], None] | None = None, timed: bool = False) -> CapturedGraph:
        start = time.perf_counter()
        static_inputs = [x.clone() for x in inputs]
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # Warm up on a side stream: lazy initialisation (cuBLAS workspaces, autotuning) must
        # not happen inside the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_runs):
                fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        if before_capture is not None:
            before_capture()
        graph = torch.cuda.CUDAGraph(keep_graph=self.keep_graphs)
        stages: list[tuple[str, torch.cuda.Event]] = []
        self._stage_sink = stages if timed else None
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                output = fn(*static_inputs)
        finally:
            self._stage_sink = None
        if self.keep_graphs:
            graph.instantiate()  # otherwise the first replay would
        torch.cuda.synchronize()
        return CapturedGraph(graph, static_inputs, output, time.perf_counter() - start, stages)

    @property
    def captures(self) -> int:
        return len(self.entries)
