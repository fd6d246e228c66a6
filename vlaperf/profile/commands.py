"""CLI subcommands of the profiler: breakdown, scaling, syncs, doctor, report, diff.

`register(subparsers)` adds them to `vlaperf`'s parser (vlaperf.cli.build_parser). They run through `vlaperf`
(vlaperf.cli.main, also `python -m vlaperf`); this module has no entry point of its own. FILE_COMMANDS names
those that only read result files (report, diff): main parses them with a parser of that command alone, so that
they import no torch.

    vlaperf breakdown --workload libero-pi0 [--levers ...] [--mode model|policy] [--trace t.json]
    vlaperf scaling   --workload libero-pi0 --steps 1,2,5,10,20 --levers "reference;for_loop" --plot tn.png
    vlaperf syncs     --workload libero-pi0 [--levers ...] [--mode policy]
    vlaperf doctor    [--workload libero-pi0 [--levers ...]]
    vlaperf report    results/*.json -o report.html|report.md
    vlaperf diff      before.json after.json [--max-slowdown PCT]

Exit codes: 0 ok; 2 bad arguments or setup (argparse, or CliError from vlaperf.cli);
doctor: 1 when any finding has severity "error" (so CI can gate on the environment);
diff: 1 when the wall-clock median is more than --max-slowdown percent slower.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vlaperf.cli import (CliError, add_common, add_idle_spin, add_processes, apply_compile_cache, idle_ms_arg,
                         levers_arg, make_engine, non_negative_int, number_arg, output_file, path_arg, png_file,
                         positive_int, refuse_repeated_variants, refuse_spin_without_idle, result_header,
                         rounds_warmup_help, setup)
from vlaperf.report.render import idle_words

REFERENCE = ("reference", "none", "")


def _step_list(text: str) -> list[int]:
    from vlaperf.profile.scaling import MAX_STEP_COUNT

    items = [x.strip() for x in text.split(",")]
    try:
        values = sorted({int(x) for x in items})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,2,5,10,20; got {text!r}") from None
    if len(values) < 2 or values[0] < 1 or values[-1] > MAX_STEP_COUNT:
        raise argparse.ArgumentTypeError(f"expected at least two different step counts in 1..{MAX_STEP_COUNT}, got {text!r}")
    return values


def _levers_or_error(model, spec: str):
    """The Engine for `spec`, or None for the reference."""
    return None if spec.strip() in REFERENCE else make_engine(model, spec)


def _write(result: dict, path: str | None) -> None:
    if path:
        from vlaperf.report.schema import write_result

        write_result(result, path)
        print(f"wrote {path}")


def _console():
    from vlaperf.cli import wide_console

    return wide_console()


# --------------------------------------------------------------------------- breakdown


def _wam_breakdown_result(args, levers):
    """`vlaperf breakdown --workload wam-*`: the stages of one generate, as a result file."""
    from vlaperf.profile import wam
    from vlaperf.profile.breakdown import breakdown_fn
    from vlaperf.timing import environment_record

    base, workload, model, device = wam.setup(args)
    call, label, notes = wam.breakdown_call(model, workload, levers, seed=args.seed)  # a LeverError: main's message
    bd = breakdown_fn(call, device=device, warmup=args.warmup, iters=args.iters, progress=not args.no_progress,
                      label=label, idle_ms=args.idle_ms or 0.0, idle_spin=args.idle_spin)
    names = [] if label == "reference" else label.split(",")
    result = wam.header("breakdown", base, workload, model, environment_record(device), names, label, "model")
    untimed = bd.pop("untimed")
    result["timers"], result["samples"] = untimed["timers"], untimed["samples"]
    result.update({k: untimed[k] for k in ("first_call_s", "warmup_s", "warmup", "iters", "peak_memory_bytes")})
    result["breakdown"] = {"path": f"WamEngine {label}", "levers_timed": names, "steps": workload.steps,
                           "notes": notes, "matches_reference": None, **bd}
    return result, workload, device, call


def cmd_breakdown(args) -> int:
    from rich.table import Table
    from rich.text import Text

    from vlaperf.engine import LeverError
    from vlaperf.engine.compile import CompileUnavailable
    from vlaperf.profile.breakdown import breakdown, prepare_breakdown
    from vlaperf.report.document import short_variant
    from vlaperf.workloads import is_wam_workload

    refuse_spin_without_idle(args)
    # refused here, before --processes starts its children (each would refuse it only after its own start)
    if is_wam_workload(args.workload) and args.mode != "model":
        raise CliError("--mode policy: the world-action breakdown times generate on device tensors (--mode model)")
    if args.trace and args.json and Path(args.trace).resolve() == Path(args.json).resolve():
        raise CliError(f"--trace and --json name the same file {args.json}: the result would overwrite the trace")
    if args.processes > 1:  # the same breakdown in fresh processes, one after another: each stage's spread
        if args.trace:
            raise CliError("--trace with --processes: each process would overwrite the one trace; trace one process")
        from vlaperf.profile.processes import in_processes

        return in_processes(args.argv, args.processes, args.json)
    levers = None if args.levers in REFERENCE else args.levers
    wam_call = None  # the world-action call the breakdown timed, for --trace
    if is_wam_workload(args.workload):
        result, workload, device, wam_call = _wam_breakdown_result(args, levers)
    else:
        base, workload, model, device = setup(args)
        if levers is not None:  # one engine for the breakdown and --trace: a compiled variant compiles once
            levers = make_engine(model, levers)
        try:
            result = breakdown(model, workload, levers=levers, mode=args.mode, warmup=args.warmup, iters=args.iters,
                               seed=args.seed, progress=not args.no_progress, idle_ms=args.idle_ms or 0.0,
                               idle_spin=args.idle_spin)
        except (LeverError, CompileUnavailable, ValueError) as e:
            raise CliError(str(e)) from None
    bd = result["breakdown"]
    idle = f", each call after {idle_words(bd['idle_ms'], bd.get('idle_spin', False))}" if bd.get("idle_ms") else ""
    # the title a line of its own: a table's title wraps at the table's width
    title = Text(f"vlaperf breakdown  {workload.id}  {short_variant(result['variant']['label'])}  ({args.mode} mode, "
                 f"{result['variant']['dtype']}, {result['env'].get('gpu') or device}, {bd['timer']}{idle})",
                 style="bold")
    t = Table()
    for col in ("stage", "median ms", "p95 ms", "share", "per call", "mean/occ", "max/occ", "info"):
        t.add_column(col, justify="left" if col in ("stage", "info") else "right")
    for e in bd["stages"]:
        occ, info = e.get("occurrence") or {}, e.get("info") or {}
        t.add_row(e["name"], f"{e['median_ms']:.3f}", f"{e['p95_ms']:.3f}",
                  f"{100 * e['share']:.1f}%" if e.get("share") is not None else "-", str(e["per_call"]),
                  f"{occ['mean_ms']:.3f}" if occ else "", f"{occ['max_ms']:.3f}" if occ else "",
                  (f"{info['tokens']} tokens, {'valid' if info['valid'] else 'MASKED'}" if info else ""))
    console = _console()
    console.print(title)
    console.print(t)
    console.print(bd["statement"])
    for n in bd["notes"]:
        console.print("note: " + n)
    if args.trace:
        from vlaperf.profile.markers import StageRecorder
        from vlaperf.profile.trace import trace

        rec = StageRecorder(device)
        if wam_call is not None:  # its stages are marked through the module-level markers: `rec` active
            def one():
                with rec.activate(), rec.call():
                    wam_call(rec)
        else:
            sc = prepare_breakdown(model, workload, levers, args.mode, seed=args.seed, check=False)

            def one():
                with rec.call():
                    sc.call(rec)

        info = trace(one, args.trace, device=device, warmup=1, calls=1)
        print(f"wrote trace {info['path']} ({info['events']} events; stages: {', '.join(info['stages'])}); "
              "open it in https://ui.perfetto.dev or chrome://tracing")
        if "cuda_graph" in result["variant"]["levers"]:  # a replay: no host code between stages
            print("note: the call is one CUDA graph replay: the trace shows its kernels, and the stages inside it are "
                  "not named there (the table above has their times)")
        result["breakdown"]["trace"] = info["path"]
    _write(result, args.json)
    return 0


# --------------------------------------------------------------------------- scaling


def cmd_scaling(args) -> int:
    from rich.table import Table

    from vlaperf.profile.scaling import describe_fit, plot_scaling, scaling
    from vlaperf.timing import device_label, environment_record

    from vlaperf.workloads import is_wam_workload

    if args.plot and args.json and Path(args.plot).resolve() == Path(args.json).resolve():
        raise CliError(f"--plot and --json name the same file {args.json}: the result would overwrite the plot")
    if args.plot:
        from vlaperf.report.document import plots_available

        if not plots_available():  # before the run, not after it: the measurement would be lost to a traceback
            raise CliError('--plot needs matplotlib, which is not installed: pip install "vlaperf[plots]", or leave '
                           '--plot out (the table and --json need nothing more)')
    specs = [s.strip() for s in args.levers.split(";") if s.strip()]
    if not specs and args.levers.strip():  # ';' alone: no variant named (an empty --levers is the reference)
        raise CliError(f"--levers {args.levers!r}: no variant to time; expected ';'-separated variants")
    specs = specs or ["reference"]
    sources = {}
    if is_wam_workload(args.workload):  # the world-action model: T(N) of generate, the video's share of N kept
        from vlaperf.engine.wam import WamLevers
        from vlaperf.profile import wam

        wam.refuse_policy_mode(args.mode)
        from vlaperf.workloads import get_wam_workload

        own = get_wam_workload(args.workload).steps
        if args.video_steps is not None and args.video_steps > own:  # --steps is the list of N here, not one count
            raise CliError(f"--video-steps {args.video_steps}: in scaling, the video's steps at the workload's own "
                           f"{own} steps, 1..{own}; each --steps N keeps that share (a half rounded up)")
        base, workload, model, device = wam.setup(args)
        refuse_repeated_variants(specs, lambda s: WamLevers.parse(s, device).names(), "--levers", device)
        for spec in specs:
            engine = None if spec in ("reference", "none") else wam.make_engine(model, spec)
            sources["reference" if engine is None else engine.name] = engine or model
    else:
        from vlaperf.engine.levers import Levers

        base, workload, model, device = setup(args)
        # resolved for the model's dtype, as its engines resolve them (`best` of a float32 model has no kernels)
        refuse_repeated_variants(specs, lambda s: Levers.parse(s, device, model.dtype).names(), "--levers", device)
        for spec in specs:
            engine = _levers_or_error(model, spec)
            sources["reference" if engine is None else engine.name] = engine or model
    sc = scaling(sources, workload, steps=args.steps_list, warmup=args.warmup, iters=args.iters, seed=args.seed,
                 progress=not args.no_progress, mode=args.mode)
    t = Table(title=f"vlaperf scaling  {workload.id}  ({args.mode} mode, {device_label(device)}; interleaved; "
                    "median wall ms per call)")
    t.add_column("variant", overflow="fold")  # wrapped, never cut to a prefix the rows share
    for n in sc["steps"]:
        t.add_column(f"T({n})", justify="right")
    t.add_column("fit")
    from vlaperf.report.document import short_variant

    for s in sc["series"]:
        t.add_row(short_variant(s["label"]), *(f"{p['median_ms']:.3f}" for p in s["points"]),
                  describe_fit(s["fit"], len(s["points"])))
    _console().print(t)
    header = wam.header if is_wam_workload(args.workload) else result_header
    # one variant: its levers as resolved, as bench records them; several: none, their label names them (as matrix)
    only = next(iter(sources.values())) if len(sources) == 1 else None
    levers = only.levers.names() if only is not None and hasattr(only, "levers") else []
    result = header("scaling", base, workload, model, environment_record(device), levers, args.levers, args.mode)
    result["scaling"] = sc
    _write(result, args.json)
    if args.plot:
        plot_scaling(sc, args.plot, title=f"T(N), {workload.id} on {result['env'].get('gpu') or device}")
        print(f"wrote {args.plot}")
    return 0


# --------------------------------------------------------------------------- syncs


def cmd_syncs(args) -> int:
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.policy import served_call
    from vlaperf.timing import environment_record
    from vlaperf.workloads import is_wam_workload

    if is_wam_workload(args.workload):  # the world-action model: one generate call (seed 000's `.nonzero()` question)
        from vlaperf.models.wam import random_wam_inputs
        from vlaperf.profile import wam

        if args.mode != "model":
            raise CliError("--mode policy: the world-action model has no observation transform in vlaperf; use --mode model")
        base, workload, model, device = wam.setup(args)
        engine = None if args.levers in REFERENCE else wam.make_engine(model, args.levers)
        obs, noise = random_wam_inputs(model.config, workload.batch, device, model.dtype, seed=args.seed)
        fn, expected = wam.call_fn(model, engine, workload, obs, noise, "model"), 0
        header = lambda: wam.header("syncs", base, workload, model, environment_record(device),  # noqa: E731
                                    engine.levers.names() if engine else [], engine.name if engine else "reference", "model")
        return _report_syncs(args, fn, device, expected, header)
    base, workload, model, device = setup(args)
    engine = _levers_or_error(model, args.levers)
    sample = engine.sample_actions if engine else model.sample_actions
    noise = random_noise(workload, model.config, device, seed=args.seed)
    steps = workload.steps
    if args.mode == "model":
        obs = random_observation(workload, model.config, device, seed=args.seed)
        fn = lambda: sample(obs, noise, steps)  # noqa: E731
        expected = 0
    else:
        fn = served_call(model, sample, workload, noise, seed=args.seed)
        expected = 1
    label = engine.name if engine else "reference"
    header = lambda: result_header("syncs", base, workload, model, environment_record(device),  # noqa: E731
                                   engine.levers.names() if engine else [], label, args.mode)
    return _report_syncs(args, fn, device, expected, header)


def _report_syncs(args, fn, device, expected: int, header) -> int:
    import torch

    from vlaperf.profile.syncs import count_syncs, format_syncs

    treat = {"auto": None, "yes": True, "no": False}[args.treat_as_device]
    if args.source == "cuda" and torch.device(device).type != "cuda":
        raise CliError(f"--source cuda: counts the CUDA runtime's syncs, so it needs a CUDA device (this run is on {device})")
    try:
        rep = count_syncs(fn, device=device, calls=args.calls, warmup=args.warmup, source=args.source,
                          treat_as_device=treat, expected_per_call=expected)
    except ValueError as e:
        raise CliError(str(e)) from None
    print(format_syncs(rep))
    result = header()
    result["syncs"] = rep
    _write(result, args.json)
    return 0


# --------------------------------------------------------------------------- doctor


def cmd_doctor(args) -> int:
    import torch
    from rich.markup import escape
    from rich.table import Table

    from vlaperf.profile.doctor import doctor, exit_code
    from vlaperf.timing import device_label, environment_record

    # no workload, checkpoint or levers: the environment alone; --levers alone checks them on the default workload
    if args.workload is None and args.checkpoint is None and args.levers in REFERENCE:
        policy_only = [f"--{n.replace('_', '-')}" for n in ("steps", "batch", "action_horizon", "dtype", "sparsity",
                                                             "video_steps", "cfg_scale") if getattr(args, n) is not None]
        if policy_only:  # they shape a policy check, which this is not: never dropped without a word
            raise CliError(f"{', '.join(policy_only)}: settings of a policy check; give --workload (or --levers, or "
                           "--checkpoint) to check a policy, or leave them out to check the environment alone")
        apply_compile_cache(args)  # the environment's compile-cache finding then reports the caches given
        device = torch.device(args.device) if args.device else None
        findings = doctor(device=device, measure=not args.no_measure)
        base = workload = model = None
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        from vlaperf.workloads import is_wam_workload

        if is_wam_workload(args.workload):  # the world-action model: seed 000's runner overheads
            from vlaperf.profile import wam

            base, workload, model, device = wam.setup(args)
            engine = None if args.levers in REFERENCE else wam.make_engine(model, args.levers)
        else:
            base, workload, model, device = setup(args)
            engine = _levers_or_error(model, args.levers)
        findings = doctor(model, engine=engine, workload=workload, measure=not args.no_measure)
    t = Table(title=f"vlaperf doctor  {workload.id if workload else 'environment only'}  ({device_label(device)})",
              show_lines=True)
    for col in ("severity", "finding", "cost ms", "fix"):  # a long word (a cited file's path) wraps, never cut
        t.add_column(col, overflow="fold")
    style = {"error": "bold red", "warning": "yellow", "info": "dim"}
    for f in findings:
        # how the cost was measured, or why it could not be resolved ("-" alone read as "not measured")
        how = f"\n[dim italic]{escape(f['cost_note'])}[/]" if f.get("cost_note") else ""
        t.add_row(f"[{style[f['severity']]}]{f['severity']}[/]", f"{f['title']}\n[dim]{f['detail']}[/]{how}",
                  f"{f['cost']:.3f}" if f["cost"] is not None else "-", f["fix"] or "")
    _console().print(t)
    code = exit_code(findings)
    if args.json:
        env = environment_record(device)
        if model is not None:
            levers = engine.levers.names() if engine is not None else []  # resolved, as bench and syncs record them
            result = result_header("doctor", base, workload, model, env, levers, args.levers, None)
        else:
            from vlaperf.report.schema import SCHEMA

            result = {"schema": SCHEMA, "command": "doctor", "workload": {"id": None, "overrides": {}},
                      "variant": None, "mode": None, "env": env}
        result["findings"] = findings
        result["exit_code"] = code
        _write(result, args.json)
    return code


# --------------------------------------------------------------------------- report


def cmd_report(args) -> int:
    from vlaperf.report.document import plots_available
    from vlaperf.report.render import render

    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise CliError(f"no such file or directory: {', '.join(missing)}")
    skipped: list[str] = []

    def skip(msg: str) -> None:  # on stderr as well as in the report: a skipped file is easy to miss on a page
        skipped.append(msg)
        print(f"skipped {msg if len(msg) <= 300 else msg[:299] + '…'}", file=sys.stderr)

    try:
        out = render(args.paths, args.output, on_skip=skip, jobs=args.jobs)
    except ValueError as e:  # render's messages start "report: " for callers from Python; the CLI names it already
        raise CliError(str(e).removeprefix("report: ")) from None
    print(f"wrote {out}" + (f" ({len(skipped)} file(s) skipped, listed above and in the report)" if skipped else ""))
    if not plots_available():
        print('no plots: matplotlib is not installed (pip install "vlaperf[plots]"); the tables are all there',
              file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- diff


def cmd_diff(args) -> int:
    import json

    from rich.table import Table

    from vlaperf.profile.diff import content_problem, diff, mismatches, timer_problem, verdict
    from vlaperf.report.render import field_problem
    from vlaperf.report.schema import SchemaError, read_result

    results = []
    for name, path in (("BEFORE", args.before), ("AFTER", args.after)):
        try:
            r = read_result(path)
        except json.JSONDecodeError as e:
            raise CliError(f"{name} {path}: not JSON ({e})") from None
        except SchemaError as e:
            raise CliError(f"{name} {path}: {e}") from None
        except OSError as e:  # a missing or unreadable file, named as BEFORE or AFTER like every other problem
            raise CliError(f"{name} {path}: {e.strerror or e}") from None
        if r["command"] not in ("bench", "breakdown"):
            raise CliError(f"{name} {path}: a {r['command']!r} file; diff compares two 'bench' or two 'breakdown' files")
        problem = field_problem(r) or timer_problem(r) or content_problem(r)
        if problem:
            raise CliError(f"{name} {path}: {problem}")
        results.append(r)
    before, after = results
    if before["command"] != after["command"]:
        raise CliError(f"BEFORE is a {before['command']!r} file and AFTER a {after['command']!r} file; diff compares "
                       "two files of one command")
    problems = mismatches(before, after)
    if problems and not args.allow_mismatch:
        raise CliError("the files are not comparable: " + "; ".join(problems) + " (--allow-mismatch compares them anyway)")
    d = diff(before, after)
    if args.max_slowdown is not None and "wall_ms" not in d["timers"]:  # a gate with nothing to gate on must not pass
        raise CliError("--max-slowdown: the files hold no wall_ms timer in common, so there is no wall-clock change "
                       "to check (bench and breakdown files write timers.wall_ms)")
    console = _console()
    for name, path, r in (("before", args.before, before), ("after", args.after, after)):
        env = r.get("env") or {}
        console.print(f"{name}: {path}: {(r.get('variant') or {}).get('label')}, commit "
                      f"{(env.get('git_commit') or '-')[:12]}, {str(env.get('timestamp') or '-')[:19]}")
    if Path(args.before).resolve() == Path(args.after).resolve():
        problems = [*problems, "BEFORE and AFTER are the same file: no change can show"]
    for p in problems:
        console.print(f"[yellow]warning: {p}[/]")
    devices = [r["env"].get("gpu") or "cpu" for r in (before, after)]  # --allow-mismatch: both, before -> after
    t = Table(title=f"vlaperf diff  {before['workload']['id']}  ({before.get('mode')} mode, "
                    f"{devices[0] if devices[0] == devices[1] else ' -> '.join(devices)})")
    for col in ("timer", "before ms", "after ms", "change", "speed-up", "95% interval (calls only)"):
        t.add_column(col, justify="right")
    for timer, row in d["timers"].items():
        interval = row.get("speedup_interval_95")
        t.add_row(timer, f"{row['before_ms']:.3f}", f"{row['after_ms']:.3f}", f"{row['change_pct']:+.1f}%",
                  f"{row['speedup']:.3f}x", f"{interval[0]:.3f}-{interval[1]:.3f}x" if interval else "-")
    console.print(t)
    if d["stages"]:
        console.print(stage_table(d["stages"]))
    if d["processes"]:
        p = d["processes"]
        console.print("process medians, ms: before " + ", ".join(f"{x:.3f}" for x in p["before_ms"])
                      + "; after " + ", ".join(f"{x:.3f}" for x in p["after_ms"]))
    console.print(verdict(d))
    wall = d["timers"].get("wall_ms")
    if args.max_slowdown is not None and wall is not None and wall["change_pct"] > args.max_slowdown:
        print(f"vlaperf diff: the wall median is {wall['change_pct']:.1f}% slower, above --max-slowdown "
              f"{args.max_slowdown:g}%", file=sys.stderr)
        return 1
    return 0


def stage_table(stages: list[dict]):
    """Two breakdowns' stages side by side; with --processes files, each stage's ordering and p."""
    from rich.table import Table

    with_processes = any(row["processes"] for row in stages)
    t = Table(title="stages: each stage's median" + ("; processes: how the after processes' medians stand to the "
                                                      "before ones'" if with_processes else ""))
    for col in ("stage", "before ms", "after ms", "change") + (("processes", "p") if with_processes else ()):
        t.add_column(col, justify="left" if col in ("stage", "processes") else "right")
    for row in stages:
        p = row["processes"]
        cells = [row["stage"], *(f"{row[k]:.3f}" if row[k] is not None else "-" for k in ("before_ms", "after_ms")),
                 f"{row['change_pct']:+.1f}%" if row["change_pct"] is not None else "-"]
        if with_processes:
            cells += [("-" if p is None else "overlap" if p["direction"] is None
                       else f"all {p['direction']}" + (", beyond the spread" if p["beyond_spread"] else "")),
                      f"{p['mann_whitney_p']:.3g}" if p else "-"]
        t.add_row(*cells)
    return t


# --------------------------------------------------------------------------- wiring


def register(subparsers) -> None:
    """Add breakdown, scaling, syncs, doctor, report and diff to `vlaperf`'s subparsers."""
    p = subparsers.add_parser("breakdown", help="per-stage median/p95 of one policy call")
    add_common(p)
    p.add_argument("--mode", choices=("model", "policy"), default="model",
                   help="model: the call on device tensors; policy: the served path, transform and copies included "
                        "(default: model)")
    p.add_argument("--warmup", type=non_negative_int, default=10,
                   help="warm-up calls of the instrumented call; 0 is 1: its own first call (a graph's capture) is "
                        "always made and never a stage sample; before them the process's first call, the untimed "
                        "one, is timed on its own as first_call_s (default: 10)")
    p.add_argument("--iters", type=positive_int, default=50,
                   help="instrumented calls, each beside an untimed one (default: 50)")
    p.add_argument("--trace", type=output_file, default=None, help="also write a Chrome/Perfetto trace of one call here")
    p.add_argument("--idle-ms", type=idle_ms_arg, default=None, metavar="MS",
                   help="each measured call after MS milliseconds of idle (host asleep, device synchronized), as a "
                        "control loop calls its policy: which stages go cold between calls (default: back to back)")
    add_idle_spin(p)
    add_processes(p, "breakdown")
    p.set_defaults(func=cmd_breakdown)

    # add_common's --steps (one step count) is replaced by a list of step counts here.
    p = subparsers.add_parser("scaling", help="T(N) against denoise steps N, and its line fit",
                              conflict_handler="resolve")
    add_common(p)
    p.add_argument("--steps", dest="steps_list", type=_step_list, default=[1, 2, 5, 10, 20],
                   help="comma-separated step counts, at least two different "
                        "ones in 1..1000 (default: 1,2,5,10,20)")
    p.set_defaults(steps=None)
    p.add_argument("--levers", type=levers_arg, default="reference",
                   help="a variant, or several separated by ';' to compare slopes, e.g. 'reference;for_loop' "
                        "(default: reference)")
    p.add_argument("--mode", choices=("model", "policy"), default="model",
                   help="model: the call on device tensors; policy: the served path of N steps, transform and copies "
                        "included (pi0 family) (default: model)")
    p.add_argument("--warmup", type=positive_int, default=3, help=rounds_warmup_help("point", 3))
    p.add_argument("--iters", type=positive_int, default=10, help="interleaved rounds (default: 10)")
    p.add_argument("--plot", type=png_file, default=None, help="write the T(N) plot here (a .png file)")
    p.set_defaults(func=cmd_scaling)

    p = subparsers.add_parser("syncs", help="host-device syncs per policy call, by source line")
    add_common(p)
    p.add_argument("--mode", choices=("model", "policy"), default="model",
                   help="model: the call on device tensors; policy: the served path (default: model)")
    p.add_argument("--calls", type=positive_int, default=2, help="watched calls, after the warm-up (default: 2)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="unwatched calls first (default: 1)")
    p.add_argument("--source", choices=("auto", "cuda", "mode"), default="auto",
                   help="cuda: torch.cuda sync debug mode (a GPU only); mode: host reads seen by a "
                        "TorchFunctionMode; auto (the default): cuda on a GPU, mode elsewhere")
    p.add_argument("--treat-as-device", choices=("auto", "yes", "no"), default="auto",
                   help="mode: count host reads of CPU tensors as syncs (auto, the default: yes on the "
                        "CPU, no on a GPU)")
    p.set_defaults(func=cmd_syncs)

    p = subparsers.add_parser("doctor", help="environment and policy checks, with measured costs and fixes")
    # doctor without --workload checks the environment only (docs/profiling.md)
    add_common(p, workload_help="workload id, as `vlaperf workloads` lists them; with it, doctor also builds and "
                                "checks that policy (default: none, the environment's checks only; with --levers or "
                                "--checkpoint alone, bench's default: libero-pi0 on a GPU, tiny on the CPU)")
    p.add_argument("--no-measure", action="store_true", help="skip the cost measurements")
    p.set_defaults(func=cmd_doctor)

    for add in FILE_COMMANDS.values():  # report, diff
        add(subparsers)


def add_diff(subparsers) -> None:
    """Add diff to `vlaperf`'s subparsers (register does; vlaperf.cli.file_command_parser adds it alone)."""
    p = subparsers.add_parser("diff", help="two bench (or breakdown) files of one workload, before and after a change: "
                                           "the change and whether it is beyond the process spread")
    p.add_argument("before", type=path_arg, help="the bench or breakdown result file before the change")
    p.add_argument("after", type=path_arg, help="the result file of the same command after it")
    p.add_argument("--max-slowdown", type=number_arg(float, 0), default=None, metavar="PCT",
                   help="exit 1 when the after file's wall-clock median is more than PCT percent above the before "
                        "file's (a regression gate: set PCT above the process spread, which `bench --processes N` "
                        "measures)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare files of different workloads, modes, dtypes, GPUs or (breakdown) idles before each "
                        "call (with a warning)")
    p.set_defaults(func=cmd_diff)


def add_report(subparsers) -> None:
    """Add report to `vlaperf`'s subparsers (register does; vlaperf.cli.file_command_parser adds it alone)."""
    p = subparsers.add_parser("report", help="render result files into an HTML or markdown report")
    p.add_argument("paths", nargs="+", help="result JSON files, or folders: each folder's *.json (not its subfolders, "
                                            "where traces and logs live)")
    p.add_argument("-o", "--output", type=output_file, default="report.html",
                   help="report.html (self-contained) or report.md (default: report.html)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="processes that draw the figures (default: this machine's cores, at most 8; 1 draws them "
                        "here). The report is the same whatever the number")
    p.set_defaults(func=cmd_report)


# The commands that only read result files, each with the function that adds its parser, in the order `vlaperf --help`
# lists them. register adds them beside the others; vlaperf.cli.main parses `vlaperf <one of them> ...` with a parser
# of that command alone (file_command_parser), since the other commands' parsers import torch. A command added here
# must import no torch on its own path either (tests/test_report_render.py runs each in a fresh process).
FILE_COMMANDS = {"report": add_report, "diff": add_diff}
