"""`vlaperf matrix --ray`: the variants of a matrix (of one or several workloads) spread over
the GPUs of a Ray cluster, one Ray task per variant on a whole GPU (num_gpus=1; num_cpus on
the CPU), merged into one `vlaperf.result/1` matrix file per workload.

Each task runs in a fresh worker process (max_calls=1) and does what `vlaperf matrix` does for
one variant: builds the model (same seed everywhere), builds the engine, times its first call,
checks equivalence against the reference, then times the variant and the reference
**interleaved in that same process on that same GPU** (vlaperf.timing.interleaved). So every
ratio is between two figures measured on one GPU: tasks on different GPUs (or nodes) are never
divided by each other. Each row records the GPU it ran on (Ray node id, host, GPU name and
UUID, the GPU ids Ray gave it) and carries its own reference figures under `reference`.

The `reference` row of the merged table is the reference as timed in the first variant's task
(its ratio is 1); a matrix of the reference alone runs one task for it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any


def add_matrix_arguments(p: argparse.ArgumentParser) -> None:
    """The Ray options of `vlaperf matrix` (vlaperf.cli registers them on the matrix parser)."""
    from vlaperf.cli import positive_float

    g = p.add_argument_group("Ray (pip install 'vlaperf[ray]'; docs/scale-out.md)")
    g.add_argument("--ray", action="store_true",
                   help="spread the variants over a Ray cluster, one task per variant on a whole GPU; --workload may "
                        "then be a comma list")
    g.add_argument("--ray-address", default=None,
                   help="'auto', 'HOST:6379' or 'ray://HOST:10001' (default: $RAY_ADDRESS if set, else a private local Ray on "
                        "127.0.0.1)")
    g.add_argument("--ray-cpus-per-task", type=positive_float, default=None,
                   help="CPUs reserved per task (the only resource on the CPU; GPU tasks also take one whole GPU; "
                        "default: 1)")


# ----------------------------------------------------------------------------- one task


def device_record(device: Any = None) -> dict:
    """Where this process runs: Ray node, host, the GPU Ray gave it (name and UUID). Every record has
    the same keys; a CPU task's GPU fields are None, and the Ray fields outside Ray (a direct call)."""
    rec: dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid(),
                           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "node_id": None, "node_ip": None, "ray_gpu_ids": [], "device": None,
                           "gpu_name": None, "gpu_uuid": None}
    try:
        import ray

        if ray.is_initialized():  # else asking would start a private local Ray just to name its node
            ctx = ray.get_runtime_context()
            rec["node_id"] = ctx.get_node_id()
            rec["node_ip"] = ray.util.get_node_ip_address()
            rec["ray_gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        pass
    try:
        import torch

        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            rec["gpu_name"] = props.name
            rec["gpu_uuid"] = str(getattr(props, "uuid", "")) or None
        rec["device"] = str(dev) if dev is not None else None
    except Exception:
        pass
    return rec




def run_variant(task: dict) -> dict:
    """Runs inside a Ray task (or directly, in tests): one variant and its local reference.
    Returns a matrix row plus `reference` (the reference timed interleaved with it), `device`
    (where it ran) and `env` (that process's environment record)."""
    import torch

    from vlaperf.cli import setup
    from vlaperf.profile.matrix import merge_peak, prepare_variant
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.timing import environment_record, interleaved

    torch.set_grad_enabled(False)
    t_start = time.perf_counter()
    spec = task["variant"]
    args = argparse.Namespace(workload=task["workload"], device=task.get("device"), dtype=task.get("dtype"),
                              steps=task.get("steps"), batch=task.get("batch"), seed=int(task.get("seed", 0)),
                              checkpoint=task.get("checkpoint"), action_horizon=task.get("action_horizon"),
                              compile_cache=task.get("compile_cache"))
    _, workload, model, device = setup(args)
    row: dict[str, Any] = {"variant": spec, "levers": [], "workload": workload.id,
                           "dtype": str(model.dtype).replace("torch.", ""),
                           "device": device_record(device), "env": environment_record(device)}
    seed = int(task.get("seed", 0))
    obs = random_observation(workload, model.config, device, seed=seed)
    noise = random_noise(workload, model.config, device, seed=seed)
    steps, mode = workload.steps, task.get("mode", "model")
    # the reference's row first: its first call is the task's first (the variant's check then runs the reference
    # model, and the rounds' warm-up would find it warm), with the peak over it, as in the local matrix
    reference, ref_fn = prepare_variant(model, "reference", workload, obs, noise, steps, mode, seed)
    fns = {"reference": ref_fn}
    prepared, fn = prepare_variant(model, spec, workload, obs, noise, steps, mode, seed)
    row.update(prepared)
    if fn is None:
        return row
    fns[spec] = fn
    timing = interleaved(fns, device=device, warmup=int(task["warmup"]), iters=int(task["iters"]),
                         baseline="reference", progress=False)
    v = timing["variants"][spec]
    row.update({k: v[k] for k in ("timers", "warmup_s")})
    merge_peak(row, v)
    row["ratio"] = timing["ratios"][spec]
    ref = timing["variants"]["reference"]
    merge_peak(reference, ref)
    row["reference"] = {"timers": ref["timers"], "first_call_s": reference["first_call_s"], "warmup_s": ref["warmup_s"],
                        "peak_memory_bytes": reference["peak_memory_bytes"], "ratio": timing["ratios"]["reference"]}
    row["task_s"] = time.perf_counter() - t_start
    return row


# ----------------------------------------------------------------------------- driver


def ray_matrix(workload_ids: list[str], variants: str, *, device: str | None = None, dtype: str | None = None,
               steps: int | None = None, batch: int | None = None, seed: int = 0, checkpoint: str | None = None,
               action_horizon: int | None = None, warmup: int = 10, iters: int = 50, cpus_per_task: float = 1.0,
               compile_cache: str | None = None, mode: str = "model", log=print) -> list[dict]:
    """One merged matrix result (vlaperf.result/1) per workload. Needs ray.init() first.

    `device`: "cuda" (each task takes one whole GPU) or "cpu"; default cuda when the cluster
    has GPUs. `variants` as `vlaperf matrix --variants`; `mode` as its --mode ("model" or "policy").
    `compile_cache`: --compile-cache, applied in each task
    (the folder must be writable where the tasks run)."""
    import ray

    from vlaperf.models.pi0 import device_and_dtype
    from vlaperf.profile.matrix import PEAK_MEMORY_OVER, check_variants, parse_variants
    from vlaperf.report.schema import SCHEMA
    from vlaperf.workloads import get_workload

    check_variants(variants)  # a typo fails here, before the cluster is asked for anything
    if mode not in ("model", "policy"):
        raise ValueError(f"mode: expected 'model' or 'policy', got {mode!r}")
    gpus = int(ray.cluster_resources().get("GPU", 0))
    device = device or ("cuda" if gpus >= 1 else "cpu")
    on_gpu = device.startswith("cuda")
    if on_gpu and gpus < 1:
        raise RuntimeError("device cuda asked for, but the Ray cluster has no GPU")
    # resolved for the dtype the tasks build their models in, as their engines resolve `best` (a float32 model's has
    # no kernels): the cumulative table and the check for a variant given twice, before any task is planned
    spec_device, spec_dtype = device_and_dtype("cuda" if on_gpu else "cpu", dtype)
    specs = parse_variants(variants, spec_device, spec_dtype)
    # max_calls=1: a fresh worker process per task (the GPU memory, compiled code and allocator
    # state of one variant never meet the next one's).
    options: dict[str, Any] = {"num_cpus": cpus_per_task, "num_gpus": 1 if on_gpu else 0, "max_calls": 1,
                               "max_retries": 1}
    remote = ray.remote(**options)(run_variant)

    plan = []  # (workload id, variant, object ref)
    for wid in workload_ids:
        timed = [s for s in specs if s != "reference"] or ["reference"]
        for spec in timed:
            task = {"workload": wid, "variant": spec, "device": "cuda" if on_gpu else device, "dtype": dtype,
                    "steps": steps, "batch": batch, "action_horizon": action_horizon, "seed": seed, "checkpoint": checkpoint, "warmup": warmup,
                    "iters": iters, "compile_cache": compile_cache, "mode": mode}
            plan.append((wid, spec, remote.remote(task)))
    log(f"vlaperf matrix --ray: {len(plan)} task(s) ({len(workload_ids)} workload(s)) on "
        f"{'one GPU each' if on_gpu else f'{cpus_per_task:g} CPU(s) each'}; cluster: "
        f"{int(ray.cluster_resources().get('CPU', 0))} CPUs, {gpus} GPUs, {len(ray.nodes())} node(s)")
    rows: dict[Any, dict] = {}
    pending = {ref: (wid, spec) for wid, spec, ref in plan}
    t0 = time.perf_counter()
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            wid, spec = pending.pop(ref)
            try:
                row = ray.get(ref)
            except Exception as e:  # the task itself failed: reported, not timed
                msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                row = {"variant": spec, "levers": [], "workload": wid, "skipped": f"task failed: {msg}"}
            rows[ref] = row
            where = row.get("device") or {}
            log(f"  [{time.perf_counter() - t0:6.1f} s] {wid} {spec}: "
                + (row["skipped"] if "skipped" in row else
                   f"{row['ratio']['wall_ms']['speedup']:.2f}x vs the reference timed beside it")
                + f"  ({where.get('gpu_name') or where.get('device', '?')} {where.get('hostname', '')})")

    results = []
    for wid in workload_ids:
        base = get_workload(wid)
        workload = base.with_overrides(batch=batch, steps=steps, horizon=action_horizon)
        wrows = [rows[ref] for w, _, ref in plan if w == wid]
        timed = [r for r in wrows if "timers" in r]
        first = timed[0] if timed else (wrows[0] if wrows else {})
        out_rows = []
        if "reference" in specs and wrows and wrows[0].get("variant") != "reference":
            out_rows.append(_reference_row(first))
        out_rows += wrows
        devices: dict[tuple, dict] = {}  # one entry per distinct GPU (per node and device on the CPU)
        for r in wrows:
            d = r.get("device") or {}
            if d:
                key = (d.get("node_id"), d.get("gpu_uuid") or d.get("cuda_visible_devices"), d.get("device"))
                devices.setdefault(key, {k: d.get(k) for k in ("node_id", "node_ip", "hostname", "device", "gpu_name",
                                                               "gpu_uuid", "ray_gpu_ids")})
        devices = list(devices.values())
        env = dict(first.get("env") or _driver_env())
        result = {
            "schema": SCHEMA,
            "command": "matrix",
            "workload": {"id": workload.id, "overrides": workload.overrides_vs(base)},
            "variant": {"levers": [], "label": variants, "dtype": first.get("dtype")},
            "mode": mode,
            "env": env,
            "variants": out_rows,
            "warmup": warmup,
            "iters": iters,
            "baseline": "reference",
            "first_call_timing": "before equivalence check", "peak_memory_over": PEAK_MEMORY_OVER,
            "ray": {
                "version": ray.__version__,
                "nodes": len(ray.nodes()),
                "cluster_gpus": gpus,
                "tasks": len(wrows),
                "task_resources": {"num_cpus": cpus_per_task, "num_gpus": 1 if on_gpu else 0},
                "devices": devices,
                "ratios": "each row's ratio is against the reference timed interleaved in the same task, "
                          "on the same GPU (row['reference']); rows on different GPUs are never divided",
                "env_note": "env is the environment of the first task; each row has its own under 'env'",
            },
        }
        results.append(result)
    return results


def _reference_row(task_row: dict) -> dict:
    ref = task_row.get("reference")
    row: dict[str, Any] = {"variant": "reference", "levers": [], "equivalence": None,
                           "device": task_row.get("device"), "workload": task_row.get("workload")}
    if ref is None:
        row["skipped"] = "no variant task finished, so the reference was not timed"
        return row
    row.update(timers=ref["timers"], first_call_s=ref["first_call_s"], warmup_s=ref["warmup_s"],
               peak_memory_bytes=ref["peak_memory_bytes"], ratio=ref["ratio"],
               timed_in_task_of=task_row.get("variant"))
    return row


def _driver_env() -> dict:
    from vlaperf.timing import environment_record

    return environment_record("cpu")


def run_matrix_ray(args) -> int:
    """`vlaperf matrix --ray`: the CLI entry (called from vlaperf.cli.cmd_matrix)."""
    from vlaperf.cli import CliError
    from vlaperf.profile.matrix import equivalence_exit
    from vlaperf.report.schema import write_result
    from vlaperf.serve.ray_backend import RayUnavailable, ray_init, require_ray
    from vlaperf.workloads import WORKLOADS

    def workload_ids(default: str) -> list[str]:
        wids = [w.strip() for w in (args.workload or default).split(",") if w.strip()]
        unknown = [w for w in wids if w not in WORKLOADS]
        if unknown:
            raise CliError(f"unknown workload(s) {', '.join(unknown)}; expected some of: {', '.join(WORKLOADS)}")
        return wids

    if args.workload:
        workload_ids("")  # bad ids fail before Ray starts
    try:
        started = ray_init(getattr(args, "ray_address", None))
    except RayUnavailable as e:
        raise CliError(str(e)) from None
    ray, _ = require_ray()
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        device = args.device or ("cuda" if gpus >= 1 else "cpu")
        wids = workload_ids("libero-pi0" if device.startswith("cuda") else "tiny")
        if device.startswith("cuda") and gpus < 1:
            raise CliError("--device cuda: the Ray cluster has no GPU")
        try:
            results = ray_matrix(wids, args.variants, device=device, dtype=args.dtype, steps=args.steps,
                                 batch=args.batch, seed=args.seed, checkpoint=args.checkpoint,
                                 action_horizon=getattr(args, "action_horizon", None), warmup=args.warmup,
                                 iters=args.iters, cpus_per_task=getattr(args, "ray_cpus_per_task", None) or 1.0,
                                 compile_cache=getattr(args, "compile_cache", None), mode=args.mode or "model",
                                 log=lambda m: print(m, file=sys.stderr))
        except RuntimeError as e:
            raise CliError(str(e)) from None
    finally:
        if started:
            ray.shutdown()
    for r in results:
        print_ray_matrix(r)
        if args.json:
            path = Path(args.json)
            if len(results) > 1:
                path = path.with_name(f"{path.stem}.{r['workload']['id']}{path.suffix or '.json'}")
            write_result(r, path)
            print(f"wrote {path}")
    return max(equivalence_exit(r["variants"]) for r in results)


def print_ray_matrix(result: dict) -> None:
    from vlaperf.cli import wide_console
    from rich.table import Table

    from vlaperf.report.document import table_names

    t = Table(title=f"vlaperf matrix --ray  {result['workload']['id']}  ({result.get('mode', 'model')} mode, "
                    f"{result['ray']['tasks']} tasks on "
                    f"{len(result['ray']['devices'])} device(s); speedup = the reference's median / the variant's, the reference timed in "
                    "the same task, on the same device)")
    for col in ("variant", "median ms", "p95 ms", "event ms", "speedup", "p10..p90", "rel L2", "first call s",
                "ref median ms", "gpu / device", "host"):
        t.add_column(col)
    names = table_names([r["variant"] for r in result["variants"]], 50)  # the compile mode kept
    for r, name in zip(result["variants"], names):
        d = r.get("device") or {}
        where = (d.get("gpu_name") or d.get("device") or "-") + (f" {d['gpu_uuid'][-8:]}" if d.get("gpu_uuid") else "")
        if "timers" not in r:
            t.add_row(name, r.get("skipped", ""), *[""] * 7, where, str(d.get("hostname", "")))
            continue
        w, e, q = r["timers"]["wall_ms"], r["timers"]["cuda_event_ms"], r["ratio"]["wall_ms"]
        eq = r.get("equivalence")
        ref = (r.get("reference") or {}).get("timers", {}).get("wall_ms")
        t.add_row(name, f"{w['median']:.3f}", f"{w['p95']:.3f}", f"{e['median']:.3f}" if e else "-",
                  f"{q['speedup']:.2f}x" + ("" if q["significant"] or r["variant"] == "reference" else " (noise)"),
                  f"{q['ratio_p10']:.2f}..{q['ratio_p90']:.2f}", f"{eq['rel_l2']:.1e}" if eq else "-",
                  f"{r['first_call_s']:.2f}", f"{ref['median']:.3f}" if ref else "-", where,
                  str(d.get("hostname", "")))
    wide_console(200).print(t)
