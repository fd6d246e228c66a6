"""How much of a replayed call the GPU spends waiting for the host: the engine's Python before
the replay, the input copies and the graph's launch, on this machine.

    python benchmarks/launch_probe.py --workload libero-pi0 --levers best --json $OUT/launch_probe.json

Session 21's kernel sequences (under the profiler) had 210-345 us between the first input copy
and the graph's first kernel; the profiler slows launches, so this probe times without it:

- the call as the bench times it (synced, GPU idle before), and its host side: the time until
  `sample_actions` returns, the wait after;
- the same call's GPU span between two events, once with the GPU idle at the start (the span then
  holds every host delay the GPU waits for) and once queued behind a 2 ms sleep kernel (the host
  runs ahead, so the span is the GPU's work alone). Their difference is the host latency a call
  exposes;
- the pieces of `GraphCache.run` alone: the input copies, `graph.replay()`, the output's clone;
- graphs of N one-element kernels (N = 1 .. 2000) replayed the same two ways: whether a graph's
  launch latency grows with its node count on this driver (the engine's graph has ~600 nodes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from engine_ab import timed  # benchmarks/ (the script's folder is on sys.path): one synced call, ms

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record
from vlaperf.workloads import get_workload


def sleep_cycles_per_ms() -> float:
    """`torch.cuda._sleep`'s cycles per millisecond at the present clock (one timed sleep)."""
    torch.cuda._sleep(1_000_000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    torch.cuda.synchronize()
    return 20_000_000 / a.elapsed_time(b)


def gpu_span_ms(fn, rounds: int, hide_host_ms: float, cycles_per_ms: float) -> float:
    """Median ms between an event before `fn` and one after it. With `hide_host_ms`, a sleep
    kernel that long runs first, so the host has queued all of `fn` before the first event
    fires; without, the GPU is idle at the start and waits for the host."""
    spans = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hide_host_ms:
            torch.cuda._sleep(int(hide_host_ms * cycles_per_ms))
        a.record()
        fn()
        b.record()
        b.synchronize()
        spans.append(a.elapsed_time(b))
    return statistics.median(spans)


def host_ms(fn, rounds: int) -> float:
    """Median host ms until `fn` returns (GPU idle before; synced after, outside the time)."""
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(out)


def exposure(fn, rounds: int, cycles_per_ms: float) -> dict:
    idle = gpu_span_ms(fn, rounds, 0.0, cycles_per_ms)
    hidden = gpu_span_ms(fn, rounds, 2.0, cycles_per_ms)
    return {"gpu_span_idle_start_ms": idle, "gpu_span_host_hidden_ms": hidden, "exposed_host_ms": idle - hidden,
            "host_return_ms": host_ms(fn, rounds), "wall_synced_ms": statistics.median(timed(fn) for _ in range(rounds))}


def synthetic_graphs(rounds: int, cycles_per_ms: float, sizes=(1, 10, 100, 300, 600, 1000, 2000)) -> dict:
    x = torch.zeros(1, device="cuda")
    out = {}
    for n in sizes:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        g.replay()
        torch.cuda.synchronize()
        out[str(n)] = exposure(g.replay, rounds, cycles_per_ms)
        del g
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.preset, "cuda")
    engine = Engine(model, args.levers)
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    for _ in range(10):
        engine.sample_actions(obs, noise, w.steps)
    torch.cuda.synchronize()
    cycles = sleep_cycles_per_ms()
    call = lambda: engine.sample_actions(obs, noise, w.steps)  # noqa: E731
    result_call = exposure(call, args.rounds, cycles)
    pieces: dict = {}
    if engine.graphs is not None and len(engine.graphs.entries) == 1:
        entry = next(iter(engine.graphs.entries.values()))
        inputs = [obs.images, obs.image_mask, obs.tokens, obs.token_mask, obs.state, noise]
        copies = lambda: torch._foreach_copy_(entry.static_inputs, inputs, non_blocking=True)  # noqa: E731
        pieces = {"input_copies": exposure(copies, args.rounds, cycles),
                  "replay_alone": exposure(entry.graph.replay, args.rounds, cycles),
                  "copies_then_replay": exposure(lambda: (copies(), entry.graph.replay()), args.rounds, cycles),
                  "output_clone_host_ms": host_ms(entry.output.clone, args.rounds)}
    synthetic = synthetic_graphs(args.rounds // 2, cycles)
    result = {"schema": SCHEMA, "command": "launch-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record("cuda"), "rounds": args.rounds, "sleep_cycles_per_ms": cycles,
              "call": result_call, "pieces": pieces, "synthetic_graphs": synthetic}
    print(json.dumps({"call": result_call, "pieces": pieces}, indent=1))
    for n, r in synthetic.items():
        print(f"graph of {n:>5} kernels: idle {r['gpu_span_idle_start_ms']:.4f} hidden {r['gpu_span_host_hidden_ms']:.4f} "
              f"exposed {r['exposed_host_ms']:.4f} host return {r['host_return_ms']:.4f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
