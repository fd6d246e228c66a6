"""`vlaperf bench / check / matrix` for the world-action workloads (`wam-761`, `wam-tiny`).

Seed 000 measured its model at three levels and asked two questions this answers:
    bench --mode forward   one full model forward (level 1), batch 1 / 4 / 8, per sparsity mode
    bench --mode model     one policy call, `generate` on device tensors (level 2)
    matrix --variants grid {reference (eager), exact levers, + compile default, + compile
                           reduce-overhead, + one CUDA graph, best} x {none, drop_middle,
                           mae_middle}, all interleaved in one process: each variant's speedup
                           over the reference at the same sparsity, and each sparsity mode's
                           gain over `none` for the same variant (does sparsity still pay once
                           the overhead is gone?)
    matrix --variants cumulative   reference -> + host_schedule -> + cached_keep_index -> ...
                           (which of the runner's overheads costs what)
Level 3 (end to end): `vlaperf serve --workload wam-761` behind the websocket front end, driven by
`vlaperf loadgen` / `vlaperf rollout` (docs/serving.md).
"""

from __future__ import annotations

import sys

import torch

from vlaperf.engine.levers import LeverError

SPARSITY_ALL = ("none", "drop_middle", "mae_middle")


def setup(args):
    from vlaperf.cli import CliError, note_size_on_cpu, setup_device
    from vlaperf.models.wam import WorldActionModel, build_wam, get_config
    from vlaperf.workloads import get_wam_workload

    if getattr(args, "checkpoint", None):
        raise CliError("--checkpoint: the world-action model has no public checkpoint layout yet; it runs on random weights")
    if getattr(args, "action_horizon", None) is not None:
        raise CliError("--action-horizon: the pi0 family's chunk; a world-action workload's actions come with its video "
                       "frames (its preset)")
    device = setup_device(args)
    try:
        base = get_wam_workload(args.workload)
        workload = base.with_overrides(batch=args.batch, steps=args.steps, video_steps=getattr(args, "video_steps", None),
                                       sparsity=getattr(args, "sparsity", None), cfg_scale=getattr(args, "cfg_scale", None))
    except ValueError as e:  # the sampling checks name the field: here it is the flag the user gave
        text = str(e)
        for field in ("video_steps", "cfg_scale", "steps", "sparsity", "batch"):
            if text.startswith(field + " "):
                text = f"--{field.replace('_', '-')}{text[len(field):]}"
                break
        raise CliError(text) from None
    dtype = getattr(torch, args.dtype) if args.dtype else None
    note_size_on_cpu(WorldActionModel, get_config(workload.preset), device, dtype, workload.id)
    model = build_wam(workload.preset, device=device, dtype=dtype, seed=args.seed)
    return base, workload, model, device


def make_engine(model, spec: str):
    from vlaperf.cli import CliError
    from vlaperf.engine.compile import CompileUnavailable
    from vlaperf.engine.wam import WamEngine

    try:
        return WamEngine(model, spec)
    except (LeverError, CompileUnavailable) as e:
        raise CliError(str(e)) from None


def header(command: str, base, workload, model, env: dict, levers: list[str], label: str, mode: str | None) -> dict:
    """cli.result_header plus the sampler settings the figure ran with."""
    from vlaperf.cli import result_header

    result = result_header(command, base, workload, model, env, levers, label, mode)
    result["workload"]["settings"] = {k: getattr(workload, k) for k in ("steps", "video_steps", "sparsity", "cfg_scale",
                                                                        "shift", "batch")}
    return result


def refuse_policy_mode(mode: str | None) -> None:
    """bench and matrix: the served path of a world-action model is not one vlaperf can time yet."""
    from vlaperf.cli import CliError

    if mode == "policy":
        raise CliError("--mode policy: the world-action model has no observation transform (VAE, text encoder) in vlaperf; "
                       "use --mode model (generate on device tensors; `vlaperf bench` also has --mode forward, one "
                       "forward alone)")


def refuse_sampler_options_in_forward(args, mode: str) -> None:
    """--mode forward times one unguided forward: the sampler's settings would be recorded but not run."""
    from vlaperf.cli import CliError

    given = [f"--{n.replace('_', '-')}" for n in ("steps", "video_steps", "cfg_scale") if getattr(args, n, None) is not None]
    if mode == "forward" and given:
        raise CliError(f"{', '.join(given)}: --mode forward times one forward, without the sampler; use --mode model")


def call_fn(model, engine, workload, obs, noise, mode: str):
    """The call to time: one forward or one generate, by the engine or the reference."""
    kw = workload.sampling()
    if mode == "forward":
        from vlaperf.engine.wam import WamEngine

        runner = engine or WamEngine(model, "reference")  # the reference forward: same ops as model.forward
        return lambda: runner.forward_once(obs, noise, workload.sparsity)
    if engine is None:
        return lambda: model.generate(obs, noise, **kw)
    return lambda: engine.generate(obs, noise, **kw)


# --------------------------------------------------------------------------- bench


def cmd_bench(args) -> int:
    from vlaperf.check import check_wam_equivalence
    from vlaperf.cli import _timed_once, idle_cost, print_bench
    from vlaperf.models.wam import random_wam_inputs
    from vlaperf.report.schema import write_result
    from vlaperf.roofline import H200_CEILINGS, measure_ceilings, wam_forward_roofline, wam_roofline
    from vlaperf.timing import environment_record, time_calls

    # vlaperf.cli.cmd_bench has refused what this command cannot run (refuse_bench_args), before any process started
    base, workload, model, device = setup(args)
    engine = None if args.levers in ("reference", "none", "") else make_engine(model, args.levers)
    label = engine.name if engine else "reference"
    obs, noise = random_wam_inputs(model.config, workload.batch, device, model.dtype, seed=args.seed)
    fn = call_fn(model, engine, workload, obs, noise, args.mode)
    first_call_s = _timed_once(fn, device)
    equivalence = None
    if engine is not None and not args.no_check:
        equivalence = check_wam_equivalence(model, engine, workload)
        if not equivalence["passed"]:
            print(f"vlaperf: variant {label} fails equivalence (actions rel_l2 {equivalence['rel_l2']:.3g}, video "
                  f"{equivalence['video_rel_l2']:.3g} > {equivalence['tolerance']:.3g}); refusing to report its speed",
                  file=sys.stderr)
            return 1
    # as `vlaperf serve` does after its check: the engine's stacked copies only (vlaperf.cli.refuse_bench_args has
    # refused the flag without an engine)
    released = engine.release_reference_weights() if args.release_reference else None
    # the first call above is the first of --warmup's calls
    timing = time_calls(fn, device=device, warmup=args.warmup, iters=args.iters, progress=not args.no_progress,
                        label=label, first_call_s=first_call_s)
    idle = idle_cost(fn, device, args)
    result = header("bench", base, workload, model, environment_record(device), engine.levers.names() if engine else [],
                    label, args.mode)
    result.update({k: timing[k] for k in ("timers", "warmup_s", "warmup", "iters", "peak_memory_bytes", "samples")})
    result["first_call_s"] = first_call_s
    result["first_call_timing"] = "before equivalence check" if engine is not None else "reference: no check"
    result["equivalence"] = equivalence
    result["released_reference_bytes"] = released
    if idle is not None:
        result["idle"] = idle
    ceilings = H200_CEILINGS
    if getattr(args, "ceilings", "h200") == "measure":  # after the timed calls, as for the pi0 family
        ceilings = measure_ceilings(device, model.dtype)
    roofline = wam_forward_roofline if args.mode == "forward" else wam_roofline
    floor = roofline(model.config, workload, matmul_flops=ceilings["matmul_flops"], bandwidth=ceilings["bandwidth"])
    floor["ceilings"] = ceilings
    result["roofline"] = floor  # of the H200's ceilings unless measured here: readers compare GPU runs to it only
    print_bench(result)
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- check


def check_specs(device: torch.device) -> list[str]:
    """Each lever alone (with what it needs), then the presets that apply here."""
    from vlaperf.engine.wam import WAM_CUDA_ONLY, WAM_LEVERS, WAM_REQUIRES

    specs = []
    for name in WAM_LEVERS:
        if name == "compile" or (name in WAM_CUDA_ONLY and device.type != "cuda"):
            continue  # compile is checked explicitly (`--levers compile`): it needs a compiler and time
        specs.append(",".join(WAM_REQUIRES.get(name, ()) + (name,)))
    return specs + ["exact"] + (["graph"] if device.type == "cuda" else [])


def cmd_check(args) -> int:
    from vlaperf.cli import wide_console
    from rich.table import Table

    from vlaperf.check import check_wam_equivalence
    from vlaperf.cli import CliError
    from vlaperf.report.schema import write_result
    from vlaperf.timing import device_label, environment_record

    base, workload, model, device = setup(args)
    specs = check_specs(device) if args.levers == "all" else [s for s in args.levers.split(";") if s.strip()]
    if not specs:
        raise CliError(f"--levers {args.levers!r}: no variant to check; expected 'all' or ';'-separated variants")
    from vlaperf.cli import refuse_repeated_variants
    from vlaperf.engine.wam import WamLevers

    for spec in specs:  # each checked before the first runs, named by the option, as the pi0 family's check does
        why = cannot_run_here(spec, device, "--levers")
        if why is not None:
            raise CliError(f"--levers: variant {spec!r} cannot run here: {why}")
    refuse_repeated_variants(specs, lambda s: WamLevers.parse(s, device).names(), "--levers", device)
    sparsities = [workload.sparsity] if getattr(args, "sparsity", None) else list(SPARSITY_ALL)
    rows = []
    for sp in sparsities:
        w = workload.with_overrides(sparsity=sp)
        for spec in specs:
            rows.append(check_wam_equivalence(model, make_engine(model, spec), w, seeds=range(args.seeds)))
    table = Table(title=f"vlaperf check  {workload.id}  ({rows[0]['dtype'] if rows else ''}, {device_label(device)}; "
                        "actions and video)")
    for col in ("variant", "sparsity", "actions rel L2", "video rel L2", "tolerance", "passed"):
        table.add_column(col, overflow="fold")
    from vlaperf.report.document import short_variant

    for r in rows:  # short names: the presets' full lever lists share a long prefix, which a narrow column would cut
        table.add_row(short_variant(r["variant"]), r["sparsity"], f"{r['rel_l2']:.3g}", f"{r['video_rel_l2']:.3g}", f"{r['tolerance']:.0e}",
                      "yes" if r["passed"] else "NO")
    wide_console(160).print(table)
    if args.json:
        result = header("check", base, workload, model, environment_record(device), [], "check", None)
        result["checks"] = rows
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return 0 if all(r["passed"] for r in rows) else 1


# --------------------------------------------------------------------------- matrix


def grid_variants(device: torch.device) -> list[str]:
    """Seed 000's {eager, compile default, compile reduce-overhead} plus vlaperf's exact levers and graph."""
    if device.type != "cuda":
        return ["reference", "exact", "exact,compile=default"]
    return ["reference", "exact", "exact,compile=default", "exact,compile=reduce-overhead", "graph", "best"]


def cumulative_variants(device: torch.device) -> list[str]:
    from vlaperf.engine.wam import WAM_EXACT

    from vlaperf.engine.wam import WAM_PRESETS

    order = list(WAM_PRESETS["best"]) if device.type == "cuda" else list(WAM_EXACT)  # best ends with the CUDA levers
    return ["reference"] + [",".join(order[: i + 1]) for i in range(len(order))]


def cannot_run_here(spec: str, device: torch.device, flag: str) -> str | None:
    """Why a world-action variant cannot run on `device` (None: it can). A misspelt lever or a bad pairing is a
    CliError naming `flag` first, on any device (a typo, not this machine's fault)."""
    from vlaperf.cli import CliError
    from vlaperf.engine.levers import LeverError
    from vlaperf.engine.wam import WamLevers

    try:
        WamLevers.parse(spec, torch.device("cuda"))  # the names and their pairings: parsing only, no GPU needed
    except LeverError as e:
        raise CliError(f"{flag}: variant {spec!r}: {e}") from None
    try:
        WamLevers.parse(spec, device)
    except LeverError as e:
        return str(e)
    return None


def parse_variants(spec: str, device: torch.device) -> list[str]:
    if spec == "grid":
        return grid_variants(device)
    if spec == "cumulative":
        return cumulative_variants(device)
    # the reference always runs, first: given as 'reference' or 'none' anywhere it is that row, not a second one
    items = ["reference"] + [s for s in (s.strip() for s in spec.split(";")) if s and s not in ("reference", "none")]
    from vlaperf.cli import CliError, refuse_repeated_variants
    from vlaperf.engine.wam import WamLevers

    # a typo is an error before anything runs (exit 2); a variant this device cannot run is a skipped row, unless no
    # variant asked for can run here (the matrix would time the reference alone and pass), as the pi0 matrix does
    cannot = [f"{item!r}: {why}" for item in items[1:]
              if (why := cannot_run_here(item, device, "--variants")) is not None]
    if cannot and len(cannot) == len(items) - 1:
        raise CliError(f"--variants: no variant asked for can run on {device.type}: {'; '.join(cannot)}")
    refuse_repeated_variants(items, lambda s: WamLevers.parse(s, device).names(), "--variants (--levers)", device)
    return items


def cmd_matrix(args) -> int:
    from vlaperf.cli import STOPPED_BY_SIGTERM, wide_console
    from rich.table import Table

    from vlaperf.profile.matrix import (PEAK_MEMORY_OVER, Terminated, equivalence_exit, first_call, idle_of, merge_peak,
                                        sigterm_as_interrupt)

    from vlaperf.check import check_wam_equivalence
    from vlaperf.cli import CliError, _timed_once
    from vlaperf.models.wam import random_wam_inputs
    from vlaperf.report.schema import write_result
    from vlaperf.roofline import wam_forward_roofline, wam_roofline
    from vlaperf.timing import _ratio_stats, environment_record, interleaved

    if getattr(args, "ray", False):
        raise CliError("--ray: the world-action workloads run in one process (no Ray matrix yet)")
    mode = getattr(args, "mode", None) or "model"
    refuse_policy_mode(mode)
    if mode not in ("model", "forward"):
        raise CliError(f"--mode {mode}: the world-action matrix times 'model' (generate) or 'forward' (one forward)")
    refuse_sampler_options_in_forward(args, mode)
    base, workload, model, device = setup(args)
    roofline = wam_forward_roofline if mode == "forward" else wam_roofline
    variants = parse_variants(args.variants, device)
    from vlaperf.profile.matrix import left_out_on, run_fields

    if left_out := left_out_on(args.variants, device, wam=True):
        print(left_out)
    sparsities = [workload.sparsity] if getattr(args, "sparsity", None) else list(SPARSITY_ALL)
    obs, noise = random_wam_inputs(model.config, workload.batch, device, model.dtype, seed=args.seed)
    rows, fns = [], {}
    try:
        with sigterm_as_interrupt() as terminated:
            for sp in sparsities:
                w = workload.with_overrides(sparsity=sp)
                for spec in variants:
                    terminated.raise_if_swallowed()
                    key = f"{spec} | {sp}"
                    row = {"variant": spec, "sparsity": sp, "key": key, "levers": [],
                           "roofline_floor_ms": roofline(model.config, w)["floor_ms"]}
                    if spec == "reference":
                        row["equivalence"] = None
                        fns[key] = call_fn(model, None, w, obs, noise, mode)
                        # its own first call, before the variants' checks run the reference model (as pi0's matrix)
                        first_call(row, device, lambda: _timed_once(fns[key], device))
                        rows.append(row)
                        continue
                    try:
                        engine = make_engine(model, spec)
                    except CliError as e:
                        row["skipped"] = str(e)
                        rows.append(row)
                        continue
                    row["levers"] = engine.levers.names()
                    fn = call_fn(model, engine, w, obs, noise, mode)
                    try:
                        first_call(row, device, lambda: _timed_once(fn, device))  # compile, capture: before the check
                        row["equivalence"] = check_wam_equivalence(model, engine, w)
                    except Exception as e:  # one variant that breaks (a compiler error) must not lose the matrix
                        row["skipped"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                        rows.append(row)
                        continue
                    if not row["equivalence"]["passed"]:
                        row["skipped"] = "fails equivalence: speed not reported"
                    else:
                        fns[key] = fn
                    rows.append(row)
            terminated.raise_if_swallowed()
            timing = interleaved(fns, device=device, warmup=args.warmup, iters=args.iters, baseline=next(iter(fns)),
                                 progress=not args.no_progress, idle_ms={key: getattr(args, "idle_ms", None) or 0.0 for key in fns},
                                 idle_spin=getattr(args, "idle_spin", False))
    except KeyboardInterrupt as e:
        # as `vlaperf matrix` for the pi0 family: the rows prepared keep their first call and equivalence, none is timed
        keys = {row["key"] for row in rows}
        for row in rows:
            row.setdefault("skipped", "not timed: the matrix was interrupted")
        rows += [{"variant": spec, "sparsity": sp, "key": f"{spec} | {sp}", "levers": [],
                  "skipped": "not prepared: the matrix was interrupted"}
                 for sp in sparsities for spec in variants if f"{spec} | {sp}" not in keys]
        _print(rows, workload, device, wide_console(180), Table, mode, idle_of(args))
        if args.json:
            result = header("matrix", base, workload, model, environment_record(device), [], args.variants, mode)
            result.update({"variants": rows, "warmup": args.warmup, "iters": args.iters, "sparsities": sparsities,
                           "first_call_timing": "before equivalence check", "peak_memory_over": PEAK_MEMORY_OVER,
                           **run_fields(args, left_out), "interrupted": True})
            write_result(result, args.json)
            print(f"interrupted: wrote the {len(rows)} rows so far (none timed) to {args.json}")
        return STOPPED_BY_SIGTERM if isinstance(e, Terminated) else 130
    samples = {k: v["samples"]["wall_ms"] for k, v in timing["variants"].items()}
    for row in rows:
        v = timing["variants"].get(row["key"])
        if v is None:
            continue
        row.update({k: v[k] for k in ("timers", "warmup_s")})
        merge_peak(row, v)
        ref = samples.get(f"reference | {row['sparsity']}")
        row["vs_reference"] = _ratio_stats(ref, samples[row["key"]]) if ref else None
        dense = samples.get(f"{row['variant']} | none")
        row["sparsity_gain"] = _ratio_stats(dense, samples[row["key"]]) if dense and row["sparsity"] != "none" else None
    _print(rows, workload, device, wide_console(180), Table, mode, idle_of(args))
    if args.json:
        result = header("matrix", base, workload, model, environment_record(device), [], args.variants, mode)
        result.update({"variants": rows, "warmup": args.warmup, "iters": args.iters, "sparsities": sparsities,
                       "first_call_timing": "before equivalence check", "peak_memory_over": PEAK_MEMORY_OVER,
                       **run_fields(args, left_out),
                       "ratios": "vs_reference: the reference at the same sparsity over this row, per round (p10..p90); "
                                 "sparsity_gain: the same variant at sparsity none over this row"})
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return equivalence_exit(rows)


def _fmt_ratio(r) -> str:
    if not r:
        return "-"
    return f"{r['speedup']:.2f}x ({r['ratio_p10']:.2f}..{r['ratio_p90']:.2f})" + ("" if r["significant"] else " noise")


def _print(rows, workload, device, console, Table, mode: str, idle: str = "") -> None:
    from vlaperf.timing import device_label

    what = "one forward" if mode == "forward" else "one generate call"
    t = Table(title=f"vlaperf matrix  {workload.id}  batch {workload.batch}, {what}  ({device_label(device)}; "
                    "interleaved in one process"
                    f"{idle}; ratios per round, p10..p90)")
    for col in ("variant", "sparsity", "median ms", "p95 ms", "vs reference", "sparsity gain", "actions rel L2",
                "first call s", "process peak GiB", "floor ms"):
        t.add_column(col, overflow="fold")  # a long variant name wraps, never cut to a prefix the rows share
    from vlaperf.report.document import short_variant

    for r in rows:  # short names, as check's table
        if "timers" not in r:
            t.add_row(short_variant(r["variant"]), r["sparsity"], r.get("skipped", ""), *[""] * 7)
            continue
        w, eq = r["timers"]["wall_ms"], r["equivalence"]
        t.add_row(short_variant(r["variant"]), r["sparsity"], f"{w['median']:.2f}", f"{w['p95']:.2f}", _fmt_ratio(r["vs_reference"]),
                  _fmt_ratio(r["sparsity_gain"]), f"{eq['rel_l2']:.1e}" if eq else "-", f"{r['first_call_s']:.2f}",
                  f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") else "-",
                  f"{r['roofline_floor_ms']:.2f}")
    console.print(t)


# ------------------------------------------------------------------------ breakdown


def wam_breakdown(model, workload, levers: str | None, warmup: int = 3, iters: int = 20, seed: int = 0,
                  progress: bool = False) -> tuple[dict, list[str], str]:
    """Median / p95 per stage of one world-action `generate`: setup, context_kv, each
    denoise step (full_denoise_step_<i> over every token, action_denoise_step_<i> for the
    action tokens alone once the video is cached), output. The reference is broken down as the
    engine with no levers (the same operations: equal to `model.generate` within float32
    rounding, tests/test_wam.py). Every variant is broken down as requested: compile is regional,
    so the marks fall between compiled functions; under cuda_graph the engine replays a second
    capture with a timing-event node at each mark (engine/graphs.py). Returns the breakdown
    (vlaperf.profile.breakdown.breakdown_fn's), notes, and the label of what was timed."""
    from vlaperf.profile.breakdown import breakdown_fn

    call, label, notes = breakdown_call(model, workload, levers, seed=seed)
    bd = breakdown_fn(call, device=model.device, warmup=warmup, iters=iters, progress=progress, label=label)
    return bd, notes, label


def breakdown_call(model, workload, levers: str | None, seed: int = 0):
    """What a world-action breakdown times, and `breakdown --trace` records: `call(rec)` (one generate on fixed
    inputs, its stages marked through the module-level markers while `rec` is active), the variant's label and
    the notes on how it is timed. One engine behind both, so a compiled or graphed variant is built once."""
    from vlaperf.engine.wam import WamEngine, WamLevers
    from vlaperf.models.wam import random_wam_inputs

    device = model.device
    requested = WamLevers.parse(levers or "reference", device)
    notes = []
    if requested.cuda_graph:
        notes.append("stages timed inside the CUDA graph: a second capture of the call with a timing-event node at "
                     "each stage boundary; the untimed call replays the graph without them")
    engine = WamEngine(model, requested)
    obs, noise = random_wam_inputs(model.config, workload.batch, device, model.dtype, seed=seed)
    kw = workload.sampling()

    def call(rec):
        return engine.generate(obs, noise, **kw)

    return call, engine.name, notes
