"""Why the `graph` row of the cumulative matrix reads 29 ms when every other file reads 32.1-32.8 ms (session 44).

In `vlaperf matrix --variants cumulative` the graph engine is captured after six eager engine variants of the same
shapes have run (each its first call and its equivalence check), and the compiled variants are built after its
capture, before the timed rounds. Everywhere else graph is the first engine built. This probe replays that order in
one process and times graph engines at each point (CUDA events and wall clock, `--iters` calls after `--warmup`):

    A  g1 captured first, nothing eager before it (as bench does)          -> g1
    B  the matrix's eager rows prepared (first call and equivalence check)
    C  g1 again, then g2 captured now (as the matrix captures graph)       -> g1, g2, g1, g2
    D  the matrix's compiled rows prepared (--compiled; a GPU only)
    E  g1 and g2 again, then g3 captured now                               -> g1, g2, g3, best
    F  the first compiled row built once more; g3, g1 and best again       -> g3, g1, best

At each point it records the process-wide switches a kernel choice could read (the preferred BLAS library, cuDNN and
SDPA backend switches, TF32 and reduced-precision flags, the matmul precision, CUBLAS_WORKSPACE_CONFIG) and the
memory allocated; and, on a GPU, after the last timing, the kernels of three calls of each graph engine under the
profiler (per call: name, count, device microseconds), with the kernels that differ between g1 and each later capture.
The matrix's prepared rows stay alive to the end, as the matrix keeps them.

Reading it: g1 slow in A and fast in C means the same captured kernels ran faster (the GPU's state, not a choice);
g1 slow in C and g2 fast means the capture chose differently after the eager calls (the kernel diff names it); both
slow in C and fast in E points at the compiled rows' build (the switches say whether one changed). Session 48 saw
the last: g1 and g2 at 29.2 ms in E with the same kernels as at 32.3 ms in C, and g3, captured in E, at 32.6 ms.
F asks whether a build makes every graph captured before it faster (g3 fast in F), and whether `best` gains too.

    python benchmarks/graph_context_probe.py --workload libero-pi0 --json $OUT/graph_context_probe.json
    python benchmarks/graph_context_probe.py --workload tiny --device cpu   # the same phases without capture (tests)
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from vlaperf.cli import make_engine
from vlaperf.engine.engine import first_call_seconds
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.profile.matrix import cumulative_variants, prepare_variant
from vlaperf.report.schema import SCHEMA, write_result
from vlaperf.timing import environment_record, require_cuda, time_calls
from vlaperf.workloads import get_workload


def switches() -> dict:
    """The process-wide settings a kernel choice could read, as they are now."""
    b = torch.backends
    out = {"cudnn_enabled": b.cudnn.enabled, "cudnn_benchmark": b.cudnn.benchmark,
           "cudnn_allow_tf32": b.cudnn.allow_tf32, "matmul_allow_tf32": b.cuda.matmul.allow_tf32,
           "matmul_bf16_reduced_precision": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
           "matmul_fp16_reduced_precision": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
           "float32_matmul_precision": torch.get_float32_matmul_precision(),
           "sdp_flash": b.cuda.flash_sdp_enabled(), "sdp_mem_efficient": b.cuda.mem_efficient_sdp_enabled(),
           "sdp_math": b.cuda.math_sdp_enabled(), "sdp_cudnn": b.cuda.cudnn_sdp_enabled(),
           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    try:  # a build without CUDA may not answer this one
        out["preferred_blas_library"] = str(b.cuda.preferred_blas_library())
    except (RuntimeError, AttributeError) as e:
        out["preferred_blas_library"] = f"unavailable ({type(e).__name__})"
    return out


def kernels(fn, device: torch.device, calls: int = 3) -> list[dict]:
    """The GPU kernels of `calls` calls of `fn` under the profiler, per call, slowest first (empty on the CPU)."""
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for item in prof.key_averages():
        us = getattr(item, "device_time_total", None)
        us = item.cuda_time_total if us is None else us
        if us > 0:
            rows.append({"name": item.key, "count": item.count / calls, "us": us / calls})
    return sorted(rows, key=lambda r: -r["us"])


def kernel_diff(a: list[dict], b: list[dict], top: int = 20) -> list[dict]:
    """Kernels whose per-call time differs between two kernel lists, the largest differences first; a kernel in one
    list only counts as 0 in the other."""
    ta, tb = {r["name"]: r for r in a}, {r["name"]: r for r in b}
    rows = [{"name": n, "us_a": ta.get(n, {}).get("us", 0.0), "us_b": tb.get(n, {}).get("us", 0.0),
             "count_a": ta.get(n, {}).get("count", 0.0), "count_b": tb.get(n, {}).get("count", 0.0)}
            for n in sorted(set(ta) | set(tb))]
    rows.sort(key=lambda r: -abs(r["us_b"] - r["us_a"]))
    return rows[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=None,
                   help="phases D and E's build of the compiled rows (default: on a GPU only)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    require_cuda(__file__, args.device)
    device = torch.device(args.device)
    w = get_workload(args.workload)
    model = build_model(w.model_config(), device)
    obs, noise = random_observation(w, model.config, device), random_noise(w, model.config, device)
    steps = w.steps
    rows = cumulative_variants(device)
    # The matrix's graph row; on a CPU (no capture) the last exact row stands in, so the phases still run.
    graph_spec = next((s for s in rows if s.endswith("cuda_graph")), None) or rows[-1]
    eager = rows[:rows.index(graph_spec)]
    compiled = rows[rows.index(graph_spec) + 1:] if args.compiled is not False else []

    phases: list[dict] = []
    engines: dict[str, object] = {}
    kernel_lists: dict[str, list[dict]] = {}

    def capture(name: str) -> None:
        engine = make_engine(model, graph_spec)
        first = first_call_seconds(engine, obs, noise, steps)  # the capture, timed as the matrix times it
        engines[name] = engine
        phases.append({"phase": f"capture {name}", "engine": name, "first_call_s": first, "switches": switches()})

    def timed(name: str, point: str, call=None) -> None:
        engine = engines.get(name)
        call = call or (lambda: engine.sample_actions(obs, noise, steps))
        t = time_calls(call, device=device, warmup=args.warmup, iters=args.iters, progress=False, label=name)
        allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        phases.append({"phase": point, "engine": name, "timers": t["timers"], "switches": switches(),
                       "memory_allocated_bytes": allocated})
        e = t["timers"]["cuda_event_ms"]
        print(f"{point:<28} {name}: wall {t['timers']['wall_ms']['median']:.3f} ms"
              + (f", events {e['median']:.3f} ms" if e else ""), flush=True)

    kept = []  # the prepared rows' calls (and so their engines) stay alive to the end, as in the matrix

    def prepare(specs: list[str], point: str) -> None:
        for spec in specs:  # as the matrix prepares its rows: first call, then the equivalence check
            row, call = prepare_variant(model, spec, w, obs, noise, steps)
            if row.get("skipped"):
                raise SystemExit(f"{spec}: {row['skipped']}")
            kept.append(call)
        phases.append({"phase": point, "prepared": specs, "switches": switches()})

    capture("g1")
    timed("g1", "A: before any eager row")
    prepare(eager, "B: the eager rows prepared")
    timed("g1", "C: after the eager rows")
    capture("g2")
    for name in ("g2", "g1", "g2"):
        timed(name, "C: after the eager rows")
    if compiled:
        prepare(compiled, "D: the compiled rows prepared")
        for name in ("g1", "g2"):
            timed(name, "E: after the compiled rows")
        capture("g3")
        timed("g3", "E: after the compiled rows")
        # F (session 48's E: g1 and g2 at 29 ms, g3 captured after the build at 32.6): does a graph captured
        # before a compiled build replay faster after it -- g3 now, and `best` itself, the last row built in D?
        best = kept[-1]
        timed("best", "E: after the compiled rows", best)
        prepare(compiled[:1], "F: the first compiled row built again")
        for name in ("g3", "g1"):
            timed(name, "F: after one more compiled build")
        timed("best", "F: after one more compiled build", best)
    # The kernels last: a graph's kernels are fixed at its capture, and the profiler (CUPTI) once started could
    # change the timings of every point after it.
    for name, engine in engines.items():
        kernel_lists[name] = kernels(lambda: engine.sample_actions(obs, noise, steps), device)

    g1 = engines["g1"]
    result = {"schema": SCHEMA, "command": "graph-context-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": g1.levers.names(), "label": g1.name, "dtype": str(model.dtype).split(".")[-1]},
              "mode": "model", "env": environment_record(device), "warmup": args.warmup, "iters": args.iters,
              "graph_spec": graph_spec, "eager_rows": eager, "compiled_rows": compiled, "phases": phases,
              "kernels": kernel_lists,
              "kernel_diff": {f"g1 -> {n}": kernel_diff(kernel_lists["g1"], kernel_lists[n])
                              for n in ("g2", "g3") if n in kernel_lists}}
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    else:
        print(json.dumps({k: result[k] for k in ("graph_spec", "eager_rows", "compiled_rows")}))


if __name__ == "__main__":
    main()
