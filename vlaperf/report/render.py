"""`render(result_paths, out_path)`: vlaperf result files -> one readable report.

    render(["results/bench_ref.json", "results/matrix.json"], "report.html")   # self-contained
    render(["results/"], "report.md")                # markdown + PNGs in report_files/

Reads result files of schema vlaperf.result/1 (a directory stands for the *.json files in it;
a file named twice is read once) and writes a summary (the newest bench file of each variant per
workload, device and mode, with its speed-up over the reference and a bar chart of them), a table
of the files, then per command:
- bench: the summary table (a row per file and timer, named by the file; the roofline floor
  when the file has one), latency histograms per file (at most 12 panels an image) and one
  CDF of all of them (raw samples; past 10 files the legend names 10, fastest to slowest);
- matrix: the table (median, p95, speedup with its p10..p90 spread, equivalence), a
  heatmap of speedup per variant x lever, and per-variant latency CDFs drawn from the
  summary percentiles (matrix files keep summaries, not raw samples; the plot says so);
- check: the equivalence table;
- breakdown: a stage bar chart (median, p95 whisker), the table and the coverage statement;
- scaling: T(N) points and fitted lines, the fit table;
- syncs / doctor: their tables;
- loadgen / rollout: the server under load; a control loop against it, per episode;
- the probes and A/B files of benchmarks/ (vlaperf.report.probes);
- the environment: keys equal in every file once, the others a row per value with its files.
A file that is unreadable, not a valid result (schema.validate_result), lacks a field its
renderer needs (field_problem) or makes its renderer fail is listed as skipped with the
reason; the other files are rendered.
HTML embeds the plots as base64 PNG and needs no server or script; markdown writes
the PNGs into "<name>_files/" beside it. Plots need matplotlib (`pip install "vlaperf[plots]"`);
without it the report has every table and says that its plots were left out.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any, Callable

from vlaperf.report import probes
from vlaperf.report.document import (COLORS, LEVER_ABBREVIATIONS, Doc, cell, clip, fixed_margins, gpu_name,
                                      new_figure, pct, plots_available, sci, short_variant, workload_label)
from vlaperf.report.schema import MissingField, SchemaError, json_kind, located, read_result, unwritable

_LEVER_ORDER = ("for_loop", "skip_masked_images", "trim_prompt_padding", "static_kv_cache", "sdpa", "fuse_projections",
                "cuda_graph", "compile")


def idle_words(ms: float, spin: bool = False) -> str:
    """How a file's idle (`--idle-ms`) reads: "50 ms idle", or "50 ms spinning" (`--idle-spin`: busy on the clock, not
    asleep)."""
    return f"{ms:g} ms {'spinning' if spin else 'idle'}"


def cadence_words(ro: dict) -> str | None:
    """How a rollout file's loop calls read against its closed-loop ones after the episodes (`rollout --back-to-back`,
    files from session 50 on), for the CLI and the reports alike; None without them."""
    b2b, ratio = ro.get("back_to_back"), ro.get("at_cadence_over_back_to_back")
    if not b2b or not ratio or ratio.get("policy_call_ms") is None:
        return None
    loop, base = ro["policy_call_ms"]["median"], b2b["policy_call_ms"]["median"]
    text = (f"at {ro['control_hz']:g} Hz a call's round trip took {loop:.2f} ms (median) against {base:.2f} ms in "
            f"{b2b['calls_per_episode']} closed-loop calls after each episode: {ratio['policy_call_ms']:.3f}x")
    if ratio.get("server_infer_ms") is not None:
        text += (f"; the server's own time {ro['server_infer_ms']['median']:.2f} against "
                 f"{b2b['server_infer_ms']['median']:.2f} ms, {ratio['server_infer_ms']:.3f}x")
    text += " (the idle between a control loop's calls; docs/profiling.md)"
    extra = ro.get("at_cadence_extra_ms") or {}  # files from session 51 on
    if all(extra.get(k) is not None for k in ("policy_call_ms", "server_infer_ms", "server_queue_ms", "front_end_ms")):
        text += (f"; the medians' differences: round trip {extra['policy_call_ms']:+.2f} ms, the server's policy call "
                 f"{extra['server_infer_ms']:+.2f}, the wait for its inference thread {extra['server_queue_ms']:+.2f}, "
                 f"the rest (client, network, event loop) {extra['front_end_ms']:+.2f}")
        if extra.get("server_handoff_ms") is not None and extra.get("client_side_ms") is not None:
            text += (f", of which the event loop's wake-up for the result {extra['server_handoff_ms']:+.2f} and what "
                     f"is outside the server {extra['client_side_ms']:+.2f}")
            if extra.get("uplink_ms") is not None and extra.get("downlink_ms") is not None:  # session 52 on
                own = extra.get("client_pack_ms") is not None and extra.get("client_unpack_ms") is not None
                text += (f" (the request's way to the server {extra['uplink_ms']:+.2f}"
                         + (f", its packing {extra['client_pack_ms']:+.2f}" if own else "")
                         + f"; the reply's way back {extra['downlink_ms']:+.2f}"
                         + (f", its unpacking {extra['client_unpack_ms']:+.2f}" if own else "") + ")")
    return text


def keep_warm_setting_words(ro: dict, srv: dict) -> str:
    """A rollout's keep-warm at both ends, to follow the server's description: the server's runs (--keep-warm-ms,
    quiet or not) and the client's pings (--client-keep-warm-ms); "" where neither ran. For the CLI and reports."""
    text = ""
    if srv.get("keep_warm_ms"):
        text += f", keep-warm every {srv['keep_warm_ms']:g} ms"
        text += ", quiet where a request was due" if srv.get("keep_warm_quiet") else ""
    if ro.get("client_keep_warm_ms"):
        text += (f"; the client pinged every {ro['client_keep_warm_ms']:g} ms between calls "
                 f"({ro.get('client_keep_warm_pings')} pings)")
    return text


# at most this many of an episode's calls that waited for a keep-warm run are named: enough to tell waits at the
# episode's start from waits spread through it; the file keeps them all
WAITED_AT_SHOWN = 8


def keep_warm_wait_words(ro: dict) -> str | None:
    """How many of a rollout's calls at cadence waited for one of the server's keep-warm runs (servers with
    --keep-warm-ms from session 53 on), for the CLI and the reports alike; None where the server did not say."""
    waited, wait = ro.get("keep_warm_waited_calls"), ro.get("keep_warm_wait_ms")
    if waited is None or not wait:
        return None
    at, after_overrun = [], 0
    for e in ro.get("per_episode") or []:
        calls = e.get("keep_warm_waited_at")
        if calls:
            more = f" and {len(calls) - WAITED_AT_SHOWN} more" if len(calls) > WAITED_AT_SHOWN else ""
            at.append(f"{e.get('episode')}: {', '.join(map(str, calls[:WAITED_AT_SHOWN]))}{more}")
            overran = set(e.get("overran_at") or ())  # files from session 56 on
            after_overrun += sum(c - 1 in overran for c in calls)
    return (f"{waited} of {wait['count']} calls at cadence arrived during one of the server's keep-warm runs and "
            f"waited for it" + (f" (at most {wait['max']:.2f} ms)" if waited else "")
            + (f"; which, by episode (its calls counted from 0): {'; '.join(at)}" if at else "")
            + (f"; {after_overrun} of them the call after one that overran its step (the loop came late)"
               if after_overrun else ""))


def _label(r: dict) -> str:
    v = r.get("variant") or {}
    label = v.get("label") or "reference"
    return f"{short_variant(label)} [{r.get('mode') or '-'}]"


def _on_device(r: dict) -> str:
    """Where a file ran as its group's name says it: "on cpu", "on NVIDIA H200", with " in float32" where the dtype is
    not the device's default (bfloat16 on a GPU, float32 on the CPU, the CLI's --dtype defaults). Files of two dtypes
    are two computations: a bf16 tiny file read "1.24x vs reference" against a float32 reference, neither dtype
    named."""
    dtype = (r.get("variant") or {}).get("dtype")
    default = "bfloat16" if (r.get("env") or {}).get("gpu") else "float32"
    return f"on {gpu_name(r)}" + (f" in {dtype}" if dtype and dtype != default else "")


def _gpu_state(r: dict) -> str:
    """The GPU's clocks, power and temperature when the record was taken (newer files only)."""
    from vlaperf.gpu_state import describe_gpu_state

    return describe_gpu_state((r.get("env") or {}).get("gpu_state"))


def load_results(paths) -> tuple[list[tuple[str, dict]], list[str]]:
    """(path, result) for every valid file; problems (unreadable, invalid) as messages.

    A file named twice (a folder and a file in it, or two spellings of one path) is read once:
    counted twice, its samples would weigh twice in the figures."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        else:
            files.append(p)
    out, problems, seen = [], [], set()
    for f in files:
        key = f.resolve()
        if key in seen:
            continue
        seen.add(key)
        if f.exists() and not f.is_file():  # a FIFO or a device: reading it would wait for a writer, forever
            problems.append(f"{f}: not a regular file")
            continue
        try:  # (a trace or a config, not one of ours at all, is said in one line: schema.not_a_result)
            out.append((str(f), read_result(f)))
        except (OSError, ValueError, SchemaError, RecursionError) as e:  # RecursionError: JSON nested too deep
            problems.append(f"{f}: {_reason(e)}")
    return out, problems


def _reason(e: BaseException) -> str:
    """An exception as one short line for the "skipped" list."""
    text = " ".join(str(e).split())
    if isinstance(e, json.JSONDecodeError):
        text = "not valid JSON: " + text
    elif not isinstance(e, (SchemaError, OSError, MissingField)):
        text = f"{type(e).__name__}: {text}"
    return clip(text, 300)


def file_names(paths: list[str]) -> dict[str, str]:
    """How the report names each file: its name, or, where two files of different folders share
    a name, its path below the folder all of them are in (h200/x.json and h200x2/x.json)."""
    names = [Path(p).name for p in paths]
    if len(set(names)) == len(names):
        return dict(zip(paths, names))
    resolved = [Path(p).resolve() for p in paths]
    common = Path(os.path.commonpath([str(r.parent) for r in resolved]))
    return {p: str(r.relative_to(common)) for p, r in zip(paths, resolved)}


# What each renderer indexes without checking, so that a damaged file is skipped with a reason
# that names the field (the final guard in render() catches what this misses, with Python's
# words): dotted key -> "object" (a dict) or "objects" (a list of dicts).
REQUIRED_FIELDS = {
    "matrix": (("variants", "objects"),),
    "check": (("checks", "objects"),),
    "breakdown": (("breakdown", "object"), ("breakdown.stages", "objects")),
    "scaling": (("scaling", "object"), ("scaling.series", "objects")),
    "syncs": (("syncs", "object"), ("syncs.sites", "objects")),
    "doctor": (("findings", "objects"),),
    "loadgen": (("loadgen", "object"), ("loadgen.phases", "objects")),
    "rollout": (("rollout", "object"), ("rollout.per_episode", "objects")),
    "compare": (("compare", "object"), ("compare.equivalence", "object")),
}


def refusal_problem(refused) -> str | None:
    """Why a compare file's timing.accelerated.refused (`time_lerobot`'s record of an accelerated row the
    accelerator's check refused) cannot be worded, or None; absent or null: nothing was refused."""
    if refused is None:
        return None
    if not isinstance(refused, dict):
        return f"expected an object or null, got {json_kind(refused)}"
    for key in ("row", "message"):
        if not isinstance(refused.get(key), str):
            return f"{key}: expected a string, got {json_kind(refused.get(key))}"
    check = refused.get("check")
    if check is None:  # a refusal raised without its check's record: the message alone is said
        return None
    if not isinstance(check, dict):
        return f"check: expected an object or null, got {json_kind(check)}"
    if json_kind(check.get("tolerance")) != "number":
        return f"check.tolerance: expected a number, got {json_kind(check.get('tolerance'))}"
    for key in ("rel_l2", "max_abs"):  # null where the error was not finite (strict_json)
        if check.get(key) is not None and json_kind(check[key]) != "number":
            return f"check.{key}: expected a number or null, got {json_kind(check[key])}"
    return None


def field_problem(r: dict) -> str | None:
    """Why `r` (a valid result) cannot be rendered by its command's renderer, or None."""
    cmd = r["command"]
    for key, kind in REQUIRED_FIELDS.get(cmd, ()):
        value: Any = r
        for part in key.split("."):
            value = value.get(part)  # the parents were checked to be objects first
        if kind == "object" and not isinstance(value, dict):
            return f"{cmd}: {key} is {json_kind(value)}, expected an object"
        if kind == "objects":
            if not isinstance(value, list):
                return f"{cmd}: {key} is {json_kind(value)}, expected an array of objects"
            bad = [x for x in value if not isinstance(x, dict)]
            if bad:
                return f"{cmd}: {key} holds {json_kind(bad[0])} {clip(json.dumps(bad[0]), 40)}, expected objects"
    if cmd == "compare":  # the accelerator's refusal, which the section words from its fields
        timing = r.get("timing")
        acc = timing.get("accelerated") if isinstance(timing, dict) else None
        problem = refusal_problem(acc.get("refused")) if isinstance(acc, dict) else None
        if problem:
            return f"compare: timing.accelerated.refused: {problem}"
    if cmd in ("bench", "breakdown"):  # --processes N: the report reads every process's medians
        from vlaperf.profile.processes import process_problem

        problem = process_problem(r.get("processes"))
        if problem:
            return f"{cmd}: {problem}"
    if cmd == "bench":  # the histograms and CDFs sort and plot the raw samples
        samples = r.get("samples")
        if samples is not None and not isinstance(samples, dict):
            return f"bench: samples is {json_kind(samples)}, expected an object"
        for timer, xs in (samples or {}).items():
            if xs is None:
                continue
            if not isinstance(xs, list) or any(json_kind(x) != "number" for x in xs):
                return f"bench: samples.{timer} must be an array of numbers"
    return None


# ----------------------------------------------------------------- sections


# bench figures: histogram panels per image (a group of 100 files would otherwise be one image
# 8000 px tall) and CDF legend entries (more lines than that cannot be told apart by colour)
HIST_PANELS, HIST_COLS, CDF_LEGEND = 12, 3, 10
# worker processes for a report's figures: at most MAX_JOBS, and only for PARALLEL_MIN_UNITS sections or more (a
# spawned worker takes ~1 s to import matplotlib, more than a small report takes to draw)
MAX_JOBS, PARALLEL_MIN_UNITS = 8, 8


def result_batch(r: dict) -> int | None:
    """The batch a result ran: its settings or overrides, else its workload's (None for an unknown workload)."""
    from vlaperf.workloads import get_workload

    w = r.get("workload") or {}
    batch = (w.get("settings") or {}).get("batch") or (w.get("overrides") or {}).get("batch")
    if batch is None:
        try:
            batch = get_workload(str(w.get("id"))).batch
        except (KeyError, ValueError):
            return None
    return int(batch)


def bench_summary(results: list[tuple[str, dict]]) -> list[tuple[str, list[tuple[str, dict]]]]:
    """Per device (and dtype, _on_device), workload and mode, the newest `bench` file of each variant (by the
    timestamp its environment records; the later path when two have none), slowest first:
    [(group name, [(path, result), ...])]."""
    groups: dict[str, dict[str, tuple[str, dict]]] = {}
    for path, r in results:
        if r.get("command") != "bench" or not ((r.get("timers") or {}).get("wall_ms")):
            continue
        key = f"{workload_label(r)} {_on_device(r)}, {r.get('mode') or '-'} mode"
        label = (r.get("variant") or {}).get("label") or "reference"
        held = groups.setdefault(key, {}).get(label)
        stamp = (str((r.get("env") or {}).get("timestamp") or ""), path)
        if held is None or stamp >= (str((held[1].get("env") or {}).get("timestamp") or ""), held[0]):
            groups[key][label] = (path, r)
    return [(key, sorted(items.values(), key=lambda it: -it[1]["timers"]["wall_ms"]["median"]))
            for key, items in groups.items()]


def _summary(doc: Doc, results: list[tuple[str, dict]], names: dict[str, str]) -> None:
    """Where each variant stands, before the details: the newest bench file of each variant with its speed-up over
    the reference (no levers) of the same workload, device and mode where there is one, and a bar chart of those
    speed-ups per group of three or more variants."""
    groups = bench_summary(results)
    if not groups:
        return
    rows, charts = [], []
    for key, items in groups:
        ref = next((r for _, r in items if not (r.get("variant") or {}).get("levers")), None)
        ref_ms = ref["timers"]["wall_ms"]["median"] if ref else None
        for path, r in items:
            w = r["timers"]["wall_ms"]
            floor = (r.get("roofline") or {}).get("floor_ms") if (r.get("env") or {}).get("gpu") else None
            batch, eq = result_batch(r), r.get("equivalence") or {}
            rows.append([key, short_variant((r.get("variant") or {}).get("label") or ""), w["median"], w.get("p95"),
                         f"{ref_ms / w['median']:.2f}x" if ref_ms else None,
                         f"{w['median'] / floor:.2f}x" if floor else None,
                         # one forward (--mode forward) makes no action chunk
                         1e3 * batch / w["median"] if batch and r.get("mode") != "forward" else None, r.get("first_call_s"),
                         sci(eq["rel_l2"]) + ("" if eq.get("passed", True) else " (failed)") if "rel_l2" in eq
                         else "not checked" if (r.get("variant") or {}).get("levers") and r.get("equivalence") is None
                         else None,
                         str((r.get("env") or {}).get("timestamp") or "")[:10] or None, names.get(path, Path(path).name),
                         _process_cell(r)])
        if ref_ms and len(items) >= 3:
            charts.append((key, [(short_variant((r.get("variant") or {}).get("label") or ""),
                                  r["timers"]["wall_ms"]["median"], ref_ms) for _, r in items]))
    header = ["workload, device, mode", "variant", "median ms", "p95 ms", "vs reference", "x floor", "action chunks/s",
              "first call s", "rel L2", "measured", "file", "processes"]
    with_processes = any(row[-1] for row in rows)  # else no column of dashes
    if not with_processes:
        header, rows = header[:-1], [row[:-1] for row in rows]
    doc.h(2, "Summary")
    doc.p("The newest `vlaperf bench` file of each variant, per workload, device (and dtype where not the device's "
          "default) and mode, slowest first. vs reference: "
          "the reference's median over this one (two files, so two processes: a matrix compares in one). x floor: the "
          "median over the roofline floor of the file (GPU runs), at the ceilings it records: the H200's unless "
          "it measured its device's own (`--ceilings measure`). rel L2: the actions against the reference in the "
          "equivalence check that ran before the timing." + (
              " processes (files of `bench --processes N`): the count, the range of the processes' medians and its "
              "spread; the row is the middle process's." if with_processes else ""), "note")
    doc.table(header, rows)
    if not plots_available():
        return
    for key, bars in charts:
        fig, axes = new_figure(8.0, 0.9 + 0.32 * len(bars))
        ax = axes[0][0]
        # variants of one group share their first levers: keep the end of a long name, where they differ
        names_ = [n if len(n) <= 48 else "\u2026" + n[-47:] for n, _, _ in bars]
        values = [ref / ms for _, ms, ref in bars]
        ax.barh(range(len(bars)), values, color="#1f77b4")
        ax.set_yticks(range(len(bars)), names_, fontsize=7)
        ax.invert_yaxis()  # slowest (the reference, 1x) on top, as in the table
        for i, (v, (_, ms, _)) in enumerate(zip(values, bars)):
            ax.text(v, i, f" {v:.1f}x ({cell(float(ms))} ms)", va="center", fontsize=7)
        ax.set_xlim(0, max(values) * 1.3)
        ax.set_xlabel("speed-up over the reference (median over median)")
        ax.set_title(f"{key}: newest bench file of each variant", fontsize=9)
        fig.tight_layout()
        doc.fig(fig, f"speed-up over the reference, {key}")


def _process_cell(r: dict) -> str | None:
    """A `bench --processes N` file's spread for the summary: 'N: min-max ms (spread%)'; None for one process."""
    p = r.get("processes")
    if not p:
        return None
    s = p["wall_median_ms"]
    return f"{p['count']}: {s['min']:.3g}-{s['max']:.3g} ms ({p['spread_pct']:.1f}%)"


def _bench(doc: Doc, results: list[tuple[str, dict]], names: dict[str, str] | None = None) -> None:
    """Per workload and device: the summary table (a row per file and timer, the file named so
    that rows of one variant label can be told apart), histograms of the raw samples and one CDF.
    `names`: path -> how the report names the file (file_names); default the file's name."""
    names = names or {}
    stems = {p: names.get(p, Path(p).name).removesuffix(".json") for p, _ in results}
    groups: dict[str, list[tuple[str, dict]]] = {}
    for path, r in results:
        groups.setdefault(f"{workload_label(r)} {_on_device(r)}", []).append((path, r))
    for key, items in groups.items():
        doc.h(3, f"bench: {key}")
        rows = []
        for path, r in items:
            for timer, s in (r.get("timers") or {}).items():
                if not s:
                    continue
                # the floor is of the H200's ceilings: a yardstick for GPU runs only (a CPU run was "111482x")
                floor = (r.get("roofline") or {}).get("floor_ms") if (r.get("env") or {}).get("gpu") else None
                rows.append([stems[path], _label(r), timer, s["median"], s["p90"], s["p95"], s["p99"], s["min"], s["max"],
                             s["mean"], s["count"], r.get("first_call_s"),
                             (r.get("peak_memory_bytes") or 0) / 2**30 if r.get("peak_memory_bytes") else None,
                             floor, s["median"] / floor if floor and timer == "wall_ms" else None])
        doc.table(["file", "variant [mode]", "timer", "median ms", "p90", "p95", "p99", "min", "max", "mean", "n",
                   "first call s", "peak GiB", "roofline floor ms", "x floor"], rows)
        _bench_processes(doc, items, stems)
        _bench_idle(doc, items, stems)
        with_samples = [(p, r) for p, r in items if (r.get("samples") or {}).get("wall_ms")]
        if not with_samples or not plots_available():
            continue
        n = len(with_samples)
        for first in range(0, n, HIST_PANELS):
            _bench_histograms(doc, key, with_samples[first:first + HIST_PANELS], first, n, stems)
        _bench_cdf(doc, key, with_samples, stems)


def _bench_processes(doc: Doc, items: list[tuple[str, dict]], stems: dict[str, str]) -> None:
    """Files of `bench --processes N`: each process's wall-clock median and first call, and the spread; the table
    above shows the middle process."""
    rows = [[stems[path], _label(r), r["processes"]["count"],
             ", ".join(f"{run['timers']['wall_ms']['median']:.3g}" for run in r["processes"]["runs"]),
             ", ".join(cell(run.get("first_call_s")) for run in r["processes"]["runs"]),
             f"{r['processes']['spread_pct']:.1f}%"] for path, r in items if r.get("processes")]
    if rows:
        doc.p("Files of `bench --processes N`: the same command in N fresh processes, one after another. The rows above "
              "are the middle process's; spread: (max - min) / median of the processes' medians.", "note")
        doc.table(["file", "variant [mode]", "processes", "wall median ms, each", "first call s, each", "spread"], rows)


def _bench_idle(doc: Doc, items: list[tuple[str, dict]], stems: dict[str, str]) -> None:
    """Files of `bench --idle-ms`: the call after an idle against the same call back to back, interleaved."""
    rows = []
    for path, r in items:
        w = (r.get("idle") or {}).get("wall_ms")
        if w:
            spin = " spinning" if r["idle"].get("spin") else ""  # the column is "idle ms"
            rows.append([stems[path], _label(r), f"{r['idle']['idle_ms']:g}{spin}", w["back_to_back_median"],
                         w["after_idle_median"], f"{w['after_idle_over_back_to_back']:.3f}x",
                         f"{w['per_round_p10']:.3f}..{w['per_round_p90']:.3f}", r["idle"]["iters"]])
    if rows:
        doc.p("Files of `bench --idle-ms`: the same call after that idle (the host asleep, or spinning on the clock "
              "where it says so; the device synchronized), as a control loop makes it, interleaved with back-to-back calls after the main timing; the rows above are "
              "back to back.", "note")
        # medians (idle.wall_ms's *_median), said so beside the bench table's median and mean columns
        doc.table(["file", "variant [mode]", "idle ms", "back to back median ms", "after idle median ms",
                   "after idle / back to back",
                   "per round p10..p90", "rounds"], rows)


def _bench_histograms(doc: Doc, key: str, chunk: list[tuple[str, dict]], first: int, n: int,
                      stems: dict[str, str]) -> None:
    """One image of up to HIST_PANELS histograms, each titled with its file, its variant and the
    median the table gives (the summary's, interpolated; not the upper middle sample)."""
    ncols = min(len(chunk), HIST_COLS)
    nrows = math.ceil(len(chunk) / ncols)
    width = 3.7 * ncols + 0.3
    part = f" (panels {first + 1}-{first + len(chunk)} of {n})" if n > HIST_PANELS else ""
    # the suptitle in as many lines as the figure's width needs (9-point text, ~12 characters an inch):
    # over one 4-inch panel one line was cut at both edges
    title = textwrap.wrap(f"latency histograms, {key}{part}; dashed: median", width=int(width * 12))
    extra = 0.16 * (len(title) - 1)  # inches a line of the suptitle adds
    fig, axes = new_figure(width, 2.4 * nrows + 0.5 + extra, ncols, nrows)
    # in inches: the suptitle and a three-line 7-point title above each row, tick labels and the
    # x label below it (as constrained layout placed them, without measuring every label)
    fixed_margins(fig, nrows, ncols, top=0.88 + extra, bottom=0.42, left=0.42, right=0.12, row_gap=0.85,
                   col_gap=0.38)
    for i, (path, r) in enumerate(chunk):
        ax = axes[i // ncols][i % ncols]
        xs = r["samples"]["wall_ms"]
        ax.hist(xs, bins=min(40, max(8, len(xs) // 3)), color=COLORS[(first + i) % len(COLORS)], alpha=0.85)
        med = r["timers"]["wall_ms"]["median"]
        ax.axvline(med, color="k", lw=1, ls="--")
        # about 52 characters of 7-point text fit over a 3.7-inch panel; the mode is kept when the label is cut
        label = f"{clip(short_variant((r.get('variant') or {}).get('label') or 'reference'), 44)} [{r.get('mode') or '-'}]"
        ax.set_title(f"{clip(stems[path], 52)}\n{label}\nmedian {cell(float(med))} ms", fontsize=7)
        ax.set_xlabel("wall ms per call", fontsize=7)
        ax.tick_params(labelsize=7)
    for j in range(len(chunk), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle("\n".join(title), fontsize=9)
    doc.fig(fig, f"latency histograms {key}{part}")


def _bench_cdf(doc: Doc, key: str, items: list[tuple[str, dict]], stems: dict[str, str]) -> None:
    """One CDF of every file's samples. Up to CDF_LEGEND files each get a colour and a legend
    entry; beyond that the lines are coloured by their median's rank (fast to slow) and the
    legend names CDF_LEGEND of them spread over that order: the table names them all."""
    from matplotlib import colormaps

    n = len(items)
    by_median = sorted(range(n), key=lambda i: items[i][1]["timers"]["wall_ms"]["median"])
    if n <= CDF_LEGEND:
        colors = [COLORS[i] for i in range(n)]
        named = set(range(n))
    else:
        cmap = colormaps["viridis"]
        colors = [None] * n
        for rank, i in enumerate(by_median):
            colors[i] = cmap(0.9 * rank / (n - 1))
        named = {by_median[round(k * (n - 1) / (CDF_LEGEND - 1))] for k in range(CDF_LEGEND)}
    fig, axes = new_figure(10.0, 4.2, layout="constrained")
    ax = axes[0][0]
    lo, hi = math.inf, 0.0
    for i in by_median:  # legend entries from fast to slow
        path, r = items[i]
        for timer, ls in (("wall_ms", "-"), ("cuda_event_ms", ":")):
            xs = (r["samples"] or {}).get(timer)
            if not xs:
                continue
            xs = sorted(xs)
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            label = None
            if timer == "wall_ms" and i in named:
                label = f"{clip(stems[path], 44)}, {cell(float(r['timers']['wall_ms']['median']))} ms"
            ax.step(xs, ys, where="post", color=colors[i], ls=ls, lw=1.0 if n <= CDF_LEGEND else 0.8, label=label)
            lo, hi = min(lo, xs[0]), max(hi, xs[-1])
    if hi / max(lo, 1e-9) > 4:
        _log_ms_axis(ax)
    ax.set_xlabel("ms per call")
    ax.set_ylabel("fraction of calls")
    ax.grid(alpha=0.3)
    legend_title = "file, median" if n <= CDF_LEGEND else f"{CDF_LEGEND} of {n} files, fast to slow"
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title=legend_title,
              title_fontsize=7)
    ax.set_title(f"latency CDF, {key}\nsolid: synced wall clock, dotted: CUDA events"
                 + ("" if n <= CDF_LEGEND else "; colour: the file's median rank, fast (dark) to slow (light)"), fontsize=9)
    doc.fig(fig, f"latency CDF {key}")


def _log_ms_axis(ax) -> None:
    """A log x axis labelled in plain milliseconds (20, 50, 100), not matplotlib's 2x10^1 on
    every minor tick, whose labels run into each other."""
    from matplotlib.ticker import FuncFormatter

    def minor(v, _pos):
        lead = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return f"{v:g}" if lead in (2, 5) else ""

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(minor))


def _levers_of(row: dict) -> list[str]:
    if row.get("levers"):
        return [x.split("=")[0] if x.startswith("compile") else x for x in row["levers"]]
    spec = row.get("variant", "")
    if spec in ("reference", ""):
        return []
    return [x.split("=")[0] for x in spec.split(",") if x]


def _wall_ratio(row: dict) -> dict:
    """A matrix row's wall-clock ratio against its reference: `ratio.wall_ms` (pi0 matrices) or
    `vs_reference` (world-action matrices); {} when the row has neither."""
    return ((row.get("ratio") or {}).get("wall_ms") or row.get("vs_reference") or {})


def _matrix_row_name(v: dict) -> str:
    """A matrix row's name in the table, the heatmap and the CDF alike: the variant, and a world-action row's sparsity
    mode (each variant has a row per mode: 'exact | drop_middle')."""
    return short_variant(v.get("variant", "")) + (f" | {v['sparsity']}" if v.get("sparsity") else "")


def _ratio_cell(q: dict | None) -> str | None:
    """A per-round ratio (timing._ratio_stats: a world-action row's sparsity_gain) as a cell: '1.45x (1.40..1.52)',
    '(noise)' where it is not significant (its p10..p90 includes 1, or the medians say otherwise); None where the
    file has none (the dense rows)."""
    if not q:
        return None
    return (f"{q['speedup']:.2f}x ({q['ratio_p10']:.2f}..{q['ratio_p90']:.2f})"
            + ("" if q.get("significant") else " (noise)"))


def _matrix(doc: Doc, path: str, r: dict) -> None:
    on_ray = isinstance(r.get("ray"), dict)  # `matrix --ray`: each row its own task, against its own reference
    doc.h(3, f"matrix{' (Ray)' if on_ray else ''}: {workload_label(r)} {_on_device(r)}, {r.get('mode') or '-'} mode "
             f"({(r.get('variant') or {}).get('label', '')[:60]})")
    idle = (f", each timed call after {idle_words(r['idle_ms'], r.get('idle_spin', False))} (`--idle-ms`)"
            if r.get("idle_ms") else "")
    against = (f"speedup = median of the {r.get('baseline', 'reference')} timed interleaved in the row's own Ray task, "
               "on its GPU (the \"reference ms\" column) / median of the variant; rows of different tasks are not "
               "divided by one another" if on_ray else
               f"speedup = median of the baseline ({r.get('baseline', 'reference')}) / median of the variant")
    if r.get("interrupted"):  # Ctrl-C or SIGTERM before the rounds ended: no row has a speed
        doc.p(f"{path}: interrupted (Ctrl-C or SIGTERM) before its {r.get('iters')} interleaved rounds finished, so no "
              "variant was timed; the rows prepared by then keep their equivalence and first call.", "warn")
    else:
        doc.p(f"{path}: {r.get('iters')} interleaved rounds after {r.get('warmup')} warm-up calls per variant{idle}; "
              f"{against}; 'noise' = the p10..p90 of per-round ratios includes 1, or (files from session 70 on) "
              "the medians' ratio lies on its other side.", "note")
    if r.get("left_out"):  # a preset's rows that need a CUDA device, on a file made without one
        doc.p(f"{r['left_out']}.", "note")
    rows, timed = [], []
    # world-action matrices have a row per variant and sparsity mode, each against the reference at its sparsity, and
    # say what the sparsity gained (the same variant at sparsity none over the row) and the predicted video's error
    wam = any(isinstance(v, dict) and "sparsity" in v for v in r.get("variants", []))
    for v in r.get("variants", []):
        name = _matrix_row_name(v)
        eq = v.get("equivalence") or {}
        wam_cells = [eq.get("video_rel_l2"), _ratio_cell(v.get("sparsity_gain"))] if wam else []
        if "timers" not in v:  # skipped: a row that failed its check or was prepared before an interrupt keeps
            # its error, first call and levers (the error is why it has no speed)
            rows.append([name, v.get("skipped", "not timed")] + [None] * (5 if on_ray else 4)
                        + [eq.get("rel_l2")] + wam_cells[:1] + [None] * len(wam_cells[1:])
                        + [v.get("first_call_s"), None, ", ".join(v.get("levers") or []) or "-"])
            continue
        w, e = v["timers"]["wall_ms"], v["timers"].get("cuda_event_ms")
        q = _wall_ratio(v)
        sig = q.get("significant")
        speed = f"{q['speedup']:.2f}x" + ("" if sig or v.get("variant") == r.get("baseline", "reference") else " (noise)") if q else None
        own_reference = (((v.get("reference") or {}).get("timers") or {}).get("wall_ms") or {}).get("median")
        rows.append([name, w["median"], w["p95"], e["median"] if e else None]
                    + ([own_reference] if on_ray else []) +
                    [speed, f"{q['ratio_p10']:.2f}..{q['ratio_p90']:.2f}" if q else None, eq.get("rel_l2")]
                    + wam_cells +
                    [v.get("first_call_s"), v["peak_memory_bytes"] / 2**30 if v.get("peak_memory_bytes") else None,
                     ", ".join(v.get("levers") or []) or "-"])
        timed.append(v)
    doc.table(["variant", "median ms", "p95 ms", "event median ms"] + (["reference ms"] if on_ray else [])
              + ["speedup", "ratio p10..p90", "rel L2"] + (["video rel L2", "sparsity gain"] if wam else [])
              + ["first call s", "process peak GiB", "levers"], rows)
    if wam:
        doc.p("sparsity gain: the same variant at sparsity none over the row, per round (p10..p90); '(noise)' where "
              "that interval includes 1", "note")
    if any(v.get("peak_memory_bytes") for v in timed):
        # files before peak_memory_over reset the peak after the row's first call: compile's and capture's buffers
        # are not in them
        over = ("first call (compile, capture) and warm-up" if r.get("peak_memory_over") == "first call and warm-up"
                else "warm-up calls, after its first call (compile, capture)")
        doc.p(f"process peak GiB: the allocator's peak over a variant's {over}, every variant's engine "
              "held in the one process (a bench file gives one variant's own)", "note")
    if not timed or not plots_available():
        return
    # heatmap: variant x lever, cell = the variant's speedup where the lever is on
    import numpy as np
    from matplotlib.colors import Normalize

    levers = [l for l in _LEVER_ORDER if any(l in _levers_of(v) for v in timed)]
    extra = sorted({l for v in timed for l in _levers_of(v)} - set(levers))
    levers += extra
    cols = levers + ["speedup"]
    speed = [_wall_ratio(v).get("speedup", float("nan")) for v in timed]
    grid = np.full((len(timed), len(cols)), np.nan)
    for i, v in enumerate(timed):
        on = set(_levers_of(v))
        for j, l in enumerate(levers):
            if l in on:
                grid[i, j] = speed[i]
        grid[i, -1] = speed[i]
    fig, axes = new_figure(1.6 + 0.85 * len(cols), 0.9 + 0.38 * len(timed))
    ax = axes[0][0]
    finite = [s for s in speed if math.isfinite(s)]
    norm = Normalize(vmin=min(finite + [1.0]), vmax=max(finite + [1.0]))
    ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", norm=norm, aspect="auto")
    for i in range(len(timed)):
        for j in range(len(cols)):
            if grid[i, j] == grid[i, j]:
                val = grid[i, j]
                ax.text(j, i, f"{val:.2f}x", ha="center", va="center", fontsize=7,
                        color="white" if norm(val) < 0.6 else "black")
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([LEVER_ABBREVIATIONS.get(c, c) for c in cols], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(timed)))
    ax.set_yticklabels([_matrix_row_name(v) for v in timed], fontsize=7)
    ax.set_title("speedup vs baseline per variant (coloured cells: levers the variant uses)", fontsize=9)
    fig.tight_layout()
    doc.fig(fig, "matrix speedup heatmap")
    # latency distribution from the summaries
    if not any((v.get("samples") or {}).get("wall_ms") for v in timed):
        doc.p("The latency CDFs below are drawn from each variant's summary percentiles (min, median, p90, p95, "
              "p99, max): matrix files hold no raw samples.", "note")
    fig, axes = new_figure(7.0, 3.6)
    ax = axes[0][0]
    levels = [("min", 0.0), ("median", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("max", 1.0)]
    raw = any((v.get("samples") or {}).get("wall_ms") for v in timed)
    lo, hi = math.inf, 0.0
    for i, v in enumerate(timed):
        c = COLORS[i % len(COLORS)]
        xs_raw = (v.get("samples") or {}).get("wall_ms")
        if xs_raw:
            xs = sorted(xs_raw)
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            ax.step(xs, ys, where="post", color=c, label=_matrix_row_name(v))
        else:
            s = v["timers"]["wall_ms"]
            xs = [s[k] for k, _ in levels]
            ys = [q for _, q in levels]
            ax.plot(xs, ys, "o-", color=c, ms=3, label=_matrix_row_name(v))
        lo, hi = min(lo, xs[0]), max(hi, xs[-1])
    if hi / max(lo, 1e-9) > 4:
        ax.set_xscale("log")
    ax.set_xlabel("wall ms per call")
    ax.set_ylabel("fraction of calls")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title("latency CDF per variant" + ("" if raw else "\n(drawn from the summary percentiles min/median/p90/p95/"
                                                          "p99/max: matrix files hold no raw samples)"), fontsize=8)
    fig.tight_layout()
    doc.fig(fig, "matrix latency CDF")


def _check(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"check: {workload_label(r)} on {gpu_name(r)}")
    # world-action checks also name the sparsity mode and hold the predicted video's error
    rows = [[c.get("variant") + (f" | {c['sparsity']}" if c.get("sparsity") else ""), c.get("dtype"), c.get("max_abs"),
             c.get("rel_l2"), c.get("video_rel_l2"), c.get("tolerance"), c.get("seeds"),
             "could not run" if c.get("error") else "yes" if c.get("passed") else "NO"]
            for c in r.get("checks", [])]
    doc.table(["variant", "dtype", "max abs", "rel L2", "video rel L2", "tolerance", "seeds", "passed"], rows)
    for c in r.get("checks", []):
        if c.get("error"):  # a variant that raised before it gave actions (check's row keeps why)
            doc.p(f"{c.get('variant')} could not run: {c['error']}", "note")


def _breakdown(doc: Doc, path: str, r: dict) -> None:
    bd = r["breakdown"]
    idle = f", each call after {idle_words(bd['idle_ms'], bd.get('idle_spin', False))}" if bd.get("idle_ms") else ""
    doc.h(3, f"breakdown: {workload_label(r)} {(r.get('variant') or {}).get('label', '')} "
             f"({r.get('mode')} mode, {gpu_name(r)}{idle})")
    doc.p(bd.get("statement", ""), "")
    for n in bd.get("notes", []):
        doc.p("note: " + n, "note")
    m = bd.get("matches_reference") or {}
    if m and not m.get("exact"):
        doc.p(f"the staged sequence differs from the untimed call (max abs {m.get('max_abs')})", "warn")
    rows = []
    for e in bd["stages"]:
        occ = e.get("occurrence") or {}
        info = e.get("info") or {}
        extra = []
        if info:
            extra.append(f"{info.get('tokens')} tokens, mask {'valid' if info.get('valid') else 'MASKED'}")
        rows.append([e["name"], e["median_ms"], e["p95_ms"], e["mean_ms"], pct(e.get("share")), e.get("per_call"),
                     occ.get("mean_ms"), occ.get("max_ms"), "; ".join(extra) or None])
    doc.table(["stage", "median ms", "p95 ms", "mean ms", "share of call", "per call", "mean per occurrence",
               "max per occurrence", "info"], rows)
    if r.get("processes"):  # breakdown --processes N: the table above is the middle process's
        from vlaperf.profile.processes import describe, stage_rows

        p = r["processes"]
        doc.p(f"{describe(p)}: the table above is the middle process's (process {p['headline'] + 1}); each stage's "
              "median in every process, and (max - min) / median of them:", "note")
        doc.table(["stage", *(f"process {i + 1} ms" for i in range(p["count"])), "spread"],
                  [[name, *medians, pct(spread / 100) if spread is not None else None]
                   for name, medians, spread in stage_rows(p)])
    if not plots_available():
        return
    stages = [e for e in bd["stages"]]
    fig, axes = new_figure(7.0, 0.8 + 0.3 * len(stages))
    ax = axes[0][0]
    names = [e["name"] for e in stages][::-1]
    med = [e["median_ms"] for e in stages][::-1]
    err = [max(e["p95_ms"] - e["median_ms"], 0.0) for e in stages][::-1]
    colors = ["#bbbbbb" if n == "(unmarked)" else ("#d62728" if n.startswith("image_") and
              not ((next(x for x in stages if x["name"] == n).get("info") or {}).get("valid", True)) else "#1f77b4")
              for n in names]
    ax.barh(range(len(names)), med, xerr=[[0.0] * len(err), err], color=colors, capsize=2)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel(f"ms per call (median, whisker p95; {bd.get('timer')})", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    # world-action breakdowns have no image slots, so no bar can be red there
    has_images = any(str(e["name"]).startswith("image_") for e in stages)
    ax.set_title("stage breakdown" + (" (red: a masked image slot)" if has_images else ""), fontsize=9)
    fig.tight_layout()
    doc.fig(fig, "stage breakdown")


def _scaling(doc: Doc, path: str, r: dict) -> None:
    from vlaperf.profile.scaling_fit import plot_scaling, poor_fit

    sc = r["scaling"]
    doc.h(3, f"scaling: {workload_label(r)} {_on_device(r)}, {r.get('mode') or '-'} mode")
    if not sc["series"]:  # a well-formed empty array (as an empty syncs.sites): nothing to tabulate or draw
        doc.p("no series: scaling.series is empty, so there is no T(N) to show", "warn")
        return
    rows = []
    for s in sc["series"]:
        f = s["fit"]
        # a line through two points fits them exactly: its r2 (1) is left out, and the note below says why
        rows.append([s["label"], f["intercept"], f["slope"], None if len(s["points"]) == 2 else f["r2"]] +
                    [p["median_ms"] for p in s["points"]])
    # each T(N) is that point's median (the fit is on the medians): said, as every other table here says its statistic
    doc.table(["variant", "intercept a ms", "slope b ms/step", "r2"]
              + [f"T({p['steps']}) median ms" for p in sc["series"][0]["points"]], rows)
    if any(len(s["points"]) == 2 for s in sc["series"]):  # as `vlaperf scaling` says in its table
        doc.p("r2 left out (-): a line fits any two points exactly, so with 2 step counts r2 is 1 whatever T(N) does; "
              "3 or more --steps test the line", "note")
    # as `vlaperf scaling` flags them in its table: a negative intercept or slope or a low r2 is no a and b to quote
    poor = [s["label"] for s in sc["series"] if poor_fit(s["fit"])]
    if poor:
        doc.p(f"poor fit (r2 below 0.95, or a negative intercept or slope: its a and b mean little; more --iters "
              f"or a quieter machine): {', '.join(poor)}", "warn")
    if plots_available():
        doc.fig(plot_scaling(sc, None, title=f"T(N) = a + b*N, {workload_label(r)}"), "T(N) fit")


def _syncs(doc: Doc, path: str, r: dict) -> None:
    rep = r["syncs"]
    # a policy-mode count includes the read of the actions, a model-mode one does not: the heading says which
    doc.h(3, f"syncs: {workload_label(r)} {(r.get('variant') or {}).get('label', '')} "
             f"({r.get('mode') or '-'} mode, {gpu_name(r)})")
    expected, hidden = rep.get("expected_per_call"), rep.get("hidden_per_call")  # an older file may lack hidden_per_call
    n = rep["per_call"]
    doc.p(f"{n:g} host sync{'' if n == 1 else 's'} per call ({rep['source']}, {rep['calls']} calls)"
          + (f"; {expected} expected (reading the actions)" if expected else "")
          + (f", {hidden:g} hidden" if expected and hidden is not None else ""))
    if rep.get("note"):
        doc.p(rep["note"], "note")
    doc.table(["per call", "location", "op", "code"], [[s["per_call"], s["location"], s["op"], s["code"]] for s in rep["sites"]])


def _doctor(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"doctor: {r['workload'].get('id') or 'environment'} on {gpu_name(r)}")
    # the cost beside how it was found: a clamped difference is a bare 0 without its two timings
    doc.table(["severity", "id", "finding", "cost ms", "cost note", "fix", "detail"],
              [[f["severity"], f["id"], f["title"], f.get("cost"), f.get("cost_note"), f.get("fix"), f.get("detail")]
               for f in r["findings"]])


def server_backend(r: dict) -> str:
    """How a loadgen result's server ran its model: in-process, or Ray Serve with N replicas on M GPUs."""
    srv = r.get("server") or {}
    if srv.get("backend") == "ray-serve":
        gpus = len({d.get("gpu_uuid") for d in srv.get("replica_devices", []) if d.get("gpu_uuid")})
        return f"Ray Serve, {srv.get('replicas')} replica(s)" + (f" on {gpus} GPU(s)" if gpus else "")
    return "in-process engine"


def _loadgen(doc: Doc, items: list[tuple[str, dict]]) -> None:
    """One table per server run, then throughput and median round trip against clients, one
    line per run (e.g. 1 vs N replicas)."""
    series = []
    for path, r in items:
        lg, srv = r["loadgen"], r.get("server") or {}
        label = f"{server_backend(r)} ({Path(path).stem})"
        doc.h(3, f"loadgen: {workload_label(r)}, {label}, levers {short_variant(srv.get('levers_label', '?'))} on {gpu_name(r)}")
        doc.p(f"max batch {srv.get('max_batch')}, max wait {srv.get('max_wait_ms')} ms; {lg.get('observations', '')}; "
              f"{'passed' if lg.get('passed') else 'FAILED'}", "note")
        rows = []
        for ph in lg["phases"]:
            rt, inf = ph.get("round_trip_ms") or {}, ph.get("server_infer_ms") or {}
            rows.append([ph["clients"], f"{ph['ok']} / {ph['expected']}" + (f" (time limit: {ph.get('unsent', '?')} unsent)"
                                                                             if ph.get("timed_out") else ""),
                         ph["lost"] + ph["misrouted"], ph["requests_per_s"],
                         rt.get("median"), rt.get("p95"), rt.get("p99"), inf.get("median"), (ph.get("batch_size") or {}).get("mean")])
        doc.table(["clients", "ok / expected", "lost + misrouted", "req/s", "round trip p50 ms", "p95", "p99",
                   "server infer p50 ms", "mean batch"], rows)
        series.append((label, lg["phases"]))
    if not plots_available():
        return
    fig, axes = new_figure(9.0, 3.6 + 0.22 * len(series), ncols=2)
    clients = sorted({ph["clients"] for _, phases in series for ph in phases})
    for i, (label, phases) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        xs = [ph["clients"] for ph in phases]
        axes[0][0].plot(xs, [ph["requests_per_s"] or 0 for ph in phases], "o-", color=c, label=label)
        axes[0][1].plot(xs, [(ph.get("round_trip_ms") or {}).get("median") or float("nan") for ph in phases], "o-", color=c,
                        label=label)
    for ax, ylabel in ((axes[0][0], "requests / s"), (axes[0][1], "round trip p50 ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.set_xticklabels([str(c) for c in clients])
        ax.set_xlabel("closed-loop clients")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_title("throughput", fontsize=9)
    axes[0][1].set_title("latency", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=7, ncol=1, frameon=False)
    fig.tight_layout(rect=(0, 0.02 + 0.045 * len(series), 1, 1))
    doc.fig(fig, "server throughput and latency against clients")


def _rollout(doc: Doc, path: str, r: dict) -> None:
    """`vlaperf rollout --json`: a control loop against a running server, per episode how long it
    took against its ideal (steps / control rate) and how much of it went to waiting for the
    policy; the totals, as print_rollout (vlaperf/serve/commands.py) gives them."""
    ro, srv = r["rollout"], r.get("server") or {}
    levers = srv.get("levers_label") or (r.get("variant") or {}).get("label") or "?"
    doc.h(3, f"rollout: {workload_label(r)}, levers {short_variant(levers)} on {srv.get('device') or gpu_name(r)}")
    doc.p(f"{Path(path).name}: {ro.get('episodes')} episode(s) of {ro.get('steps_per_episode')} steps at "
          f"{ro.get('control_hz')} Hz, chunks of {ro.get('action_horizon')} actions, a policy call every "
          f"{ro.get('replan_every')} steps; server {srv.get('dtype')} on {srv.get('device')}, max batch "
          f"{srv.get('max_batch')}" + keep_warm_setting_words(ro, srv), "note")
    rows = []
    for e in ro["per_episode"]:
        call = e.get("policy_call_ms") or {}
        rows.append([e.get("episode"), e.get("steps"), e.get("policy_calls"), e.get("wall_s"), e.get("ideal_wall_s"),
                     e.get("policy_wait_s"), pct(e.get("policy_wait_share")), e.get("overrun_steps"),
                     call.get("median"), call.get("max")])
    call = ro.get("policy_call_ms") or {}
    ideal = [e.get("ideal_wall_s") for e in ro["per_episode"]]
    rows.append(["all", sum(e.get("steps") or 0 for e in ro["per_episode"]),
                 sum(e.get("policy_calls") or 0 for e in ro["per_episode"]), ro.get("wall_s"),
                 sum(ideal) if all(isinstance(x, (int, float)) for x in ideal) else None, ro.get("policy_wait_s"),
                 pct(ro.get("policy_wait_share")), ro.get("overrun_steps"), call.get("median"), call.get("max")])
    doc.table(["episode", "steps", "policy calls", "wall s", "ideal s", "waiting s", "waiting", "overrun steps",
               "call p50 ms", "call max ms"], rows)
    infer = ro.get("server_infer_ms") or {}
    doc.p(f"total {cell(ro.get('wall_s'))} s, {pct(ro.get('policy_wait_share')) or '-'} of it waiting for the policy; "
          f"{ro.get('overrun_steps')} overrun steps; {ro.get('errors')} errors"
          + (f"; the server's model call p50 {cell(infer['median'])} ms" if "median" in infer else "")
          + ("; stopped at the time limit" if ro.get("timed_out") else "")
          + (f"; stopped: {ro['connection_lost']}" if ro.get("connection_lost") else ""),
          "warn" if ro.get("timed_out") or ro.get("errors") or ro.get("connection_lost") else "")
    for words in (cadence_words(ro), keep_warm_wait_words(ro)):
        if words:
            doc.p(words[0].upper() + words[1:])
    doc.p("Only the timing is real; the observations are " + str(ro.get("observations") or "SYNTHETIC (random inputs, "
          "no simulator or robot, the actions are applied to nothing)"), "note")


def describe_rtc(rtc: dict) -> str:
    """One sentence on `time_lerobot(rtc=True)`'s RTC rows (result["accelerated"]["rtc"]), for the CLI and the report.
    Here, not in vlaperf.compare.lerobot: that module imports torch, and a report does not."""
    m = rtc.get("vs_lerobot_predict_rtc")  # absent where the accelerator refused the guided call (accelerated.refused)
    distance = ("vlaperf's guided call refused by the accelerator's check, so not compared" if m is None else
                f"rel L2 {m['rel_l2']:.2e} from LeRobot's own guided call ({'passed' if m['passed'] else 'FAILED'}, "
                f"tolerance {m['tolerance']:.0e})")
    return (f"LeRobot's real-time chunking on ({rtc['schedule']} schedule, max guidance weight "
            f"{rtc['max_guidance_weight']:g}, execution horizon {rtc['execution_horizon']}) with a "
            f"{rtc['leftover_len']}-action leftover of the previous chunk given with delay {rtc['inference_delay']}: "
            f"{distance}; the guidance moved LeRobot's chunk by rel L2 {_sci2(rtc['guidance_moves'])}")


def _sci2(x) -> str:
    """A rel L2 or max abs as the compare sentences give it (two digits); "nan" where it was not finite (the CLI's
    NaN, a file's null: strict_json writes NaN as null)."""
    return "nan" if x is None or x != x else f"{x:.2e}"


def describe_refusal(refused: dict) -> str:
    """One sentence on an accelerated row the accelerator's own check refused (timing["accelerated"]["refused"]:
    `time_lerobot` leaves that row out and times the others), for the CLI and the report."""
    c = refused.get("check")
    if not c:  # a refusal without its check's record: the accelerator's message says what it knows
        return f"{refused['row']} not timed: the accelerator refused to answer: {refused['message']}"
    shape = (f"batch {c.get('batch')}, cameras {c.get('images_valid')}, prompt {c.get('prompt_len')} tokens, "
             f"{c.get('num_steps')} steps" + (", guided" if c.get("guided") else ""))
    return (f"{refused['row']} NOT timed: the accelerator's check against LeRobot's sample_actions refused to answer "
            f"on its first call ({shape}): rel L2 {_sci2(c['rel_l2'])} > tolerance {c['tolerance']:.0e} (max abs "
            f"{_sci2(c['max_abs'])}); the other rows were timed")


def describe_lerobot_compile(lc: dict) -> str | None:
    """What the CLI and the report say of the LeRobot compiled row (timing["lerobot_compile"]), or None where there is
    nothing to say: left out where its compile failed; a warning where its actions failed their check against LeRobot
    eager's, since its speed-up is then not of the same computation."""
    if lc.get("compile_error"):
        return f"LeRobot compiled ({lc['mode']}) left out: {lc['compile_error']}"
    m = lc.get("vs_eager")
    if m and not m["passed"]:
        return (f"LeRobot compiled ({lc['mode']}) is NOT equivalent to LeRobot eager: rel L2 {m['rel_l2']:.2e} > "
                f"{m['tolerance']:.0e}; its row times another computation, not the same one faster")
    return None


def _compare(doc: Doc, path: str, r: dict) -> None:
    c, t = r["compare"], r.get("timing") or {}
    # a LeRobot compare holds null where LeRobot had no version to read (the CLI says "version unknown" too); an openpi
    # one has no version field at all
    version = "" if "lerobot_version" not in c else " " + (c["lerobot_version"] or "(version unknown)")
    doc.h(3, f"compare: {workload_label(r)} vs {c['against']}{version} "
             f"({c['dtype']}, {'reduced' if c.get('reduced') else 'full size'}, {gpu_name(r)})")
    for note in c.get("as_shipped", []):
        doc.p(note, "note")
    doc.table(["vlaperf variant", "max abs", "rel L2", "worst dim", "tolerance", "passed"],
              [[name, m["max_abs"], m["rel_l2"], m.get("worst_dim"), m["tolerance"], "yes" if m["passed"] else "NO"]
               for name, m in c["equivalence"].items()])
    summary = t.get("summary") or {}
    if not summary:
        return
    doc.table(["implementation", "wall median ms", "event median ms", "speedup vs peer", "first call s"],
              [[name, s["wall_ms_median"], s.get("cuda_event_ms_median"), s.get("speedup_vs_lerobot_wall"), s.get("first_call_s")]
               for name, s in summary.items()])
    compiled_note = describe_lerobot_compile(t.get("lerobot_compile") or {})
    if compiled_note:
        doc.p(compiled_note + ".", "note")
    if t.get("settled"):  # files from session 49 on
        doc.p("Each timed call of " + ", ".join(t["settled"]) + " came right after an untimed call of its own, not "
              "after the eager row before it in the round (whose host work slows the next call).", "note")
    acc = t.get("accelerated")
    if acc:
        m, checks = acc.get("vs_lerobot_predict"), acc["checks"]
        # vs_lerobot_predict is absent where the accelerator refused the accelerated row (acc["refused"])
        apart = ("not compared (refused, below)" if m is None else
                 f"rel L2 {m['rel_l2']:.2e} from LeRobot's own ({'passed' if m['passed'] else 'FAILED'})")
        first = acc["first_call_s"].get("vlaperf_in_lerobot_predict")
        doc.p(f"lerobot_predict: LeRobot's own predict_action_chunk (its image pre-processing included); "
              f"vlaperf_in_lerobot_predict: the same call with vlaperf ({acc['levers']}) installed in the policy by "
              f"accelerate_lerobot, {apart}; its check against LeRobot on the first call: "
              + ", ".join(f"rel L2 {_sci2(c['rel_l2'])} ({'passed' if c['passed'] else 'FAILED'})" for c in checks)
              + (f"; first call {first:.2f} s, the check included." if first is not None else "."), "note")
        if acc.get("rtc"):
            doc.p(f"lerobot_predict_rtc / vlaperf_in_lerobot_predict_rtc: the same two calls with "
                  f"{describe_rtc(acc['rtc'])}.", "note")
        if acc.get("refused"):
            doc.p(describe_refusal(acc["refused"]) + ".", "warn")
    if not plots_available():
        return
    fig, axes = new_figure(6.0, 0.9 + 0.45 * len(summary))
    ax = axes[0][0]
    names = list(summary)[::-1]
    ax.barh(range(len(names)), [summary[n]["wall_ms_median"] for n in names],
            color=["#7f7f7f" if not n.startswith("vlaperf") else "#1f77b4" for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("wall ms per call (median, interleaved in one process)", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{workload_label(r)}: vlaperf against {c['against']}", fontsize=9)
    fig.tight_layout()
    doc.fig(fig, "comparison with the peer")


def _id_ranges(ids: list[int]) -> str:
    """[1, 2, 3, 5, 7, 8] -> "1-3, 5, 7-8"."""
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)

_ABSENT = "(absent)"


def _environment(doc: Doc, results: list[tuple[str, dict]]) -> None:
    """The setup every file ran on, in two tables: the keys with one value in all files, once;
    then for each key that differs, a row per value with the files (# of the file table) that
    have it. (A column per distinct environment made 281 columns of the committed results:
    the git commit alone differs between most runs.) Object values (env_vars) are split into
    their keys, so one variable that differs does not make the whole set differ."""
    envs: list[dict] = []
    for path, r in results:
        # the setup, not the moment: the timestamp and the GPU's clocks go in the file table; the host's load average
        # is in the file (bench prints it beside wide timings)
        flat: dict = {}
        for k, v in (r.get("env") or {}).items():
            if k in ("timestamp", "gpu_state", "load_avg"):
                continue
            if isinstance(v, dict) and v:
                flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
            else:
                flat[k] = v
        envs.append(flat)
    keys: list[str] = []
    for env in envs:
        keys += [k for k in env if k not in keys]
    # an empty object ("env_vars": {}) where other files set some of its keys: those keys show
    # as (absent) for it; a row "env_vars {}" beside them would say the same twice
    split = {k.split(".", 1)[0] for k in keys if "." in k}
    for env in envs:
        for k in split:
            if env.get(k) == {}:
                del env[k]
    keys = [k for k in keys if any(k in env for env in envs)]
    same, differ = [], []
    for k in keys:
        by_value: dict[str, list[int]] = {}  # the value as JSON (lists and None compare as written) -> file numbers
        for i, env in enumerate(envs):
            by_value.setdefault(json.dumps(env[k], sort_keys=True, default=str) if k in env else _ABSENT, []).append(i + 1)
        if len(by_value) == 1:
            same.append([k, envs[0][k]])
        else:
            differ += [[k, value if value == _ABSENT else cell(json.loads(value)), len(ids), _id_ranges(ids)]
                       for value, ids in by_value.items()]
    if same:
        doc.p(f"the same in all {len(envs)} file(s):", "")
        doc.table(["key", "value"], same)
    if differ:
        doc.p("different between files (# as in the file table at the top):", "")
        doc.table(["key", "value", "files", "#"], differ)


# ----------------------------------------------------------------- entry point


# command -> the section heading, in report order
SECTIONS = (("bench", "Latency (bench)"), ("matrix", "Optimization matrix"), ("check", "Equivalence (check)"),
            ("breakdown", "Stage breakdown"), ("scaling", "T(N) scaling"), ("syncs", "Host syncs"),
            ("doctor", "Doctor"), ("loadgen", "Serving under load (loadgen)"),
            ("rollout", "A control loop against the server (rollout)"),
            ("compare", "Side by side with a peer (compare)")) + probes.SECTIONS

# one section (and shared figures) over all their files: renderer(doc, [(path, result), ...])
GROUP_RENDERERS = {"bench": _bench, "loadgen": _loadgen, **probes.GROUP_RENDERERS}
# a section per file: renderer(doc, path, result)
FILE_RENDERERS = {"matrix": _matrix, "check": _check, "breakdown": _breakdown, "scaling": _scaling, "syncs": _syncs,
                  "doctor": _doctor, "rollout": _rollout, "compare": _compare, **probes.FILE_RENDERERS}


def _rendered(doc: Doc, renderer, *args) -> str | None:
    """Run `renderer` on a scratch document and append what it wrote to `doc`; on any error
    append nothing and return the reason. This is the last guard, behind the schema and
    field_problem: one damaged file must cost its own section, never the report."""
    scratch = Doc()
    try:
        renderer(scratch, *args)
    except Exception as e:  # noqa: BLE001 - whatever a malformed field raises, the other files still render
        return "could not render it: " + _reason(e)
    doc.extend(scratch)
    return None


def _render_group(doc: Doc, renderer, items: list[tuple[str, dict]], skipped: dict[str, str]) -> None:
    """A section drawn over several files at once: if it fails, find the files that fail alone,
    skip those and draw the rest."""
    if _rendered(doc, renderer, items) is None:
        return
    bad = {}
    for p, r in items:
        reason = _rendered(Doc(), renderer, [(p, r)])
        if reason:
            bad[p] = reason
    skipped.update(bad)
    rest = [(p, r) for p, r in items if p not in bad]
    if rest:
        reason = _rendered(doc, renderer, rest)
        if reason:  # each file renders alone, not together: nothing here says which to drop
            skipped.update({p: f"the section of these {len(rest)} files failed together: {reason}" for p, _ in rest})


def _check_output(out_path: Path) -> str:
    """The format of `out_path`, or ValueError before anything is rendered (which takes a while)."""
    fmt = out_path.suffix.lower()  # any case: R.MD, report.HTML
    if fmt not in (".html", ".md"):
        raise ValueError(f"report: output must end in .html or .md (any case), got {out_path.name!r}")
    why = unwritable(out_path)  # the folder is made when the report is written; here only whether it can be
    if why is not None:
        raise ValueError(f"report: cannot write {out_path}: {why}")
    return fmt


def _section_units(by_cmd: dict[str, list[tuple[str, dict]]], names: dict[str, str]) -> list[tuple[str, list]]:
    """The report's sections as independent pieces of work, (command, files), in the report's
    order: a piece per bench group (workload and device), one for each other command drawn over
    several files, one per file for the rest. Takes the commands with a renderer out of by_cmd."""
    units = []
    for cmd, _ in SECTIONS:
        items = by_cmd.pop(cmd, [])
        if cmd == "bench":  # _bench draws its groups in the order they first appear, as here
            groups: dict[str, list] = {}
            for p, r in items:
                groups.setdefault(f"{workload_label(r)} on {gpu_name(r)}", []).append((p, r))
            units += [(cmd, group) for group in groups.values()]
        elif cmd in GROUP_RENDERERS:
            units += [(cmd, items)] if items else []
        else:
            units += [(cmd, [item]) for item in items]
    return units


def _render_unit(cmd: str, items: list[tuple[str, dict]], names: dict[str, str]) -> tuple[list, dict[str, str]]:
    """One piece of _section_units: its blocks (figures already PNG bytes) and the files it had to
    skip, with why. A module-level function of plain data, so a worker process can run it."""
    doc, skipped = Doc(), {}
    items = [(p, located(r)) for p, r in items]  # a missing key's error names its whole path
    if cmd == "bench":
        _render_group(doc, functools.partial(_bench, names=names), items, skipped)
    elif cmd in GROUP_RENDERERS:
        _render_group(doc, GROUP_RENDERERS[cmd], items, skipped)
    else:
        for p, r in items:
            reason = _rendered(doc, FILE_RENDERERS[cmd], p, r)
            if reason:
                skipped[p] = reason
    return doc.blocks, skipped


def default_jobs() -> int:
    """Worker processes for a report: the cores this process may use, at most MAX_JOBS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_JOBS))


def _render_units(units: list[tuple[str, list]], names: dict[str, str],
                  jobs: int | None) -> list[tuple[list, dict[str, str]]]:
    """_render_unit over every unit, in order. Drawing figures is most of a large report's time and
    each unit's are independent of the others', so with more than one job and enough units they are
    drawn in worker processes; the output is the same, byte for byte."""
    jobs = default_jobs() if jobs is None else jobs
    args = [(cmd, items, {p: names[p] for p, _ in items}) for cmd, items in units]
    if jobs <= 1 or len(units) < PARALLEL_MIN_UNITS:
        return [_render_unit(*a) for a in args]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:  # spawned, not forked: a Python caller's process may have torch loaded (`vlaperf report` does not), and a
        # fork would copy its threads' state
        with ProcessPoolExecutor(max_workers=min(jobs, len(units)), mp_context=multiprocessing.get_context("spawn")) as pool:
            return list(pool.map(_render_unit, *zip(*args)))
    except (OSError, BrokenProcessPool):  # no worker processes to be had (a process limit, a killed worker): draw here
        return [_render_unit(*a) for a in args]


def render(result_paths, out_path, title: str | None = None, on_skip: Callable[[str], None] | None = None,
           jobs: int | None = None) -> Path:
    """Write the report of `result_paths` (files or directories) to `out_path` (.html or .md,
    any case). A file that cannot be read, is not a valid result, or that its renderer fails
    on is listed as skipped with the reason; the others are rendered. on_skip("file: reason") is
    also called for each skipped file (the CLI prints them). jobs: processes that draw the
    figures (default: default_jobs(); 1 draws them all in this process)."""
    out_path = Path(out_path)
    fmt = _check_output(out_path)
    if isinstance(result_paths, (str, Path)):
        result_paths = [result_paths]
    loaded, problems = load_results(result_paths)
    if not loaded:
        if not problems:  # nothing was even tried: the folders hold no .json file
            raise ValueError("report: no *.json result files in " + ", ".join(str(p) for p in result_paths))
        raise ValueError("report: no valid vlaperf result files: " + "; ".join(problems))
    names = file_names([p for p, _ in loaded])
    skipped: dict[str, str] = {}  # path -> why it is not in the report (a renderer's field or error)
    index_rows: dict[str, list] = {}
    for p, r in loaded:
        problem = field_problem(r)
        if problem:
            skipped[p] = problem
            continue
        try:  # the file table reads the workload, variant and GPU state of every file
            index_rows[p] = [names[p], r["command"], workload_label(r), (r.get("variant") or {}).get("label"),
                             r.get("mode"), gpu_name(r), _gpu_state(r), (r.get("env") or {}).get("timestamp")]
        except Exception as e:  # noqa: BLE001
            skipped[p] = "could not describe it: " + _reason(e)
    by_cmd: dict[str, list[tuple[str, dict]]] = {}
    for p, r in loaded:  # "prefix-ab": the first change-ab file's name for its command
        if p not in skipped:
            by_cmd.setdefault("change-ab" if r["command"] == "prefix-ab" else r["command"], []).append((p, r))
    units = _section_units(by_cmd, names)
    body = Doc()
    rendered = _render_units(units, names, jobs)
    for cmd, heading in SECTIONS:
        section = Doc()
        for (unit_cmd, _), (blocks, unit_skipped) in zip(units, rendered):
            if unit_cmd == cmd:
                section.blocks += blocks
                skipped.update(unit_skipped)
        if section.blocks:
            body.h(2, heading)
            body.extend(section)
    for cmd, items in by_cmd.items():
        body.h(2, f"Other results ({cmd})")
        for p, r in items:
            body.p(f"{p}: command {cmd!r} has no renderer; keys: {', '.join(sorted(r))}", "note")
    results = [(p, r) for p, r in loaded if p not in skipped]
    if not results:
        raise ValueError("report: no result file could be rendered: "
                         + "; ".join(problems + [f"{p}: {why}" for p, why in skipped.items()]))
    doc = Doc()
    doc.p(f"generated {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} from "
          f"{len(results)} result file(s)" + (f"; {len(problems) + len(skipped)} skipped (listed below)"
                                               if problems or skipped else ""), "note")
    if not plots_available():
        doc.p("No plots: matplotlib is not installed here. The tables are complete; `pip install \"vlaperf[plots]\"` "
              "and render again for the plots.", "warn")
    summary = Doc()
    # a file whose summary row fails (a field some old or damaged file has wrong) is left out of the summary, with
    # its reason, and keeps its own section; the other files' rows stay
    left_out = {p: reason for p, r in results
                if r["command"] == "bench" and (reason := _rendered(Doc(), _summary, [(p, r)], names))}
    reason = _rendered(summary, _summary, [(p, r) for p, r in results if p not in left_out], names)
    if reason:  # each file's row renders alone, not together
        summary.p("no summary: " + reason, "warn")
    for p, why in left_out.items():
        summary.p(f"left out of the summary: {names[p]}: {why}", "warn")
    doc.extend(summary)
    if summary.blocks:
        doc.h(2, "Files")
    doc.table(["#", "file", "command", "workload", "variant", "mode", "device", "GPU state", "timestamp"],
              [[i + 1] + index_rows[p] for i, (p, _) in enumerate(results)])
    for msg in problems + [f"{p}: {why}" for p, why in skipped.items()]:
        doc.p("skipped " + msg, "warn")
    if on_skip is not None:
        for msg in problems + [f"{p}: {why}" for p, why in skipped.items()]:
            on_skip(msg)
    doc.extend(body)
    doc.h(2, "Environment")
    _environment(doc, results)
    title = title or "vlaperf report"
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == ".html":
            out_path.write_text(doc.html(title))
        else:
            out_path.write_text(doc.markdown(title, out_path))
    except OSError as e:
        raise ValueError(f"report: cannot write {out_path}: {e}") from None
    return out_path

