"""How much of a replayed call the GPU spends waiting for the host: the engine's Python before
the replay, the input copies and the graph's launch, on this machine.

    python benchmarks/launch_probe.py --workload libero-pi0 --levers best --json $OUT/launch_probe.json
    python benchmarks/launch_probe.py --workload libero-pi05 --call-only   # the call and its pieces only

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
  launch latency grows with its node count on this driver (the engine's graph has ~600 nodes);
- graphs of 600 kernels of the kinds the engine's graph holds (memset nodes among them, Triton
  kernels, Triton kernels with PDL): which kind makes its launch slow (`graph_kinds`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton
import triton.language as tl
from engine_ab import sleep_cycles_per_ms, timed  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine import Engine
from vlaperf.engine.kernels.launch import pdl_wait
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda
from vlaperf.workloads import get_workload


def cudart():
    """The CUDA runtime library through ctypes (the one torch loaded), or None."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


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


NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty", 6: "event wait",
              7: "event record", 8: "semaphore signal", 9: "semaphore wait", 10: "mem alloc", 11: "mem free",
              12: "conditional"}


def graph_census(graph: torch.cuda.CUDAGraph) -> dict | None:
    """The captured graph's nodes by type and its edge count (CUDA runtime, through ctypes); a
    straight line of N nodes has N - 1 edges. None where the runtime or the handle is missing."""
    import ctypes

    raw = getattr(graph, "raw_cuda_graph", None)
    if raw is None:
        return None
    lib = cudart()
    if lib is None:
        return None
    try:
        handle = ctypes.c_void_p(raw())
        n = ctypes.c_size_t(0)
        if lib.cudaGraphGetNodes(handle, None, ctypes.byref(n)):
            return None
        nodes = (ctypes.c_void_p * n.value)()
        lib.cudaGraphGetNodes(handle, nodes, ctypes.byref(n))
        counts: dict[str, int] = {}
        for node in nodes:
            t = ctypes.c_int(-1)
            lib.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
            counts[NODE_TYPES.get(t.value, str(t.value))] = counts.get(NODE_TYPES.get(t.value, str(t.value)), 0) + 1
        version = ctypes.c_int(0)
        lib.cudaRuntimeGetVersion(ctypes.byref(version))
        out = {"nodes": n.value, "by_type": counts, "runtime_version": version.value}
        if version.value >= 13000:  # CUDA 13: (graph, from, to, edgeData, numEdges); edgeData is 8 bytes, its type at 2
            m = ctypes.c_size_t(0)
            if not lib.cudaGraphGetEdges(handle, None, None, None, ctypes.byref(m)):
                src, dst = (ctypes.c_void_p * m.value)(), (ctypes.c_void_p * m.value)()
                data = (ctypes.c_ubyte * (8 * m.value))()
                lib.cudaGraphGetEdges(handle, src, dst, data, ctypes.byref(m))
                kinds: dict[str, int] = {}
                for i in range(m.value):
                    kind = {0: "default", 1: "programmatic"}.get(data[8 * i + 2], str(data[8 * i + 2]))
                    kinds[kind] = kinds.get(kind, 0) + 1
                fan_out = max((list(src).count(x) for x in set(src)), default=0)
                fan_in = max((list(dst).count(x) for x in set(dst)), default=0)
                out.update(edges=m.value, edges_by_type=kinds, max_fan_out=fan_out, max_fan_in=fan_in,
                           straight_line=m.value == n.value - 1 and fan_out <= 1 and fan_in <= 1)
        return out
    except Exception as e:  # a probe: report, never fail the run
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        # a refused call leaves its error as the runtime's last error, which torch's next launch check would
        # report as its own (session 22's part c): take it here and say so
        last = lib.cudaGetLastError()
        if last:
            print(f"graph_census: the CUDA runtime reported error {last} during the census")


def replay_experiments(entry, inputs: list[torch.Tensor], rounds: int, cycles: float) -> dict:
    """What makes the GPU wait for the whole launch when work precedes the replay: a kernel, one
    small memcpy, the six copies as one multi-tensor kernel (same bytes, uint8 views), two replays."""
    x = torch.zeros(1, device="cuda")
    small_src, small_dst = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    src = [t.contiguous().view(-1).view(torch.uint8) for t in inputs]
    dst = [t.view(-1).view(torch.uint8) for t in entry.static_inputs]
    replay = entry.graph.replay
    return {"kernel_then_replay": exposure(lambda: (x.add_(1), replay()), rounds, cycles),
            "small_memcpy_then_replay": exposure(lambda: (small_dst.copy_(small_src), replay()), rounds, cycles),
            "copies_as_one_kernel_then_replay": exposure(lambda: (torch._foreach_copy_(dst, src), replay()), rounds, cycles),
            "replay_twice": exposure(lambda: (replay(), replay()), rounds, cycles)}


def synthetic_graphs(rounds: int, cycles_per_ms: float, sizes=(1, 10, 100, 300, 600, 1000, 2000)) -> tuple[dict, dict]:
    x = torch.zeros(1, device="cuda")
    out, censuses = {}, {}
    for n in sizes:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        g.instantiate()
        g.replay()
        torch.cuda.synchronize()
        out[str(n)] = exposure(g.replay, rounds, cycles_per_ms)
        censuses[str(n)] = graph_census(g)
        del g
    return out, censuses


@triton.jit
def _bump_kernel(x_ptr, USE_PDL: tl.constexpr):
    """x[0] += 1, after waiting for the kernel before it where launched with PDL (as ours do)."""
    pdl_wait(USE_PDL)
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


def graph_kinds(rounds: int, cycles_per_ms: float, n: int = 600, memset_every: int = 13) -> tuple[dict, dict]:
    """Graphs of `n` one-element kernels of the kinds the engine's graph holds, each replayed as
    `exposure` times it, to say which kind keeps a straight-line graph off the driver's
    constant-time launch (the engine's: 571 kernels, 44 memsets, 183 programmatic edges, launched
    in 0.09-0.20 ms against 0.008-0.02 for plain kernels): torch's kernels; the same with a memset
    node every `memset_every` kernels (cudaMemsetAsync, as cuBLAS and cuDNN add them); a Triton
    kernel without PDL; the same kernel launched with PDL (every edge programmatic)."""
    import ctypes

    x = torch.zeros(1, device="cuda")
    scratch = torch.zeros(1024, device="cuda")
    lib = cudart()

    def memset():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        lib.cudaMemsetAsync(ctypes.c_void_p(scratch.data_ptr()), 0, ctypes.c_size_t(scratch.numel() * 4), stream)

    def torch_kernels(with_memsets: bool):
        def body():
            for i in range(n):
                x.add_(1)
                if with_memsets and i % memset_every == 0:
                    memset()
        return body

    def triton_kernels(pdl: bool):
        def body():
            for _ in range(n):
                _bump_kernel[(1,)](x, USE_PDL=pdl, launch_pdl=pdl)
        return body

    kinds = {"torch_kernels": torch_kernels(False), "triton_kernels": triton_kernels(False),
             "triton_kernels_pdl": triton_kernels(True)}
    if lib is not None:
        kinds["torch_kernels_with_memsets"] = torch_kernels(True)
    out, censuses = {}, {}
    for name, body in kinds.items():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                body()  # compiles the Triton kernel outside the capture
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(g):
                body()
            g.instantiate()
            g.replay()
            torch.cuda.synchronize()
            out[name] = exposure(g.replay, rounds, cycles_per_ms)
            censuses[name] = graph_census(g)
            del g
        except Exception as e:  # a probe: one kind failing must not lose the others
            censuses[name] = {"error": f"{type(e).__name__}: {e}"}
            if lib is not None:
                lib.cudaGetLastError()
    return out, censuses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--without-inductor-pdl", action="store_true",
                   help="also build the engine without inductor's PDL and time its call and replay")
    p.add_argument("--call-only", action="store_true",
                   help="only the engine's call and its pieces: no synthetic graphs (the driver's part, measured once)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    engine = Engine(model, args.levers)
    if engine.graphs is not None:
        engine.graphs.keep_graphs = True  # for the census of its nodes (graph_census)
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
                  "output_clone_host_ms": host_ms(entry.output.clone, args.rounds),
                  "graph": graph_census(entry.graph)}
        pieces.update(replay_experiments(entry, inputs, args.rounds, cycles))
    if args.without_inductor_pdl:  # the same call from an engine whose inductor kernels have no PDL
        from vlaperf.engine import compile as compile_mod

        torch._dynamo.reset()
        compile_mod.INDUCTOR_PDL = False
        plain = Engine(model, args.levers)
        plain.graphs.keep_graphs = True
        for _ in range(10):
            plain.sample_actions(obs, noise, w.steps)
        entry = next(iter(plain.graphs.entries.values()))
        pieces["without_inductor_pdl"] = {
            "call": exposure(lambda: plain.sample_actions(obs, noise, w.steps), args.rounds, cycles),
            "replay_alone": exposure(entry.graph.replay, args.rounds, cycles), "graph": graph_census(entry.graph)}
        compile_mod.INDUCTOR_PDL = True
    synthetic, synthetic_census, kinds, kinds_census = {}, {}, {}, {}
    if not args.call_only:
        synthetic, synthetic_census = synthetic_graphs(args.rounds // 2, cycles)
        kinds, kinds_census = graph_kinds(args.rounds // 2, cycles)
    result = {"schema": SCHEMA, "command": "launch-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record("cuda"), "rounds": args.rounds, "sleep_cycles_per_ms": cycles,
              "call": result_call, "pieces": pieces, "synthetic_graphs": synthetic,
              "synthetic_census": synthetic_census, "graph_kinds": kinds, "graph_kinds_census": kinds_census}
    print(json.dumps({"call": result_call, "pieces": pieces, "synthetic_census_600": synthetic_census.get("600")},
                     indent=1, default=str))
    for name, r in kinds.items():
        print(f"600 {name:>28}: exposed {r['exposed_host_ms']:.4f} host return {r['host_return_ms']:.4f} ms; "
              f"{kinds_census.get(name)}")
    for n, r in synthetic.items():
        print(f"graph of {n:>5} kernels: idle {r['gpu_span_idle_start_ms']:.4f} hidden {r['gpu_span_host_hidden_ms']:.4f} "
              f"exposed {r['exposed_host_ms']:.4f} host return {r['host_return_ms']:.4f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
