"""`cuda_graph`: the whole sample_actions (prefix + every step) as one CUDA graph per input
layout, replayed per call.

A graph is keyed by everything that fixes its shapes and host-side decisions (batch, the
prefix plan, number of steps); a new key captures once (seconds), a known key only copies
the inputs into the graph's static buffers and replays. All graphs share one memory pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Hashable

import torch
from torch import Tensor


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[Tensor]
    output: Tensor
    capture_s: float


class GraphCache:
    def __init__(self, warmup_runs: int = 2, keep_graphs: bool = False):
        self.entries: dict[Hashable, CapturedGraph] = {}
        self.warmup_runs = warmup_runs
        # keep each captured cudaGraph_t beside its executable one (torch's keep_graph), so a probe can read its
        # nodes (`graph.raw_cuda_graph()`); off: torch frees it after instantiating
        self.keep_graphs = keep_graphs
        self.pool = None

    def run(self, key: Hashable, build: Callable[[], Callable[..., Tensor]], inputs: list[Tensor],
            before_capture: Callable[[], None] | None = None) -> Tensor:
        """Replay the graph for `key` on `inputs` (captured from `build()` the first time, after
        the warm-up runs and `before_capture()`). Returns a fresh tensor (the graph's output
        buffer is overwritten by the next replay)."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._capture(build(), inputs, before_capture)
        # one call for every input (one dispatch from Python, not one per tensor)
        torch._foreach_copy_(entry.static_inputs, inputs, non_blocking=True)
        entry.graph.replay()
        return entry.output.clone()

    def _capture(self, fn: Callable[..., Tensor], inputs: list[Tensor],
                 before_capture: Callable[[], None] | None = None) -> CapturedGraph:
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
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn(*static_inputs)
        if self.keep_graphs:
            graph.instantiate()  # otherwise the first replay would
        torch.cuda.synchronize()
        return CapturedGraph(graph, static_inputs, output, time.perf_counter() - start)

    @property
    def captures(self) -> int:
        return len(self.entries)
