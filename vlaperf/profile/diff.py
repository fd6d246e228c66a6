"""Two `bench` (or two `breakdown`) files of one workload, before and after a change: `vlaperf diff BEFORE AFTER`.

Two files are two processes, so their medians differ by the process as well as by the code: on the lent H200 two
fresh processes of the same code differed by up to 25% in the served path's host stages (docs/perf-notes.md, session
43). What a diff can say depends on what the files hold:

- each file's own samples give the sampling noise of its median: a bootstrap interval of the ratio of medians
  (resampling each file's calls; it knows nothing of the process-to-process spread);
- files of `bench --processes N` give the spread itself: the per-process medians of the two sides, whether every
  process of one side was faster than every process of the other, and the exact Mann-Whitney p of that ordering.

A change is "beyond the process spread" only with the second. With one process a side the diff says the spread is
unknown. Two breakdown files are also compared stage by stage (each stage's median; with `--processes` files each
stage's per-process medians too), which says where a change in the whole call came from. Two variants compared in one process, interleaved, remain the stronger test (`vlaperf matrix`).

Torch-free: it reads result files only.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

# the fields two files must share for their medians to be comparable: (where, how the message names it); a world-action
# file's effective `workload.settings` too, where both files record them (older files do not)
SAME = (("workload.id", "workload"), ("workload.overrides", "workload overrides"), ("mode", "mode"),
        ("variant.dtype", "dtype"), ("env.gpu", "GPU"))
BOOTSTRAP_RESAMPLES = 2000
# a change is beyond the process spread when the two sides' processes are separated and the exact p of that is this
# or less: 3 against 3 processes can never reach it (p = 0.1 at best), 4 against 4 can (0.029)
SIGNIFICANCE = 0.05
# exact Mann-Whitney p by enumerating the orderings up to this many (C(20, 10) = 184756), a normal approximation above
EXACT_LIMIT = 200_000


def _get(r: dict, where: str):
    value = r
    for part in where.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def mismatches(before: dict, after: dict) -> list[str]:
    """What differs between two result files that makes their medians incomparable, in words (empty: comparable)."""
    fields = SAME
    if _get(before, "workload.settings") is not None and _get(after, "workload.settings") is not None:
        fields += (("workload.settings", "workload settings"),)
    out = []
    for where, name in fields:
        a, b = _get(before, where), _get(after, where)
        if isinstance(a, dict) and isinstance(b, dict):  # name only the keys that differ
            keys = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
            a, b = {k: a.get(k) for k in keys if k in a}, {k: b.get(k) for k in keys if k in b}
        if a != b:
            out.append(f"{name} differ{'' if name.endswith('s') else 's'}: {_show(a, where)} before, "
                       f"{_show(b, where)} after")
    # `bench --rtc` times the guided call of real-time chunking, another workload: its settings, not its measurements
    a, b = rtc_settings(before), rtc_settings(after)
    if a != b:
        out.append(f"real-time chunking (bench --rtc) differs: {_rtc_words(a)} before, {_rtc_words(b)} after")
    # `breakdown --idle-ms` times every call, the file's timers included, after the idle: the idle's cost is no change
    # (h100's s49 breakdowns of one commit, back to back and 50 ms idle, differed by +5.1%: a failed --max-slowdown 5)
    a, b = idle_cadence(before), idle_cadence(after)
    if a != b:
        out.append(f"idle before each call differs: {a} before, {b} after")
    return out


def idle_cadence(r: dict) -> str:
    """How a breakdown file's calls were spaced, in words: "back to back", "50 ms idle" or "50 ms spinning"
    (`--idle-ms`, `--idle-spin`). Files from before `--idle-ms` record no idle_ms: back to back. A bench file's timers
    are back to back whatever its `--idle-ms` (the idle copy is timed after them, under `idle`)."""
    bd = r.get("breakdown") if r.get("command") == "breakdown" else None
    ms = (bd or {}).get("idle_ms") or 0
    if not ms:
        return "back to back"
    return f"{ms:g} ms {'spinning' if bd.get('idle_spin') else 'idle'}" if isinstance(ms, (int, float)) else repr(ms)


def _show(x, where: str = "") -> str:
    if isinstance(x, dict):  # overrides, settings
        return ", ".join(f"{k}={v}" for k, v in sorted(x.items())) or "none"
    if x is None:
        return "none (cpu)" if where == "env.gpu" else "none"
    return str(x)


# what a `bench --rtc` file's guided call was asked to do (its `rtc` also holds measurements: vs_unguided)
RTC_SETTINGS = ("execution_horizon", "max_guidance_weight", "schedule", "delay")


def rtc_settings(r: dict) -> dict | None:
    """The settings of a `bench --rtc` file's guided call; None for a file that timed the unguided call."""
    rtc = r.get("rtc")
    return {k: rtc.get(k) for k in RTC_SETTINGS} if isinstance(rtc, dict) and rtc else None


def _rtc_words(settings: dict | None) -> str:
    return "not guided" if settings is None else f"guided ({_show(settings)})"


def timer_problem(r: dict) -> str | None:
    """A timer whose median cannot be compared (zero, negative or not a number), in words; None if all can."""
    for name, t in (r.get("timers") or {}).items():
        median = t.get("median") if isinstance(t, dict) else None
        if t and not (isinstance(median, (int, float)) and not isinstance(median, bool) and median > 0):
            return f"timers.{name}.median is {median!r}, expected a positive number of ms"
    return None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def content_problem(r: dict) -> str | None:
    """What of a file's samples or (breakdown) stages the diff cannot do arithmetic on, naming the field and what was
    expected; None if it can. The report checks a bench file's samples, but not a breakdown's, nor a stage's name and
    median: a damaged one ended the diff in a traceback (a TypeError, a KeyError) instead of an error naming it."""
    samples = r.get("samples")
    if samples is not None and not isinstance(samples, dict):
        return "samples: expected an object of arrays of numbers"
    for timer, xs in (samples or {}).items():
        if xs is not None and (not isinstance(xs, list) or not all(_is_number(x) for x in xs)):
            return f"samples.{timer}: expected an array of numbers (or null)"
    if r.get("command") != "breakdown":
        return None
    for i, entry in enumerate(r["breakdown"]["stages"]):  # an array of objects: the report's field_problem checked
        if not isinstance(entry.get("name"), str):
            return f"breakdown.stages[{i}].name: expected a string, got {entry.get('name')!r}"
        if not _is_number(entry.get("median_ms")):
            return f"breakdown.stages[{i}].median_ms: expected a number of ms, got {entry.get('median_ms')!r}"
    return None


def bootstrap_ratio(before: list[float], after: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = 0) -> tuple[float, float]:
    """The 95% interval of median(before) / median(after) from resampling each side's calls (a fixed seed: the same
    files give the same interval)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        a = statistics.median(rng.choices(before, k=len(before)))
        b = statistics.median(rng.choices(after, k=len(after)))
        ratios.append(a / b if b > 0 else math.inf)
    ratios.sort()
    return ratios[int(0.025 * (resamples - 1))], ratios[int(math.ceil(0.975 * (resamples - 1)))]


def _midranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney_p(before: list[float], after: list[float]) -> float:
    """Two-sided p of the Mann-Whitney test that the two sides' values come from one distribution: exact (every
    split of the pooled midranks) up to EXACT_LIMIT splits, else the normal approximation."""
    n, m = len(before), len(after)
    ranks = _midranks(before + after)
    observed = sum(ranks[:n])
    mean = n * (n + m + 1) / 2
    if math.comb(n + m, n) <= EXACT_LIMIT:
        distance = abs(observed - mean) - 1e-9
        splits = extreme = 0
        for chosen in itertools.combinations(ranks, n):
            splits += 1
            extreme += abs(sum(chosen) - mean) >= distance
        return extreme / splits
    sd = math.sqrt(n * m * (n + m + 1) / 12)
    z = (abs(observed - mean) - 0.5) / sd
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def process_medians(r: dict) -> list[float] | None:
    """The per-process wall-clock medians of a `--processes N` file (None: one process)."""
    runs = (r.get("processes") or {}).get("runs")
    if not runs or len(runs) < 2:
        return None
    return [run["timers"]["wall_ms"]["median"] for run in runs]


def other_machine(before: dict, after: dict) -> str | None:
    """Why the two files ran on different machines, in words (None: the same one, or the files cannot tell): the
    GPU's uuid where both files record it, else the host's name (a container's, where it runs in one). Then the
    machine-to-machine spread adds to the process spread, and `--processes` on each side measures only the latter."""
    for what, read in (("GPU", lambda r: ((r.get("env") or {}).get("gpu_state") or {}).get("uuid")),
                       ("host", lambda r: (r.get("env") or {}).get("hostname"))):
        a, b = read(before), read(after)
        if a and b:
            return f"the files ran on different {what}s ({a} before, {b} after)" if a != b else None
    return None


def compare_processes(before: list[float], after: list[float]) -> dict:
    """Two sides' per-process medians: their ordering in words, whether they are separated, the exact p of that and
    whether the change is beyond the process spread."""
    direction = "faster" if max(after) < min(before) else "slower" if max(before) < min(after) else None
    order = (f"every after process {direction} than every before process" if direction
             else "the two sides' processes overlap")
    p = mann_whitney_p(before, after)
    return {"before_ms": before, "after_ms": after, "ordering": order, "direction": direction,
            "separated": direction is not None, "mann_whitney_p": p,
            "beyond_spread": direction is not None and p <= SIGNIFICANCE}


def stage_diff(before: dict, after: dict) -> list[dict]:
    """Two breakdown files' stages, before's order then stages only after has: each one's medians (None where a file
    lacks the stage), after's change in percent, and with `--processes` files the per-process comparison."""
    sa = {e["name"]: e["median_ms"] for e in (before.get("breakdown") or {}).get("stages") or []}
    sb = {e["name"]: e["median_ms"] for e in (after.get("breakdown") or {}).get("stages") or []}
    runs_a = [run.get("stages_ms") or {} for run in (before.get("processes") or {}).get("runs") or []]
    runs_b = [run.get("stages_ms") or {} for run in (after.get("processes") or {}).get("runs") or []]
    rows = []
    for name in dict.fromkeys([*sa, *sb]):
        a, b = sa.get(name), sb.get(name)
        row = {"stage": name, "before_ms": a, "after_ms": b,
               "change_pct": 100.0 * (b / a - 1.0) if a and b is not None else None, "processes": None}
        pa = [run[name] for run in runs_a if name in run]
        pb = [run[name] for run in runs_b if name in run]
        if len(pa) >= 2 and len(pb) >= 2:
            row["processes"] = compare_processes(pa, pb)
        rows.append(row)
    return rows


def diff(before: dict, after: dict) -> dict:
    """Each timer both files hold (medians, after's change in percent, speed-up = before / after, the bootstrap
    interval of that ratio where both files hold their samples), the process comparison where both files are of
    `--processes N`, and for two breakdowns each stage's (`stages`; None for bench files)."""
    timers = {}
    for name, a in (before.get("timers") or {}).items():
        b = (after.get("timers") or {}).get(name)
        if not a or not b:
            continue
        row = {"before_ms": a["median"], "after_ms": b["median"], "speedup": a["median"] / b["median"],
               "change_pct": 100.0 * (b["median"] / a["median"] - 1.0)}
        sa, sb = (before.get("samples") or {}).get(name), (after.get("samples") or {}).get(name)
        if sa and sb and len(sa) >= 2 and len(sb) >= 2:
            row["speedup_interval_95"] = bootstrap_ratio(sa, sb)
        timers[name] = row
    out: dict = {"command": before.get("command"), "timers": timers, "processes": None,
                 "other_machine": other_machine(before, after),
                 "stages": stage_diff(before, after) if before.get("command") == "breakdown" else None}
    pa, pb = process_medians(before), process_medians(after)
    out["process_counts"] = [len(pa) if pa else 1, len(pb) if pb else 1]
    if pa and pb:
        out["processes"] = compare_processes(pa, pb)
    return out


def verdict(d: dict) -> str:
    """One sentence on what the diff can and cannot say about the wall-clock change."""
    wall = d["timers"].get("wall_ms")
    if wall is None:
        return "no wall-clock timer in both files"
    change = f"{wall['change_pct']:+.1f}% ({wall['speedup']:.3f}x)"
    if d.get("other_machine"):
        return (f"wall median {change}; {d['other_machine']}: the machines' difference is in it, which neither "
                "file's processes measure (bench both sides on one machine)")
    p = d["processes"]
    if p is None:
        n_before, n_after = d.get("process_counts") or (1, 1)
        if n_before == n_after == 1:
            return (f"wall median {change}; one process on a side, so the process-to-process spread is unknown: run "
                    f"both with `{d.get('command') or 'bench'} --processes 4` (or compare the variants in one process "
                    "with `vlaperf matrix`)")
        single = "before" if n_before == 1 else "after"
        return (f"wall median {change}; {n_before} process{'es' if n_before > 1 else ''} before, {n_after} after, so "
                f"the spread cannot be compared: run the {single} side with `{d.get('command') or 'bench'} "
                f"--processes {max(n_before, n_after)}` too")
    weight = f"{len(p['before_ms'])} against {len(p['after_ms'])} processes, Mann-Whitney p = {p['mann_whitney_p']:.3g}"
    if p["beyond_spread"]:
        return f"wall median {change}, beyond the process spread: {p['ordering']} ({weight})"
    if p["separated"]:
        return (f"wall median {change}: {p['ordering']}, but so few processes order themselves so by chance too "
                f"({weight}; 4 against 4 processes can reach p = 0.029)")
    return f"wall median {change}, within the process spread: {p['ordering']} ({weight})"
