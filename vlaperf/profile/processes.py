"""One figure from several fresh processes: `vlaperf bench --processes N` (and `vlaperf breakdown --processes N`).

A median is a property of the process as well as of the code. On the lent H200 the served path's host stages
(transform, upload, copy back) of the same code differed by +-25% between two fresh processes on one machine, more
than two commits differed (docs/perf-notes.md, session 43). One process's median cannot show that; N processes run one
after another (never at once: they would share the GPU) give the spread, and the figure the file reports is the
process in the middle of them, not the best one.

Each process is the same `vlaperf bench` (or `breakdown`) command with `--processes 1` and its own `--json` in a
temporary folder (the options given later on a command line win in argparse), so it builds, checks and times exactly
as a single run does, first call included: the first process compiles with cold caches, the later ones find the compile caches warm. A
breakdown's processes also keep each stage's median, so the spread is per stage (the host stages are where it was).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The per-process fields the combined file keeps (the raw samples stay with the headline process only).
RUN_FIELDS = ("first_call_s", "warmup_s", "peak_memory_bytes")


def headline_index(medians: list[float]) -> int:
    """The process the combined file reports: the one whose wall-clock median is the median of all of them (the
    lower middle one for an even count, so the figure is one a process measured, not an average of two)."""
    target = statistics.median_low(medians)
    return medians.index(target)


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / median of `values`, in percent (None where the median is 0): the one spread of this module."""
    middle = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / middle if middle > 0 else None


def combine(results: list[dict]) -> dict:
    """The headline process's result with a `processes` record of every process: its timers and first call, and the
    spread of the wall-clock medians (min, median, max and (max - min) / median in percent)."""
    if not results:
        raise ValueError("combine needs at least one result")
    medians = [r["timers"]["wall_ms"]["median"] for r in results]
    pick = headline_index(medians)
    middle = statistics.median(medians)
    combined = dict(results[pick])
    combined["processes"] = {
        "count": len(results),
        "headline": pick,
        "headline_rule": "the process whose wall-clock median is the median of the processes' (the lower middle one "
                         "for an even count)",
        "wall_median_ms": {"min": min(medians), "median": middle, "max": max(medians)},
        "spread_pct": spread_pct(medians) or 0.0,
        "runs": [_run(r) for r in results],
    }
    return combined


def _run(r: dict) -> dict:
    """What the combined file keeps of one process: its timers and first call, its check, its commit, time and GPU
    state, and a breakdown's stage medians (`stages_ms`, in the breakdown's order) with that process's own checks
    of them: `coverage` (its instrumented call's median over its untimed one's) and `matches_reference` (whether its
    staged call reproduced the untimed one exactly). Kept for the headline alone, a process whose stages were not
    its call's (a coverage of 372% on a loaded machine) stood in the per-stage spread with nothing to say so."""
    run = {"timers": r["timers"], **{k: r.get(k) for k in RUN_FIELDS},
           "rel_l2": (r.get("equivalence") or {}).get("rel_l2"),
           # gpu_state: its GPU's clocks, power and temperature after its timed calls, the state that moves between
           # processes (only the headline's whole env is kept)
           **{k: (r.get("env") or {}).get(k) for k in ("git_commit", "timestamp", "gpu_state")}}
    bd = r.get("breakdown") or {}
    if bd.get("stages") is not None:
        run["stages_ms"] = {e["name"]: e["median_ms"] for e in bd["stages"]}
        run["coverage"] = bd.get("coverage")
        run["matches_reference"] = (bd.get("matches_reference") or {}).get("exact")
    return run


def stage_rows(processes: dict) -> list[tuple[str, list[float | None], float | None]]:
    """A breakdown's stages across its processes: (stage, each process's median or None where it lacked the stage,
    (max - min) / median of them in percent or None), in the first process's order, then stages only later ones had."""
    runs = [run.get("stages_ms") or {} for run in processes["runs"]]
    names = list(dict.fromkeys(name for stages in runs for name in stages))
    rows = []
    for name in names:
        medians = [stages.get(name) for stages in runs]
        rows.append((name, medians, spread_pct([m for m in medians if m is not None])))
    return rows


def process_problem(processes) -> str | None:
    """Why a file's `processes` record cannot be read (None: it can, or the file has none): the report and
    performance.md do arithmetic on its medians."""
    from vlaperf.report.schema import json_kind, validate_summary

    if processes is None:
        return None
    if not isinstance(processes, dict):
        return f"processes: expected an object, got {json_kind(processes)}"
    runs = processes.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(x, dict) for x in runs):
        return "processes.runs: expected a non-empty array of objects"
    if processes.get("count") != len(runs):
        return f"processes.count: expected the number of runs ({len(runs)}), got {processes.get('count')!r}"
    headline = processes.get("headline")
    if isinstance(headline, bool) or not isinstance(headline, int) or not 0 <= headline < len(runs):
        return f"processes.headline: expected the index of a run (0..{len(runs) - 1}), got {headline!r}"
    for i, run in enumerate(runs):
        timers = run.get("timers")
        if not isinstance(timers, dict):
            return f"processes.runs[{i}].timers: expected an object, got {json_kind(timers)}"
        errors = validate_summary(timers.get("wall_ms"), f"processes.runs[{i}].timers.wall_ms")
        if errors:
            return errors[0]
        stages = run.get("stages_ms")
        if stages is not None and (not isinstance(stages, dict)
                                   or any(json_kind(v) != "number" for v in stages.values())):
            return f"processes.runs[{i}].stages_ms: expected an object of numbers (a stage's median ms)"
    spread = processes.get("wall_median_ms")
    numbers = [spread.get(k) for k in ("min", "median", "max")] if isinstance(spread, dict) else [None]
    if any(json_kind(x) != "number" for x in numbers):
        return "processes.wall_median_ms: expected an object of numbers min, median and max"
    if json_kind(processes.get("spread_pct")) != "number":
        return f"processes.spread_pct: expected a number, got {json_kind(processes.get('spread_pct'))}"
    return None


# Processes whose medians differ by this much or more disagree beyond what one process's figure can stand for (an
# H100's host-bound reference: 211-335 ms in three): the console says so and the standing tables print the range
WIDE_SPREAD_PCT = 5.0


def describe(processes: dict) -> str:
    """One line for a table cell or a console: '3 processes, medians 12.80-13.10 ms (2.3% spread)'."""
    s = processes["wall_median_ms"]
    return (f"{processes['count']} processes, medians {s['min']:.2f}-{s['max']:.2f} ms "
            f"({processes['spread_pct']:.1f}% spread)")


def in_processes(argv: list[str], count: int, json_path: str | None) -> int:
    """Run the `vlaperf bench` or `breakdown` command `argv` (as typed, without the program name) in `count` fresh
    processes, one after another; print the processes' table and write the combined result to `json_path`. Returns
    the exit code: a process that fails (an equivalence failure: 1, bad setup: 2) stops the run with its code, one
    ended by a signal with 128 + its number, as a shell gives it."""
    # A SIGTERM while no process runs (between two, while a result is read): the default action ended this process
    # at once and left the temporary folder behind; one in the instant a process had ended was forwarded to it and
    # lost, and the next process started. Recorded here, it stops the run as one sent during a process does.
    stop_requested = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(signum))
    try:
        return _run_processes(argv, count, json_path, stop_requested)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_processes(argv: list[str], count: int, json_path: str | None, stop_requested: list[int]) -> int:
    """in_processes' run, with `stop_requested` filled by its SIGTERM handler."""
    from vlaperf.cli import STOPPED_BY_SIGTERM
    from vlaperf.report.schema import read_result, write_result

    command = argv[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="vlaperf-processes-") as folder:
        for i in range(count):
            if stop_requested:
                print(f"vlaperf {command}: stopped by SIGTERM after process {i} of {count}; nothing written",
                      file=sys.stderr)
                return STOPPED_BY_SIGTERM
            path = Path(folder) / f"process{i}.json"
            print(f"vlaperf {command}: process {i + 1} of {count}", flush=True)
            # Later options win: --processes 1 keeps the child from starting processes of its own.
            code = run_child([sys.executable, "-m", "vlaperf.cli", *argv, "--processes", "1", "--json", str(path)])
            if code in (-signal.SIGTERM, STOPPED_BY_SIGTERM):
                print(f"vlaperf {command}: stopped by SIGTERM in process {i + 1} of {count}; nothing written",
                      file=sys.stderr)
                return STOPPED_BY_SIGTERM
            if code < 0:
                # Ended by another signal (SIGKILL: the kernel's out-of-memory killer): returned as it was, -9 left
                # the program with status 247, and "exited with code -9" named no signal.
                print(f"vlaperf {command}: process {i + 1} of {count} was ended by signal {signal_name(-code)}; "
                      "stopping", file=sys.stderr)
                return 128 - code
            if code != 0:
                print(f"vlaperf {command}: process {i + 1} of {count} exited with code {code}; stopping",
                      file=sys.stderr)
                return code
            results.append(read_result(path))
        if stop_requested:
            print(f"vlaperf {command}: stopped by SIGTERM after process {count} of {count}; nothing written",
                  file=sys.stderr)
            return STOPPED_BY_SIGTERM
    combined = combine(results)
    print_processes(combined)
    if json_path:
        write_result(combined, json_path)
        print(f"wrote {json_path}")
    return 0


def signal_name(signum: int) -> str:
    """'SIGKILL (9)', or the number alone for one this platform has no name for."""
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return str(signum)


def run_child(cmd: list[str]) -> int:
    """Run `cmd` to its end and return its exit code (negative: the signal that ended it). A SIGTERM sent to this
    process alone (a scheduler stopping the job by its pid) is passed on, and an interrupt kills the child: a bench
    must not go on running on the GPU after the command that started it has stopped."""
    child = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _forward(child, previous, signum, frame))
    try:
        return child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _forward(child: subprocess.Popen, previous, signum: int, frame) -> None:
    """Pass a SIGTERM to the child, and to the handler it replaced (in_processes records it: a child that had just
    ended gets nothing from send_signal, and the stop was lost)."""
    child.send_signal(signum)
    if callable(previous):
        previous(signum, frame)


def _coverage_cell(run: dict) -> str:
    """'98.7%', and ', NOT exact' where the process's staged call did not reproduce its untimed one."""
    cell = f"{100 * run['coverage']:.1f}%" if run.get("coverage") is not None else "-"
    return cell + (", NOT exact" if run.get("matches_reference") is False else "")


def print_processes(result: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    from vlaperf.cli import wide_console
    from vlaperf.report.document import short_variant

    processes = result["processes"]
    label = short_variant(result["variant"]["label"])  # best's whole label wrapped the title over three lines
    console = wide_console()
    if any("stages_ms" in run for run in processes["runs"]):
        # each title a line of its own: a table's title wraps at the table's width
        console.print(Text(f"vlaperf breakdown  {result['workload']['id']}  {label}  ({result['mode']} mode): stage "
                           f"medians in {processes['count']} processes", style="bold"))
        stages = Table()
        for name in ("stage", *(f"process {i + 1} ms" for i in range(processes["count"])), "spread"):
            stages.add_column(name, justify="left" if name == "stage" else "right")
        for name, medians, spread in stage_rows(processes):
            stages.add_row(name, *(f"{m:.3f}" if m is not None else "-" for m in medians),
                           f"{spread:.1f}%" if spread is not None else "-")
        console.print(stages)
    console.print(Text(f"vlaperf {result['command']}  {result['workload']['id']}  {label}  ({result['mode']} mode): "
                       f"{processes['count']} processes", style="bold"))
    t = Table()
    checked = any(run.get("rel_l2") is not None for run in processes["runs"])  # bench's check; breakdown has none
    covered = any("coverage" in run for run in processes["runs"])  # a breakdown's: its stages against its call
    for name in (("process", "wall median ms", "wall p95 ms", "event median ms", "first call s") + ("rel L2",) * checked
                 + ("stages / untimed",) * covered):
        t.add_column(name, justify="right")
    for i, run in enumerate(processes["runs"]):
        wall, events = run["timers"]["wall_ms"], run["timers"].get("cuda_event_ms")
        mark = " (reported)" if i == processes["headline"] else ""
        t.add_row(f"{i + 1}{mark}", f"{wall['median']:.3f}", f"{wall['p95']:.3f}",
                  f"{events['median']:.3f}" if events else "-", f"{run['first_call_s']:.2f}",
                  *([f"{run['rel_l2']:.1e}" if run.get("rel_l2") is not None else "-"] if checked else []),
                  *([_coverage_cell(run)] if covered else []))
    console.print(t)
    console.print(describe(processes) + "; the file reports the middle process, its samples and environment")
    if processes["spread_pct"] >= WIDE_SPREAD_PCT:
        console.print(f"note: the processes disagree by {processes['spread_pct']:.1f}% (from {WIDE_SPREAD_PCT:g}%, "
                      "beyond what one process's figure stands for): quote the range, and compare a change with "
                      "--processes on both sides (`vlaperf diff`)")

