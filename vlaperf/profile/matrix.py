"""The optimization matrix: engine variants timed interleaved in one process.

Variants that fail the equivalence check are listed with their error and never timed.
`cumulative` adds one lever at a time in LEVERS order up to `best` (seed 004's table); `grid` is seed
000's {eager, compile default, compile reduce-overhead, cuda_graph} x {loop only, all
exact levers}.
`--mode policy` times each variant's served path (the openpi request transformed, copied to the device,
sampled, the actions back on the host) instead of the call on device tensors: how much of a lever's
speed-up a client sees.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable

import torch

from vlaperf.engine.engine import first_call_seconds
from vlaperf.engine.levers import EXACT, EXPERIMENTAL, LEVERS, MODIFIERS


def cumulative_variants(device: torch.device, dtype: torch.dtype | None = None) -> list[str]:
    """reference, +for_loop, +skip_masked_images, ... in LEVERS order. On a GPU the table goes
    on to what `best` resolves to there: +cuda_graph, +compile=default, +compile_layers, and the
    levers `best` adds on this GPU only (triton_kernels and megakernel on Hopper, for a bfloat16
    model: `dtype`, the model's; None takes bfloat16)."""
    from vlaperf.engine.levers import Levers

    order = [n for n in LEVERS if n != "compile" and n not in EXPERIMENTAL + MODIFIERS
             and (n != "cuda_graph" or device.type == "cuda")]
    if device.type == "cuda":
        order.append("compile=default")
        best = Levers.parse("best", device, dtype)
        order += [n for n in MODIFIERS + EXPERIMENTAL if getattr(best, n)]
    return ["reference"] + [",".join(order[: i + 1]) for i in range(len(order))]


def grid_variants(device: torch.device) -> list[str]:
    bases = {"loop": "for_loop", "exact": ",".join(EXACT)}
    modes = ["", "compile=default"] + (["compile=reduce-overhead", "cuda_graph"] if device.type == "cuda" else [])
    out = ["reference"]
    for b in bases.values():
        for m in modes:
            out.append(b + ("," + m if m else ""))
    return out


def left_out_on(spec: str, device: torch.device, wam: bool = False) -> str | None:
    """What the `grid` / `cumulative` presets leave out on a device without CUDA, in words (printed before the
    matrix runs, so that a shorter table is not mistaken for the whole one); None where nothing is left out."""
    if device.type == "cuda" or spec not in ("grid", "cumulative"):
        return None
    if spec == "grid":
        rows = "exact + compile=reduce-overhead, graph and best" if wam else "compile=reduce-overhead and cuda_graph"
        return f"grid on {device.type}: the {rows} rows need a CUDA device and are left out"
    return (f"cumulative on {device.type}: the table ends at the exact levers; cuda_graph, compile and the GPU levers "
            "of best need a CUDA device")


def run_fields(args, left_out: str | None) -> dict:
    """A matrix file's run-wide fields, the same whether it ran to the end or was interrupted: each call's idle
    (`--idle-ms`, 0 back to back) and what the preset left out on this device (`left_out_on`; absent where nothing)."""
    fields = {"idle_ms": getattr(args, "idle_ms", None) or 0.0, "idle_spin": getattr(args, "idle_spin", False)}
    if left_out:
        fields["left_out"] = left_out
    return fields


def check_variants(spec: str) -> None:
    """--variants' lever names and values, before anything is built: a name that is no lever, a value a lever does
    not take ('compile=foo', 'sdpa=1', 'compile=') or one lever given two values is a typo and an error (a lever
    that cannot apply on the device is a row the matrix reports as skipped)."""
    from vlaperf.cli import CliError
    from vlaperf.engine.levers import LEVERS, PRESETS, LeverError, Levers, unknown_lever

    if spec in ("cumulative", "grid"):
        return
    for item in (s.strip() for s in spec.split(";")):
        if item in ("cumulative", "grid"):  # called an unknown lever, beside an error that lists it as expected
            raise CliError(f"--variants: {item!r} is a whole matrix: give it alone, not among ';'-separated variants")
        try:
            name = unknown_lever(item)
        except LeverError as e:
            raise CliError(f"--variants: {e}") from None
        if name is not None and name not in PRESETS:  # a preset in a list: the parser below says so
            raise CliError(f"--variants: unknown lever {name!r} in {item!r}; expected 'cumulative', 'grid' or "
                           f"';'-separated lists of: {', '.join(LEVERS)} (or 'best', 'graph', 'exact', 'reference')")
        try:  # the parse is the same on any device (the device only resolves what 'best' holds)
            Levers.parse(item, "cpu")
        except LeverError as e:
            raise CliError(f"--variants: variant {item!r}: {e}") from None


def parse_variants(spec: str, device: torch.device, dtype: torch.dtype | None = None) -> list[str]:
    check_variants(spec)
    if spec == "cumulative":
        return cumulative_variants(device, dtype)
    if spec == "grid":
        return grid_variants(device)
    # the reference always runs, first: given as 'reference' or 'none' anywhere it is that row, not a second one
    items = ["reference"] + [s for s in (s.strip() for s in spec.split(";")) if s and s not in ("reference", "none")]
    from vlaperf.cli import refuse_repeated_variants
    from vlaperf.engine.levers import Levers

    refuse_repeated_variants(items, lambda s: Levers.parse(s, device, dtype).names(), "--variants (--levers)", device)
    return items


def refuse_if_none_can_run(variants: list[str], device: torch.device) -> None:
    """A variant that cannot run here is a skipped row beside the others; if none of those asked for can, the
    matrix would time the reference alone and pass: a CliError instead, before any row is prepared. (The Ray
    matrix leaves it to each task, whose device is the replica's.)"""
    from vlaperf.cli import CliError
    from vlaperf.engine.levers import LeverError, Levers

    asked = [s for s in variants if s != "reference"]
    reasons = []
    for s in asked:
        try:
            Levers.parse(s, device).check(device)
        except LeverError as e:
            reasons.append(f"{s!r}: {e}")
    if asked and len(reasons) == len(asked):
        raise CliError(f"--variants: no variant asked for can run on {device.type}: {'; '.join(reasons)}")


# What a matrix file's peak_memory_bytes covers (its `peak_memory_over`; files before it: the warm-up calls only)
PEAK_MEMORY_OVER = "first call and warm-up"


def first_call(row: dict, device: torch.device, timed: Callable[[], float]) -> None:
    """A row's first call, `timed()` (its seconds), as `first_call_s`, and the allocator's peak over it as
    `peak_memory_bytes`: compile's and capture's buffers are the first call's, and the rounds' warm-up (interleaved's
    peak, over its own calls) comes after it. `merge_peak` then takes the larger of the two."""
    from vlaperf.timing import _peak_memory, _reset_peak_memory

    _reset_peak_memory(device)
    row["first_call_s"] = timed()
    row["peak_memory_bytes"] = _peak_memory(device)


def merge_peak(row: dict, timed: dict) -> None:
    """The row's peak over its first call (`first_call`) and its warm-up (`timed`, interleaved's record of it)."""
    peaks = [p for p in (row.get("peak_memory_bytes"), timed["peak_memory_bytes"]) if p is not None]
    row["peak_memory_bytes"] = max(peaks) if peaks else None


def prepare_variant(model, spec: str, workload, obs, noise, steps: int, mode: str = "model",
                    seed: int = 0) -> tuple[dict, object | None]:
    """A matrix row for `spec` and the call to time, or None when it cannot be timed (the
    lever does not apply, or it fails equivalence: its speed is never reported). `mode`: what
    the call is, as `vlaperf bench --mode` says (see `timed_call`)."""
    from vlaperf.check import check_equivalence
    from vlaperf.cli import CliError, make_engine

    from vlaperf.timing import Timer

    row: dict = {"variant": spec, "levers": []}
    if spec == "reference":
        row["equivalence"] = None
        # Its first call is made here, first in the process: the other rows' equivalence checks call the reference
        # model, so the rounds' warm-up found it warm (and the first variant's first call paid the process's first
        # use of the device's libraries).
        timer = Timer(noise.device)
        first_call(row, noise.device, lambda: timer.wall_s(lambda: model.sample_actions(obs, noise, steps)))
        return row, timed_call(model, None, workload, obs, noise, steps, mode, seed)
    try:
        engine = make_engine(model, spec)
    except CliError as e:
        row["skipped"] = str(e)
        return row, None
    row["levers"] = engine.levers.names()
    from vlaperf.engine import LeverError

    try:
        # The first call is where compile and graph capture happen: time it before the
        # equivalence check (which would otherwise absorb it). It is the model call in either mode.
        first_call(row, noise.device, lambda: first_call_seconds(engine, obs, noise, steps))
        row["equivalence"] = check_equivalence(model, engine, workload)
    except LeverError as e:  # found only when it runs (kernels that do not fit this GPU or dtype): a skipped row
        row["skipped"] = f"could not run: {e}"
        return row, None
    if not row["equivalence"]["passed"]:
        row["skipped"] = "fails equivalence: speed not reported"
        return row, None
    return row, timed_call(model, engine, workload, obs, noise, steps, mode, seed)


def timed_call(model, engine, workload, obs, noise, steps: int, mode: str, seed: int):
    """What a row times: `mode` "model", the call on device tensors (`obs`, `noise`); "policy", the served path
    (`vlaperf.policy.served_call`: the openpi request of `seed` transformed, copied, sampled with `noise` and the
    actions back on the host), the step kernel's barriers checked after each call as a server does. `engine`
    None: the reference."""
    sample = engine.sample_actions if engine is not None else model.sample_actions
    if mode == "model":
        return lambda: sample(obs, noise, steps)
    if mode != "policy":
        raise ValueError(f"mode: expected 'model' or 'policy', got {mode!r}")
    from vlaperf.policy import served_call

    return served_call(model, sample, workload, noise, seed=seed,
                       verify=engine.raise_on_kernel_fault if engine is not None else None)


def run_matrix(args, base, workload, model, device) -> int:
    from vlaperf.cli import STOPPED_BY_SIGTERM, wide_console
    from rich.table import Table

    from vlaperf.cli import result_header
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.report.schema import write_result
    from vlaperf.timing import environment_record, interleaved

    variants = parse_variants(args.variants, device, model.dtype)
    refuse_if_none_can_run(variants, device)
    mode = args.mode or "model"
    if left_out := left_out_on(args.variants, device):
        print(left_out)
    obs = random_observation(workload, model.config, device, seed=args.seed)
    noise = random_noise(workload, model.config, device, seed=args.seed)
    steps = workload.steps
    fns, rows = {}, []
    try:
        with sigterm_as_interrupt() as terminated:
            for spec in variants:
                row, fn = prepare_variant(model, spec, workload, obs, noise, steps, mode, args.seed)
                if fn is not None:
                    fns[spec] = fn
                rows.append(row)
                terminated.raise_if_swallowed()
            timing = interleaved(fns, device=device, warmup=args.warmup, iters=args.iters, baseline="reference",
                                 progress=not args.no_progress, idle_ms={name: getattr(args, "idle_ms", None) or 0.0 for name in fns},
                                 idle_spin=getattr(args, "idle_spin", False))
    except KeyboardInterrupt as e:
        # Ctrl-C, or a time limit's SIGTERM: a long matrix (compiles, captures) keeps what it learnt so far. The
        # rows prepared have their first call and their equivalence; none has a speed (the rounds never finished).
        for row in rows:
            row.setdefault("skipped", "not timed: the matrix was interrupted")
        rows += [{"variant": spec, "levers": [], "skipped": "not prepared: the matrix was interrupted"}
                 for spec in variants[len(rows):]]
        _print(rows, workload, device, wide_console(170), Table, mode, idle_of(args))
        if args.json:
            result = result_header("matrix", base, workload, model, environment_record(device), [], args.variants, mode)
            result.update({"variants": rows, "warmup": args.warmup, "iters": args.iters, "baseline": "reference",
                           "first_call_timing": "before equivalence check", "peak_memory_over": PEAK_MEMORY_OVER,
                           **run_fields(args, left_out), "interrupted": True})
            write_result(result, args.json)
            print(f"interrupted: wrote the {len(rows)} rows so far (none timed) to {args.json}")
        return STOPPED_BY_SIGTERM if isinstance(e, Terminated) else 130
    for row in rows:
        v = timing["variants"].get(row["variant"])
        if v is None:
            continue
        row.update({k: v[k] for k in ("timers", "warmup_s")})
        merge_peak(row, v)
        row.setdefault("first_call_s", v["first_call_s"])
        row["ratio"] = timing["ratios"][row["variant"]]
    _print(rows, workload, device, wide_console(170), Table, mode, idle_of(args))
    if args.json:
        result = result_header("matrix", base, workload, model, environment_record(device), [], args.variants, mode)
        result.update({"variants": rows, "warmup": args.warmup, "iters": args.iters, "baseline": "reference",
                       "first_call_timing": "before equivalence check", "peak_memory_over": PEAK_MEMORY_OVER,
                       **run_fields(args, left_out)})
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return equivalence_exit(rows)


def equivalence_exit(rows: list[dict]) -> int:
    """A matrix's exit code: 1 where a variant failed its equivalence check (its row is in the table and the file,
    with no speed), as bench and check exit, so that a CI job running a matrix sees it; else 0. A variant that could
    not run here (a lever this device lacks) is no failure."""
    return 1 if any((row.get("equivalence") or {}).get("passed") is False for row in rows) else 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (`sigterm_as_interrupt`)."""


class _SigtermState:
    received = False

    def raise_if_swallowed(self) -> None:
        """Raise Terminated again where a SIGTERM came but its exception never reached us (a library caught it, or it
        landed inside a finalizer, where Python prints and drops it): the matrix stops at the next row, not never."""
        if self.received:
            raise Terminated("SIGTERM (its first exception was lost)")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (what `timeout` and job schedulers send) raised as `Terminated`, a KeyboardInterrupt, inside the
    block, on the main thread only (where Python delivers signals); a second SIGTERM ends the process at once
    (exit status 143), for a process that the first could not stop. The previous handler comes back after."""
    state = _SigtermState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def interrupt(signum, frame):
        if state.received:
            os._exit(128 + signal.SIGTERM.value)
        state.received = True
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


def idle_of(args) -> str:
    """`matrix --idle-ms`'s words for the table's title ("" back to back)."""
    from vlaperf.report.render import idle_words

    ms = getattr(args, "idle_ms", None)
    return f", each call after {idle_words(ms, getattr(args, 'idle_spin', False))}" if ms else ""


def _print(rows, workload, device, console, Table, mode: str = "model", idle: str = "") -> None:
    from vlaperf.timing import device_label

    t = Table(title=f"vlaperf matrix  {workload.id}  ({mode} mode, {device_label(device)}; interleaved{idle}; "
                    "speedup = reference median / variant median)")
    for col in ("variant", "median ms", "p95 ms", "event ms", "speedup", "p10..p90", "rel L2", "first call s", "process peak GiB"):
        t.add_column(col, overflow="fold")  # a long variant name wraps, never cut
    from vlaperf.report.document import table_names

    notes = []
    # each lever's own short name, the compile mode kept: cutting every name to 4 letters printed the grid's
    # exact+compile=default and exact+compile=reduce-overhead rows alike ('...+fuse+comp')
    names = table_names([r["variant"] for r in rows], 60)
    for r, name in zip(rows, names):
        if "timers" not in r:  # the reason below the table: in a timing column it widened every row
            notes.append(f"[{len(notes) + 1}] {name}: {r.get('skipped', '')}")
            # a row that failed its check (or was prepared before an interrupt) keeps its error and first call:
            # the error is why it has no speed
            eq = r.get("equivalence")
            t.add_row(name, f"skipped [{len(notes)}]", *[""] * 4, f"{eq['rel_l2']:.1e}" if eq else "",
                      f"{r['first_call_s']:.2f}" if "first_call_s" in r else "", "")
            continue
        w, e, q = r["timers"]["wall_ms"], r["timers"]["cuda_event_ms"], r["ratio"]["wall_ms"]
        eq = r["equivalence"]
        t.add_row(name, f"{w['median']:.3f}", f"{w['p95']:.3f}", f"{e['median']:.3f}" if e else "-",
                  f"{q['speedup']:.2f}x" + ("" if q["significant"] or r["variant"] == "reference" else " (noise)"),
                  f"{q['ratio_p10']:.2f}..{q['ratio_p90']:.2f}", f"{eq['rel_l2']:.1e}" if eq else "-",
                  f"{r['first_call_s']:.2f}", f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") else "-")
    console.print(t)
    for note in notes:
        console.print(note)
    if any(r.get("peak_memory_bytes") for r in rows):
        # every variant's engine lives in this one process: the peak counts them all (vlaperf bench: one alone)
        console.print("process peak GiB: the allocator's peak over a variant's first call (compile, capture) and "
                      "warm-up, with every "
                      "variant's engine held in this process; `vlaperf bench` gives one variant's own")



