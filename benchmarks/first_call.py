"""Where a fresh process's first call goes: torch.compile's phases, each Triton kernel compiled in
the process itself, and what is left (tracing glue, the CUDA-graph capture).

    python benchmarks/first_call.py --workload libero-pi0 --compile-cache /tmp/cc --json $OUT/first_call.json

Run it in a new process for each measurement: with an empty --compile-cache directory it times a
cold start, with the directory an earlier run filled, a restart (docs/serving.md). The file
records, besides the first call's wall time:
  compile_phases   (and compile_phases_each, per compiled graph) torch's own timers (torch._dynamo.utils.compilation_time_metrics): seconds
                   per timed function, summed over the compiled graphs. They nest (Dynamo's
                   `_compile.compile_inner` contains the backend's `compile_fx_inner`, which
                   contains the lowering and the wait for inductor's kernel compiles), so they
                   are not to be added up.
  triton_compiles  every Triton compile that ran in this process (our kernels compile when they
                   first launch; inductor compiles its own in worker processes, which this does not
                   see, except when it falls back to compiling in-process): kernel name, seconds
  later_calls_ms   the next calls, synced each, for the steady state
  cache_files_before  files in the cache directories when the process started (0: a cold start)
  precompile_error what stopped the engine's kernel-compile thread (Engine._precompile_kernels), if anything
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict

import torch

from vlaperf.engine.compile import use_compile_cache
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda


def watch_triton_compiles() -> list[dict]:
    """Wrap triton.compile so that each compile in this process is timed. JIT kernels take the
    package attribute when they first run, so this must come before any kernel launches."""
    import triton.compiler
    import triton.compiler.compiler as tcc

    real = tcc.compile
    log: list[dict] = []

    def timed_compile(src, *args, **kwargs):
        start = time.perf_counter()
        try:
            return real(src, *args, **kwargs)
        finally:
            name = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", None) or "?"
            log.append({"kernel": str(name), "s": time.perf_counter() - start})

    tcc.compile = triton.compiler.compile = timed_compile
    return log


def compile_phase_seconds() -> dict[str, list[float]]:
    """torch's timers: each timed function's seconds, one entry per time it ran (per compiled graph)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {name: list(values) for name, values in compilation_time_metrics.items()}


def summarize_triton(log: list[dict]) -> list[dict]:
    by_name: dict[str, list[float]] = defaultdict(list)
    for entry in log:
        by_name[entry["kernel"]].append(entry["s"])
    rows = [{"kernel": k, "compiles": len(v), "s": sum(v)} for k, v in by_name.items()]
    return sorted(rows, key=lambda r: -r["s"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--compile-cache", required=True, help="the caches' directory (empty: a cold start)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--later", type=int, default=20, help="calls timed after the first")
    p.add_argument("--no-inductor-warmup", action="store_true",
                   help="do not warm inductor up during the engine's construction (compile.start_inductor_warmup)")
    p.add_argument("--compile-threads", type=int, default=0,
                   help="threads for the kernel-compile thread's recorded launches (default: the engine's)")
    p.add_argument("--compile-workers", type=int, default=None,
                   help="the engine's compile worker processes (engine.COMPILE_WORKERS; 0: the thread alone)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    require_cuda(__file__, args.device)
    cache_env = use_compile_cache(args.compile_cache)
    cache_files_before = sum(len(files) for d in cache_env.values() for _, _, files in os.walk(d))
    triton_log = watch_triton_compiles()
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    w = get_workload(args.workload)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    model = build_model(w.model_config(), args.device)
    obs, noise = random_observation(w, model.config, args.device), random_noise(w, model.config, args.device)
    sync()
    t1 = time.perf_counter()
    if args.compile_threads:
        import functools

        import vlaperf.engine.kernels.launch as launch_module

        real = launch_module.compile_recorded
        launch_module.compile_recorded = lambda launches, first=(), workers=1: real(launches, first, args.compile_threads)
        functools.update_wrapper(launch_module.compile_recorded, real)
    if args.compile_workers is not None:
        import vlaperf.engine.engine as engine_module

        engine_module.COMPILE_WORKERS = args.compile_workers
    if args.no_inductor_warmup:
        import vlaperf.engine.compile as compile_module

        compile_module.start_inductor_warmup = lambda: None
    engine = Engine(model, args.levers)
    t2 = time.perf_counter()
    engine.sample_actions(obs, noise, w.steps)
    sync()
    first = time.perf_counter() - t2
    later = []
    for _ in range(args.later):
        start = time.perf_counter()
        engine.sample_actions(obs, noise, w.steps)
        sync()
        later.append((time.perf_counter() - start) * 1e3)
    triton_rows = summarize_triton(triton_log)
    phases = compile_phase_seconds()
    result = {"schema": SCHEMA, "command": "first-call", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record(args.device), "compile_cache": cache_env, "cache_files_before": cache_files_before,
              "model_build_s": t1 - t0, "engine_init_s": t2 - t1, "first_call_s": first,
              "compile_phases": {k: sum(v) for k, v in phases.items()}, "compile_phases_each": phases,
              "triton_compiles": triton_rows,
              "triton_compile_s": sum(r["s"] for r in triton_rows),
              "precompile_error": None if engine.precompile_error is None else repr(engine.precompile_error),
              "later_calls_ms": later, "later_median_ms": statistics.median(later) if later else None,
              "inductor_warmup": not args.no_inductor_warmup, "compile_threads": args.compile_threads or None,
              "compile_workers": args.compile_workers, "compile_worker_seconds": engine.compile_worker_seconds}
    print(f"first call {first:.2f} s (model {t1 - t0:.1f} s, engine {t2 - t1:.1f} s); "
          f"in-process Triton compiles {result['triton_compile_s']:.2f} s; later median {result['later_median_ms']:.2f} ms")
    for name, s in sorted(result["compile_phases"].items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {s:8.2f} s  {name}")
    for row in triton_rows[:12]:
        print(f"  {row['s']:8.2f} s  triton {row['kernel']} x{row['compiles']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
