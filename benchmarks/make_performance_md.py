"""Generate docs/performance.md from the result files under benchmarks/results/.

    python benchmarks/make_performance_md.py

Every figure in that page comes from a committed JSON file; nothing is typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlaperf.profile.processes import WIDE_SPREAD_PCT
from vlaperf.report.document import workload_label
from vlaperf.report.probes import FRONT_END_SPLIT, step_config_diff, step_config_value
from vlaperf.report.render import idle_words, result_batch
from vlaperf.report.schema import json_kind

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"


def _short(levers: str) -> str:
    abbrev = {"for_loop": "loop", "skip_masked_images": "skip", "trim_prompt_padding": "trim", "static_kv_cache": "kv",
              "sdpa": "sdpa", "fuse_projections": "fuse", "cuda_graph": "graph"}
    parts = [p for p in levers.replace("+", ",").split(",") if p]
    return "+".join(abbrev.get(p, p.replace("compile=", "compile:")) for p in parts) or "reference"


def _ms(x):
    return f"{x:.2f}" if x is not None else "-"


def _first(result, seconds, reference=False):
    """Files written before first-call timing moved ahead of the equivalence check carry no
    `first_call_timing` key: their first call had already run inside the check."""
    if not reference and result.get("first_call_timing") != "before equivalence check":
        return "n/a (ran in check)"
    return f"{seconds:.2f}"


def _rel(eq):
    return f"{eq['rel_l2']:.1e}" if eq else "-"


def _env(r):
    e = r["env"]
    return f"{e.get('gpu') or 'cpu'}, torch {e.get('torch')}, CUDA {e.get('cuda')}, driver {e.get('driver')}"


def bench_rows(results):
    rows = ["| workload | mode | variant | median ms | p95 ms | event median ms | action chunks/s | first call s | peak GiB | x floor | commit | GPU after the run | file |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in results:
        if r["command"] != "bench":
            continue
        w, e = r["timers"]["wall_ms"], r["timers"]["cuda_event_ms"]
        floor = r.get("roofline") or {}
        ratio = w["median"] / floor["floor_ms"] if floor.get("floor_ms") and r["env"].get("gpu") else None
        wl = workload_label(r)
        dtype = r["variant"].get("dtype", "bfloat16")
        if dtype != "bfloat16":  # the page's dtype is bfloat16: say where a run is not (`bench --dtype float32`)
            wl += f" ({dtype})"
        peak = r.get("peak_memory_bytes")
        batch = result_batch(r)
        served = " (reference weights released, as served)" if r.get("released_reference_bytes") else ""
        spread = r.get("processes")  # bench --processes N: the middle process, and the range of all N medians
        median = _ms(w["median"]) + (f" ({spread['count']} processes: {spread['wall_median_ms']['min']:.2f}-"
                                     f"{spread['wall_median_ms']['max']:.2f})" if spread else "")
        rows.append(f"| {wl} | {r['mode']} | {_short(r['variant']['label'])}{served} | {median} | {_ms(w['p95'])} | "
                    f"{_ms(e['median'] if e else None)} | {1e3 * batch / w['median']:.1f} | {_first(r, r['first_call_s'], not r['variant']['levers'])} | "
                    f"{f'{peak / 2**30:.2f}' if peak else '-'} | {f'{ratio:.1f}x' if ratio else '-'} | "
                    f"{(r['env'].get('git_commit') or '-')[:7]} | {_gpu_state(r['env'].get('gpu_state'))} | `{path.relative_to(ROOT)}` |")
    return rows


def rtc_cost_rows(results):
    """`bench --rtc` files: the guided call against the unguided one, interleaved in the same process."""
    rows = ["| GPU | workload | mode | variant | unguided median ms | guided median ms | guided / unguided | per round p10..p90 | rounds | "
            "rel L2 (guided calls checked) | commit | file |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in results:
        cost = (r.get("rtc") or {}).get("vs_unguided") if r["command"] == "bench" else None
        if not cost or not cost.get("wall_ms"):
            continue
        w, eq = cost["wall_ms"], r.get("equivalence") or {}
        rows.append(f"| {r['env'].get('gpu') or 'cpu'} | {r['workload']['id']} | {r['mode']} | {_short(r['variant']['label'])} | "
                    f"{_ms(w['unguided_median'])} | {_ms(w['guided_median'])} | **{w['guided_over_unguided']:.3f}x** | "
                    f"{w['per_round_p10']:.3f}..{w['per_round_p90']:.3f} | {cost['iters']} | {_rel(eq)} | "
                    f"{(r['env'].get('git_commit') or '-')[:7]} | `{path.relative_to(ROOT)}` |")
    return rows if len(rows) > 2 else []


def idle_cost_rows(results):
    """`bench --idle-ms` files: the call after an idle against the same call back to back, interleaved in one process."""
    rows = ["| GPU | workload | mode | variant | idle ms | back to back median ms | after idle median ms | after idle / back to back | "
            "per round p10..p90 | event: after idle / back to back | rounds | commit | file |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in results:
        idle = r.get("idle") if r["command"] == "bench" else None
        if not idle or not idle.get("wall_ms"):
            continue
        w, e = idle["wall_ms"], idle.get("cuda_event_ms")
        event = f"{e['after_idle_over_back_to_back']:.3f}x" if e else "-"
        rows.append(f"| {r['env'].get('gpu') or 'cpu'} | {workload_label(r)} | {r['mode']} | "
                    f"{_short(r['variant']['label'])} | {idle['idle_ms']:g}{' spinning' if idle.get('spin') else ''} | "
                    f"{_ms(w['back_to_back_median'])} | "
                    f"{_ms(w['after_idle_median'])} | **{w['after_idle_over_back_to_back']:.3f}x** | "
                    f"{w['per_round_p10']:.3f}..{w['per_round_p90']:.3f} | "
                    f"{event} | {idle['iters']} | "
                    f"{(r['env'].get('git_commit') or '-')[:7]} | `{path.relative_to(ROOT)}` |")
    return rows if len(rows) > 2 else []


def _times(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def _preset_of(levers: list[str], wam: bool = False) -> str | None:
    """Which preset a bench file's lever list is, as the preset stands today on a Hopper GPU, or None."""
    if wam:
        from vlaperf.engine.wam import WAM_PRESETS

        presets = {name: set(WAM_PRESETS[name]) for name in ("reference", "graph", "best")}
    else:
        from vlaperf.engine.levers import BEST_GPU, GRAPH_GPU, TUNED_FOR

        presets = {"reference": set(), "graph": set(GRAPH_GPU), "best": set(BEST_GPU) | set(TUNED_FOR)}
    return next((name for name, items in presets.items() if set(levers) == items), None)


def _newer(file, than) -> bool:
    """Whether result `file` (path, result) is newer than `than` by the timestamps their environments record; on a
    tie (one second's resolution) the later path, as the report's summary takes it (render.bench_summary), so the
    choice does not depend on the order the files are listed in."""
    (path, r), (held_path, held) = file, than
    return (str(r["env"].get("timestamp") or ""), str(path)) >= (str(held["env"].get("timestamp") or ""), str(held_path))


def measured_ceilings(results, wam=()):
    """GPU -> the newest bench file that measured that GPU's own ceilings (`vlaperf bench --ceilings measure`)."""
    measured = {}
    for path, r in [*results, *wam]:
        c = (r.get("roofline") or {}).get("ceilings") or {}
        if r["command"] == "bench" and str(c.get("source", "")).startswith("measured") and r["env"].get("gpu"):
            if r["env"]["gpu"] not in measured or _newer((path, r), measured[r["env"]["gpu"]]):
                measured[r["env"]["gpu"]] = (path, r)
    return measured


def headline(results, wam=()):
    """The newest `vlaperf bench` file (by the timestamp its environment records) of each GPU, workload and mode for
    the presets `reference`, `graph` and today's `best` (the world-action model's presets for its workloads): one
    record each where a `best` file exists, sorted by GPU, workload and mode. Files of a served process (reference
    weights released) are left out: their peak memory is not the engine's alone; so are `bench --rtc` files (a
    guided call, not the workload's plain one: in the single runs' table) and files of another dtype than bfloat16
    (the page's dtype: a newer `--dtype float32` best would have stood in the row for bf16's, against a bf16
    reference)."""
    newest: dict = {}
    for is_wam, group in ((False, results), (True, wam)):
        for path, r in group:
            preset = _preset_of(r["variant"]["levers"], is_wam) if r["command"] == "bench" else None
            if (preset is None or not r["env"].get("gpu") or r.get("released_reference_bytes") or r.get("rtc")
                    or r["variant"].get("dtype", "bfloat16") != "bfloat16"):
                continue
            key = (r["env"]["gpu"], workload_label(r), r["mode"])
            held = newest.setdefault(key, {}).get(preset)
            if held is None or _newer((path, r), held):
                newest[key][preset] = (path, r)
    lerobot = {}  # (GPU, workload) -> the newest full-size `vlaperf compare` file's LeRobot median and timestamp
    for path, r in results:
        summary = (r.get("timing") or {}).get("summary") or {} if r["command"] == "compare" else {}
        if "lerobot" in summary and not r["compare"].get("reduced") and r["env"].get("gpu"):
            # Compared by the full timestamp: two files of one day must give the later one, not the later path.
            key, stamp = (r["env"]["gpu"], workload_label(r)), r["env"].get("timestamp", "")
            if key not in lerobot or stamp > lerobot[key][1]:
                lerobot[key] = (summary["lerobot"]["wall_ms_median"], stamp)
    # best x floor at the GPU's own ceilings wherever a file measured them, so that one GPU's rows share one floor (a
    # file's own floor is at the H200's ceilings unless it measured its own)
    own = {gpu: r["roofline"]["ceilings"] for gpu, (_, r) in measured_ceilings(results, wam).items()}
    if own:
        from vlaperf.roofline import floor_at  # torch: only where a file measured a GPU's ceilings
    records = []
    for (gpu, wl, mode), got in sorted(newest.items()):
        if "best" not in got:
            continue
        path, r = got["best"]
        batch = result_batch(r)
        peer_ms, peer_stamp = lerobot.get((gpu, wl), (None, "")) if mode == "model" else (None, "")
        records.append({
            "gpu": gpu, "workload": wl, "mode": mode, "batch": batch, "path": path, "best": r,
            "median": {name: got[name][1]["timers"]["wall_ms"]["median"] if name in got else None
                       for name in ("reference", "graph", "best")},
            "day": {name: got[name][1]["env"].get("timestamp", "")[:10] for name in got},
            "processes": {name: got[name][1]["processes"] for name in got if got[name][1].get("processes")},
            "floor_ms": (floor_at(r, own[gpu]) if gpu in own else None) or (r.get("roofline") or {}).get("floor_ms"),
            "lerobot_ms": peer_ms, "lerobot_day": peer_stamp[:10]})
    return records


# A figure from `bench --processes N` whose processes' medians differ by this much or more carries their range: a
# host-bound reference's three processes on an H100 gave 211-335 ms, and its middle one alone read as settled
PROCESS_RANGE_SHOWN_PCT = WIDE_SPREAD_PCT


def _median_cell(rec, name, bold=False):
    """A preset's median (bold: best's), with the range of its processes' medians where they disagree
    (PROCESS_RANGE_SHOWN_PCT) and its own day where that is not best's."""
    day, notes = rec["day"], []
    spread = rec.get("processes", {}).get(name)
    if spread and spread["spread_pct"] >= PROCESS_RANGE_SHOWN_PCT:
        m = spread["wall_median_ms"]
        notes.append(f"{spread['count']} processes: {_ms(m['min'])}-{_ms(m['max'])}")
    if name in day and day[name] != day["best"]:
        notes.append(day[name])
    figure = _ms(rec["median"][name])
    return (f"**{figure}**" if bold else figure) + (f" ({'; '.join(notes)})" if notes else "")


def _peer_cell(rec):
    """LeRobot's eager median, with its own day where that is not best's."""
    day = rec["lerobot_day"]
    return _ms(rec["lerobot_ms"]) + (f" ({day})" if rec["lerobot_ms"] and day != rec["day"]["best"] else "")


def _checked(r):
    """best's actions against the reference, as its own file's equivalence check measured them before timing."""
    eq = r.get("equivalence")
    return "-" if not eq else f"{eq['rel_l2']:.1e}" + ("" if eq.get("passed") else " (FAILED)")


def headline_rows(results, wam=()):
    """docs/performance.md's table of where each workload stands (`headline`), every column."""
    rows = ["| GPU | workload | mode | reference ms | graph ms | best ms | best vs reference | best x floor | action chunks/s | "
            "best's first call s | best's peak GiB | best's rel L2 | best measured | LeRobot eager ms | best vs LeRobot | file |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in headline(results, wam):
        r, median, peak = rec["best"], rec["median"], rec["best"].get("peak_memory_bytes")
        rows.append(f"| {rec['gpu']} | {rec['workload']} | {rec['mode']} | {_median_cell(rec, 'reference')} | "
                    f"{_median_cell(rec, 'graph')} | {_median_cell(rec, 'best', bold=True)} | "
                    f"{_times(median['reference'], median['best'])} | {_times(median['best'], rec['floor_ms'])} | "
                    f"{1e3 * rec['batch'] / median['best']:.1f} | {_first(r, r['first_call_s'])} | "
                    f"{f'{peak / 2**30:.2f}' if peak else '-'} | {_checked(r)} | {rec['day']['best'] or '-'} | {_peer_cell(rec)} | "
                    f"{_times(rec['lerobot_ms'], median['best'])} | `{rec['path'].relative_to(ROOT)}` |")
    return rows


README_BEGIN = "<!-- begin: generated by benchmarks/make_performance_md.py from benchmarks/results/ (do not edit) -->"
README_END = "<!-- end: generated -->"


def readme_rows(results, wam=()):
    """The README's short form of the same table: model mode, the figures a reader compares."""
    records = [rec for rec in headline(results, wam) if rec["mode"] == "model"]
    gpus = sorted({rec["gpu"] for rec in records})
    # the GPU with the most workloads first (the one the figures were made on), the H200 (the card, whose
    # ceilings are the default yardstick) where two have as many, then the others, each in GPU order
    count = {gpu: sum(rec["gpu"] == gpu for rec in records) for gpu in gpus}
    records.sort(key=lambda rec: (-count[rec["gpu"]], "H200" not in rec["gpu"], rec["gpu"]))
    tolerances = ", ".join(sorted({f"{rec['best']['equivalence']['tolerance']:g}" for rec in records
                                   if rec["best"].get("equivalence")})) or "-"
    rows = [f"`vlaperf bench`, model mode, on the {' and '.join(gpus) or 'GPU'}: the newest file of each preset "
            "(wall-clock median; the range of several processes' medians where they differ by "
            f"{PROCESS_RANGE_SHOWN_PCT:g}% or more; a date where a figure is from another day than `best`'s). rel L2: "
            "`best`'s actions "
            f"against the reference in the check that ran before its timing (tolerance {tolerances}). All runs, with "
            "their files: [docs/performance.md](docs/performance.md).", "",
            "| workload | reference ms | graph ms | best ms | best x floor | action chunks/s | best's first call s | "
            "best's rel L2 | LeRobot eager ms | best measured |", "|---|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        r, median = rec["best"], rec["median"]
        where = f" ({rec['gpu']})" if len(gpus) > 1 else ""
        rows.append(f"| {rec['workload']}{where} | "
                    f"{_median_cell(rec, 'reference')} | {_median_cell(rec, 'graph')} | "
                    f"{_median_cell(rec, 'best', bold=True)} | "
                    f"{_times(median['best'], rec['floor_ms'])} | {1e3 * rec['batch'] / median['best']:.1f} | "
                    f"{_first(r, r['first_call_s'])} | {_checked(r)} | {_peer_cell(rec)} | {rec['day']['best'] or '-'} |")
    for gpu, (path, r) in sorted(measured_ceilings(results, wam).items()):
        c = r["roofline"]["ceilings"]
        rows += ["", f"Ceilings measured on the {gpu} by `vlaperf bench --ceilings measure`: {c['matmul_flops'] / 1e12:.0f} "
                 f"TFLOP/s bf16 matmul, {c['bandwidth'] / 1e12:.2f} TB/s copy ({r['env'].get('timestamp', '')[:10]}, "
                 f"`{path.relative_to(ROOT)}`)."]
    return rows


def write_readme_block(readme: Path, rows: list[str]) -> bool:
    """Replace what lies between README_BEGIN and README_END in `readme` by `rows`; True when it changed."""
    text = readme.read_text()
    # the end marker must follow the begin marker (swapped markers were an IndexError, not this message)
    if README_BEGIN not in text or README_END not in text.split(README_BEGIN, 1)[1]:
        raise SystemExit(f"{readme}: the markers {README_BEGIN!r} and {README_END!r} are missing or out of order")
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    fresh = head + README_BEGIN + "\n" + "\n".join(rows) + "\n" + README_END + tail
    if fresh != text:
        readme.write_text(fresh)
    return fresh != text


def _gpu_state(st):
    """SM clock / max and what held it, as nvidia-smi said right after the timed calls (bench
    records its environment then); '-' for files from before session 7."""
    from vlaperf.gpu_state import clock_event_names

    if not st or st.get("sm_clock_mhz") is None:
        return "-"
    held = clock_event_names(st.get("clock_event_reasons"))
    return f"{st['sm_clock_mhz']}/{st.get('max_sm_clock_mhz') or '?'} MHz" + (f" ({', '.join(held)})" if held else "")


def _idle_note(r) -> str:
    """A matrix file's idle before each timed call (`matrix --idle-ms`), or "" for back to back."""
    if not r.get("idle_ms"):
        return ""
    return f", each timed call after {idle_words(r['idle_ms'], r.get('idle_spin', False))} (`--idle-ms`)"


def _dtype_note(r) -> str:
    """", float32" where a run's weights are not the page's bfloat16 (`--dtype float32`), else nothing."""
    dtype = (r.get("variant") or {}).get("dtype", "bfloat16")
    return "" if dtype == "bfloat16" else f", {dtype}"


def matrix_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "matrix":
            continue
        stopped = (" **Interrupted** (stopped by its time limit's SIGTERM or Ctrl-C): no row was timed; the rows it had "
                   "prepared keep their first call and equivalence.") if r.get("interrupted") else ""
        out += [f"### matrix `{r['variant']['label']}` on {r['workload']['id']}{_dtype_note(r)}, {r.get('mode') or 'model'} mode ({_env(r)})", "",
                f"`{path.relative_to(ROOT)}`; interleaved, {r['iters']} rounds after {r['warmup']} warm-up calls per variant"
                + _idle_note(r) + "; speedup = ratio of median wall times vs the reference; p10..p90 = spread of per-round ratios." + stopped, "",
                "| variant | median ms | p95 ms | speedup | p10..p90 | rel L2 vs reference | first call s |",
                "|---|---|---|---|---|---|---|"]
        for v in r["variants"]:
            if "timers" not in v:  # skipped; an interrupted matrix's prepared rows still have a first call and a check
                first = v.get("first_call_s")
                out.append(f"| {_short(v['variant'])} | {v.get('skipped', '')} | | | | {_rel(v.get('equivalence'))} | "
                           f"{_first(r, first, v['variant'] == 'reference') if first is not None else ''} |")
                continue
            w, q, eq = v["timers"]["wall_ms"], v["ratio"]["wall_ms"], v.get("equivalence")
            out.append(f"| {_short(v['variant'])} | {_ms(w['median'])} | {_ms(w['p95'])} | {q['speedup']:.2f}x | "
                       f"{q['ratio_p10']:.2f}..{q['ratio_p90']:.2f} | {_rel(eq)} | "
                       f"{_first(r, v['first_call_s'], v['variant'] == 'reference')} |")
        out.append("")
    return out


def check_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "check":
            continue
        out += [f"### equivalence on {workload_label(r)} ({r['variant']['dtype']}, {_env(r)})", "",
                f"`{path.relative_to(ROOT)}`", "", "| variant | max abs | rel L2 | tolerance | passed |", "|---|---|---|---|---|"]
        notes = []
        for c in r["checks"]:
            # null errors: a variant that could not run (its `error` says why) or non-finite actions
            errs = " | ".join("" if c[k] is None else f"{c[k]:.3g}" for k in ("max_abs", "rel_l2"))
            passed = "could not run" if c.get("error") else "yes" if c["passed"] else "NO"
            out.append(f"| {_short(c['variant'])} | {errs} | {c['tolerance']:.0e} | {passed} |")
            if c.get("error"):
                notes.append(f"{_short(c['variant'])} could not run: {c['error']}")
        out += [""] + [n + "\n" for n in notes]
    return out


def breakdown_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "breakdown":
            continue
        b = r["breakdown"]
        whole = r["timers"]["cuda_event_ms"] or r["timers"]["wall_ms"]
        out += [f"### breakdown of {r['workload']['id']}, {_short(r['variant']['label'])} ({r['mode']} mode, {_env(r)})", "",
                f"`{path.relative_to(ROOT)}`; timer {b['timer']}, {b['iters']} calls"
                + (f", each after {idle_words(b['idle_ms'], b.get('idle_spin', False))} (`--idle-ms`)"
                   if b.get("idle_ms") else "")
                + f"; whole call median {_ms(whole['median'])} ms."
                + "".join(f" Note: {n}" for n in b.get("notes", [])), "",
                "| stage | median ms | p95 ms | share | per call | info |", "|---|---|---|---|---|---|"]
        for st in b["stages"]:
            info = st.get("info") or {}
            text = f"{info['tokens']} tokens, {'valid' if info.get('valid') else 'MASKED'}" if "tokens" in info else ""
            out.append(f"| {st['name']} | {_ms(st['median_ms'])} | {_ms(st['p95_ms'])} | {st['share'] * 100:.1f}% | {st['per_call']} | {text} |")
        out.append("")
        if r.get("processes"):  # breakdown --processes N: the table above is the middle process's
            from vlaperf.profile.processes import stage_rows

            p = r["processes"]
            out += [f"The same breakdown in {p['count']} fresh processes (the table above is process {p['headline'] + 1}); "
                    "each stage's median in every process and (max - min) / median:", "",
                    "| stage | " + " | ".join(f"process {i + 1} ms" for i in range(p["count"])) + " | spread |",
                    "|---|" + "---|" * (p["count"] + 1)]
            out += [f"| {name} | " + " | ".join(_ms(m) for m in medians)
                    + f" | {f'{spread:.1f}%' if spread is not None else '-'} |" for name, medians, spread in stage_rows(p)]
            out.append("")
    return out


def scaling_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "scaling":
            continue
        sc = r["scaling"]
        out += [f"### T(N) on {r['workload']['id']}{_dtype_note(r)}, {r.get('mode') or 'model'} mode ({_env(r)})", "", f"`{path.relative_to(ROOT)}`; {sc['timer']}; each T(N) is its point's median", "",
                "| variant | " + " | ".join(f"T({n}) ms" for n in sc["steps"]) + " | fit |",
                "|---|" + "---|" * len(sc["steps"]) + "---|"]
        for series in sc["series"]:
            f = series["fit"]
            pts = {p["steps"]: p["median_ms"] for p in series["points"]}
            out.append(f"| {_short(series['label'])} | " + " | ".join(_ms(pts.get(n)) for n in sc["steps"])
                       + f" | {f['intercept']:.2f} + {f['slope']:.3f}*N ms (r^2 {f['r2']:.4f}) |")
        out.append("")
    return out


def sync_tables(results):
    out = ["| workload | variant | syncs per call | sites | file |", "|---|---|---|---|---|"]
    found = False
    for path, r in results:
        if r["command"] != "syncs":
            continue
        found = True
        sy = r["syncs"]
        sites = "; ".join(f"{s['location']} x{s.get('per_call', s.get('count'))}" for s in sy.get("sites", []))
        out.append(f"| {r['workload']['id']} | {_short(r['variant']['label'])} | {sy['per_call']:.0f} ({sy['source']}) | {sites or '-'} | `{path.relative_to(ROOT)}` |")
    return out + [""] if found else []


def loadgen_tables(results):
    from vlaperf.report.render import server_backend

    out = []
    for path, r in results:
        if r["command"] != "loadgen":
            continue
        srv = r.get("server") or {}
        out += [f"### server under load: {r['workload']['id']}, {server_backend(r)} ({_env(r)})", "",
                f"`{path.relative_to(ROOT)}`; levers {_short(srv.get('levers_label', '?'))}, max batch {srv.get('max_batch', '?')}; "
                f"{r['loadgen']['observations']}; closed loop, loopback.", "",
                "| clients | ok / expected | lost + misrouted | req/s | round trip median ms | p95 | p99 | server infer median ms | overhead median ms | mean batch |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for ph in r["loadgen"]["phases"]:
            rt, inf, ov = ph["round_trip_ms"], ph["server_infer_ms"], ph["overhead_ms"]
            out.append(f"| {ph['clients']} | {ph['ok']} / {ph['expected']} | {ph['lost'] + ph['misrouted']} | {ph['requests_per_s']:.1f} | "
                       f"{_ms(rt['median'])} | {_ms(rt['p95'])} | {_ms(rt['p99'])} | {_ms(inf['median'])} | {_ms(ov['median'])} | "
                       f"{ph['batch_size']['mean']:.2f} |")
        out.append("")
    return out


def rollout_cadence_rows(results):
    """`vlaperf rollout` files with their own closed-loop calls (`--back-to-back`, session 50 on): a call at the control
    loop's cadence against the same call back to back, round trip and server time, and the server's keep-warm
    (`serve --keep-warm-ms`; "off" also for servers from before it existed)."""
    rows = []
    for path, r in results:
        if r["command"] != "rollout":
            continue
        ro, srv = r["rollout"], r.get("server") or {}
        b2b, ratio = ro.get("back_to_back"), ro.get("at_cadence_over_back_to_back") or {}
        if not b2b or ratio.get("policy_call_ms") is None:
            continue
        keep = srv.get("keep_warm_ms")
        waited = ro.get("keep_warm_waited_calls")  # calls at cadence that waited for a run (session 53 on)
        client = ro.get("client_keep_warm_ms")  # the rollout's own pings (`--client-keep-warm-ms`, session 52 on)
        server_ratio = ratio.get("server_infer_ms")
        extra = ro.get("at_cadence_extra_ms") or {}  # files from session 51 on
        split = [extra.get(k) for k in ("server_infer_ms", "server_queue_ms", "front_end_ms")]
        rest = [extra.get(k) for k in ("server_handoff_ms", "client_side_ms")]  # servers from session 51's end on
        ways = [extra.get(k) for k in ("uplink_ms", "downlink_ms")]  # servers from session 52 on
        own = [extra.get(k) for k in ("client_pack_ms", "client_unpack_ms")]  # rollouts from session 52 on
        rows.append(f"| {r['env'].get('gpu') or 'cpu'} | {r['workload']['id']} | {_short(srv.get('levers_label', '?'))} | "
                    f"{'off' if keep is None else f'{keep:g} ms'}"
                    f"{', quiet' if keep is not None and srv.get('keep_warm_quiet') else ''}"
                    f"{'' if waited is None else f' ({waited} waited)'}"
                    f"{'' if not client else f'; client {client:g} ms'}"
                    f" | {ro['control_hz']:g} / {ro['replan_every']}"
                    f"{', RTC' if ro.get('rtc') else ''} | "
                    f"{ro['policy_call_ms']['count']} / {b2b['policy_call_ms']['count']} | "
                    f"{_ms(ro['policy_call_ms']['median'])} | {_ms(b2b['policy_call_ms']['median'])} | "
                    f"**{ratio['policy_call_ms']:.3f}x** | "
                    f"{_ms(ro['policy_call_ms'].get('p95'))} / {_ms(b2b['policy_call_ms'].get('p95'))} | "
                    f"{_ms((ro.get('server_infer_ms') or {}).get('median'))} | "
                    f"{_ms((b2b.get('server_infer_ms') or {}).get('median'))} | "
                    f"{'-' if server_ratio is None else f'{server_ratio:.3f}x'} | "
                    f"{'-' if None in split else ' / '.join(f'{v:+.2f}' for v in split)} | "
                    f"{'-' if None in rest else ' / '.join(f'{v:+.2f}' for v in rest)}"
                    f"{'' if None in ways else ' (' + ' / '.join(f'{v:+.2f}' for v in ways)}"
                    f"{'' if None in ways or None in own else '; ' + ' / '.join(f'{v:+.2f}' for v in own)}"
                    f"{'' if None in ways else ')'} | "
                    f"{(r['env'].get('git_commit') or '-')[:7]} | `{path.relative_to(ROOT)}` |")
    if not rows:
        return []
    return ["### A control loop's calls against the same calls back to back (`vlaperf rollout --back-to-back`)", "",
            "Each file's loop calls at the control rate (the server idle in between) against the closed-loop calls the "
            "rollout sends after each episode on the same connection; medians, and the round trip's p95 (a request "
            "that waits for a keep-warm run shows there). keep-warm: the server's "
            "`--keep-warm-ms` (docs/serving.md; quiet: its runs stood aside where a steady client's next request "
            "was due, session 53 on; N waited: the calls at cadence that arrived during a run and waited for it, "
            "files from later in session 53 on), and the client's where it pinged between calls (`rollout "
            "--client-keep-warm-ms`). RTC: the loop asks for real-time chunking (`rollout --rtc`; its closed-loop "
            "calls are guided too). The client's machine is the server's (loopback). extra ms: the "
            "medians' differences, loop less closed loop, of the server's policy call / the wait for its inference "
            "thread / the rest of the round trip (files from session 51 on); of the rest: the event loop's wake-up for "
            "the result / what is outside the server (the client, the network, the reply's packing and send), and of "
            "that, in brackets, the request's way to the server / the reply's way back, and of those the client's packing / "
            "unpacking (files from session 52 on).", "",
            "| GPU | workload | levers | keep-warm | Hz / replan every | calls at cadence / back to back | round trip "
            "ms | back to back | ratio | round trip p95 ms: at cadence / back to back | server ms | back to back | "
            "ratio | extra ms: infer / queue / rest | of the rest: handoff / outside | commit | file |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows + [""]


def compare_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "compare":
            continue
        c, t = r["compare"], r.get("timing") or {}
        if not out:
            out += ["Same random weights, observation and noise in both implementations; latency interleaved in one",
                    "process (`vlaperf compare`). LeRobot runs as shipped (eager attention, SigLIP in float32).", "",
                    "LeRobot policy: LeRobot's own `predict_action_chunk` as shipped -> with vlaperf installed in it by",
                    "`accelerate_lerobot` (`--accelerate`; its image pre-processing included), where the file has them;",
                    "with RTC: the same with LeRobot's real-time chunking on and a previous chunk's leftover given (`--rtc`).",
                    "A * marks a file whose accelerated rows were timed as they came in the round (no `timing.settled`: the",
                    "files up to session 49's): its guided accelerated row came right after LeRobot's guided predict and carries",
                    "what that call leaves the next one (docs/perf-notes.md, session 49). Files with `timing.settled` time each",
                    "of those rows right after one of its own.", "",
                    "| workload | LeRobot | dtype | rel L2 reference / best vs LeRobot | passed | LeRobot ms | vlaperf reference ms | vlaperf best ms | best speedup | LeRobot policy ms | with RTC ms | file |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        eq, sm = c["equivalence"], t.get("summary") or {}

        def med(name):
            return _ms(sm[name]["wall_ms_median"]) if name in sm else "-"

        speed = f"{sm['vlaperf_best']['speedup_vs_lerobot_wall']:.2f}x" if "vlaperf_best" in sm else "-"
        rels = " / ".join(f"{eq[k]['rel_l2']:.2e}" for k in ("reference", "best") if k in eq)
        def shipped_to_accelerated(suffix=""):
            name = "vlaperf_in_lerobot_predict" + suffix
            unsettled = "*" if suffix and "settled" not in t else ""  # timing.settled: files from session 49 on
            return f"{med('lerobot_predict' + suffix)} -> {med(name)}{unsettled}" if name in sm else "-"

        out.append(f"| {r['workload']['id']}{' (reduced)' if c['reduced'] else ''} | {c['lerobot_version']} | {c['dtype']} | {rels} | "
                   f"{'yes' if c['passed'] else 'NO'} | {med('lerobot')} | {med('vlaperf_reference')} | {med('vlaperf_best')} | {speed} | "
                   f"{shipped_to_accelerated()} | {shipped_to_accelerated('_rtc')} | `{path.relative_to(ROOT)}` |")
    return out + [""] if out else []


def step_kernel_shape(r):
    """What a step-kernel bench timed: layers, rows, and (pi0.5) how many modulation tables its launches cycled."""
    o = r["workload"]["overrides"]
    tables = o.get("modulation_tables")
    return (f"{o.get('layers', 18)} layers, {o.get('rows', 51)} rows, {r['workload']['id']}"
            + (f", {tables} modulation table{'s' if tables != 1 else ''} cycled" if tables else "")
            + (", the arguments its engine call launched" if o.get("from_engine") else ""))


def step_kernel_rows(r):
    """The correct rows of a step-kernel sweep in the order they ran: the first is the run's defaults (the
    defaults of its day); each later one is labelled by the fields where it differs from the first."""
    configs = [x for x in r["configs"] if "us" in x and x["rel_l2_vs_fp32"] < 2e-2]
    first = r["configs"][0]["config"] if r["configs"] else {}
    return [(step_config_diff(x["config"], first, x.get("fitted")) or "the run's defaults", x) for x in configs]


def kernel_tables(results):
    out = []
    for path, r in results:
        if r["command"] != "kernel-bench":
            continue
        timing = ("back-to-back launches timed with CUDA events (fastest of 7 rounds of 20, three interleaved passes)"
                  if r["variant"]["label"].startswith("tma_probe") else "back-to-back launches timed with CUDA events"
                  if r.get("kernel") == "between_steps" else "CUDA-graph replays")
        out += [f"### {r['variant']['label']} ({_env(r)})", "", f"`{path.relative_to(ROOT)}`; {timing}, bf16, checked against float32.", ""]
        if r.get("kernel") == "between_steps":  # kernels/denoise_loop.py: the launch between two steps
            from vlaperf.report.probes import BETWEEN_STEPS_HEADER, between_steps_rows

            out += ["| " + " | ".join(BETWEEN_STEPS_HEADER) + " |", "|---|---|---|---|"]
            out += [f"| {t} | {us:.1f} | {e1:.1e} | {e2:.1e} |" for t, us, e1, e2 in between_steps_rows(r)]
        elif "cases" in r:  # small_m_matmul: one row per expert matmul
            out += ["| matmul (M = 51) | cuBLAS + eager elementwise us | kernel us | kernel TB/s | rel L2 | tiling |", "|---|---|---|---|---|---|"]
            for row in r["cases"]:
                b = row["best"] or {}
                out.append(f"| {row['case']} | {row['cublas_ms'] * 1e3:.1f} | {b.get('ms', float('nan')) * 1e3:.1f} | {b.get('tb_s', float('nan')):.2f} | "
                           f"{b.get('rel_l2', float('nan')):.1e} | bn={b.get('block_n')} bk={b.get('block_k')} split={b.get('split_k')} |")
        elif "phases" in r:  # expert_step: the whole step kernel per tiling, then per phase
            c = r["checks"]
            out += [f"Barrier self-check: persistent launch equals the per-(layer, phase) launches bit for bit: "
                    f"{'yes' if c['persistent_equals_multi_launch_bitwise'] else 'NO'}; every counter = {r['programs']} programs: "
                    f"{'yes' if c['barrier_counters_all_equal_programs'] else 'NO'}; timeouts: {c['barrier_timeouts']}.", "",
                    f"| step kernel ({step_kernel_shape(r)}) | us | weights GB/s | "
                    f"{'rel L2 vs the defaults' if r.get('reference') else 'rel L2 vs fp32'} | tiling |", "|---|---|---|---|---|"]
            for label, x in step_kernel_rows(r):
                tiling = " ".join(f"{k}={step_config_value(k, v, x.get('fitted'))}" for k, v in x["config"].items())
                out.append(f"| {label} | {x['us']:.1f} | {x['weights_gb_per_s']:.0f} | {x['rel_l2_vs_fp32']:.1e} | {tiling} |")
            if r["phases"]:
                out += ["", "| phase (all 18 layers, with its barriers) | us |", "|---|---|"]
                out += [f"| {name} | {us:.1f} |" for name, us in r["phases"].items()]
        elif r["variant"]["label"].startswith("tma_probe"):  # streaming probe: the fastest run per shape and load mode
            out += ["| task shape (18 layers, 51 rows) | loads / weights from | warps | stages | us | weights TB/s | KB/us a program | rel L2 |",
                    "|---|---|---|---|---|---|---|---|"]
            from vlaperf.report.probes import stream_probe_best

            for c in stream_probe_best(r):
                out.append(f"| {c['shape']} ({c['BN']} x {c['BK']}, {c['KS']} slices) | {c['mode']} | {c['warps']} | {c['stages']} | {c['us']:.1f} | "
                           f"{c['weights_tb_per_s']:.2f} | {c['kb_per_us_per_program']:.1f} | {c['rel_l2']:.1e} |")
        else:  # suffix_attention: the engine's folded matmuls against the fastest correct configurations
            ok = sorted((c for c in r["configs"] if "ms" in c and c["rel_l2"] < 1e-2), key=lambda c: c["ms"])
            shape = r["workload"]["overrides"]
            batch = f"batch {r['batch']}, " if r.get("batch", 1) > 1 else ""
            out += [f"| attention ({batch}{shape['query_rows']} folded rows a sample, {shape['keys']} keys) | us | rel L2 |",
                    "|---|---|---|",
                    f"| {r.get('baseline', 'folded matmuls')} (engine without the kernels) | {r['folded_ms'] * 1e3:.1f} | - |"]
            # a --splits-only sweep: every count in the order asked, with the count each ran (6 of 600 keys run as 5)
            shown = [c for c in r["configs"] if "ms" in c and c["rel_l2"] < 1e-2] if r.get("splits_only") else ok[:3]
            for c in shown:
                run = f" ({c['effective_splits']} run)" if "effective_splits" in c else ""
                out.append(f"| kernel bm={c['block_m']} bn={c['block_n']} splits={c['splits']}{run} warps={c['num_warps']} "
                           f"stages={c['num_stages']} | {c['ms'] * 1e3:.1f} | {c['rel_l2']:.1e} |")
        out.append("")
    return out


def ab_tables(results):
    """In-process A/B files of one change inside the whole call (benchmarks/heads_ab.py,
    benchmarks/step_config_ab.py, benchmarks/prefix_tiles_ab.py, benchmarks/change_ab.py): medians of both sides and the per-round ratio. The commit
    says which kernel ran (the heads: float32 FMA products at 55d64b1, TF32x3 from session 6)."""
    rows = ["| change | workload | commit | old side ms | new side ms | speedup (old / new, median) | p10..p90 | new side rel L2 vs reference | file |",
            "|---|---|---|---|---|---|---|---|---|"]
    for path, r in results:
        if r["command"] == "heads-ab":
            change, old, new, eq = "float32 heads: cuBLAS -> small_m_matmul", "cublas_heads", "kernel_heads", r["equivalence_kernel_heads"]
        elif r["command"] == "step-config-ab":
            # the fitted fields as each side resolved them, where the file records its launches (session 14 on)
            fb, fd = ((r.get(side) or {}).get("config") for side in ("base_launch", "default_launch"))
            diff = [f"{k} {step_config_value(k, r['base_config'].get(k), fb)}->{step_config_value(k, v, fd)}"
                    for k, v in r["default_config"].items() if r["base_config"].get(k) != v]
            if r.get("identity_mod"):  # step_config_ab.py --identity-mod: pi0 through pi0.5's modulated path
                diff.append("pi0 through pi0.5's modulated path (identity table)")
            change, old, new, eq = "step kernel: " + ", ".join(diff), "base", "defaults", r["equivalence_defaults"]
        elif r["command"] == "prefix-tiles-ab":
            diff = [f"{k} {r['today_tiles'].get(k)}->{v}" for k, v in r["pick_tiles"].items() if r["today_tiles"].get(k) != v]
            change, old, new, eq = "prefix attention tiles: " + (", ".join(diff) or "unchanged"), "today", "pick", r["equivalence_pick"]
        elif r["command"] in ("change-ab", "prefix-ab"):  # benchmarks/change_ab.py (its first file: "prefix-ab")
            change, old, new, eq = (f"engine change: {r['change']} ({_short(r['variant']['label'])})", "without", "with",
                                    r["equivalence_with"])
        else:
            continue
        lo, hi = r["speedup_p10_p90"]
        rows.append(f"| {change} | {workload_label(r)} | {(r['env'].get('git_commit') or '')[:7]} | {_ms(r['median_ms'][old])} | {_ms(r['median_ms'][new])} | "
                    f"{r['speedup_median']:.3f}x | {lo:.3f}..{hi:.3f} | {_rel(eq)} | `{path.relative_to(ROOT)}` |")
    return rows + [""] if len(rows) > 2 else []


def call_overhead_tables(results):
    """benchmarks/call_overhead.py: a graphed call against its replay alone and its pieces."""
    out = []
    for path, r in results:
        if r["command"] != "call-overhead":
            continue
        m = r["median_ms"]
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {_short(r['variant']['label'])}, commit "
                f"{(r['env'].get('git_commit') or '')[:7]}, {r['rounds']} interleaved rounds, each synced): the call "
                f"costs {m['call'] - m['replay']:.3f} ms more than its graph replay", "",
                "| piece | median ms |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in m.items()] + [""]
    return out


def served_path_tables(results):
    """benchmarks/served_path_probe.py: the policy call phase by phase, and the websocket front end
    around the real policy, a stand-in that sleeps as long (the GIL released) and one that returns at once."""
    out = []
    for path, r in results:
        if r["command"] != "served-path-probe":
            continue
        pol, fe = r["policy"], r["front_end"]
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {_short(r['variant']['label'])}, commit "
                f"{(r['env'].get('git_commit') or '')[:7]}, {r['rounds']} rounds): the policy call {pol['infer_ms']:.3f} ms "
                f"against the model call {pol['model_ms']:.3f} ms in the same process; each phase synced on its own", "",
                "| policy phase | median ms |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in pol["phases_ms"].items()]
        split = [(key, head) for key, head in FRONT_END_SPLIT if any(key in v for v in fe.values())]
        out += ["", "| front end around | round trip ms | server infer ms | front end ms |"
                + "".join(f" {head} |" for _, head in split), "|---|---|---|---|" + "---|" * len(split)]
        out += [f"| {k.replace('_', ' ')} | {v['round_trip_ms']:.3f} | {v['server_infer_ms']:.3f} | {v['front_end_ms']:.3f} |"
                + "".join(f" {v[key]:.3f} |" if key in v else " |" for key, _ in split) for k, v in fe.items()] + [""]
    return out


def launch_probe_tables(results):
    """benchmarks/launch_probe.py: the host latency a replayed call exposes, its pieces, and graphs
    of N one-element kernels."""
    from vlaperf.report.probes import launch_probe_graphs, launch_probe_row, launch_probe_rows

    out = []
    for path, r in results:
        if r["command"] != "launch-probe":
            continue
        rows = launch_probe_rows(r)
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {_short(r['variant']['label'])}, commit "
                f"{(r['env'].get('git_commit') or '')[:7]}, {r['rounds']} rounds each): exposed = the GPU span with the GPU "
                "idle at the start less the span queued behind a 2 ms sleep kernel", "",
                "| what | GPU span, idle start ms | GPU span, host hidden ms | exposed ms | host until return ms | wall, synced ms |",
                "|---|---|---|---|---|---|"]
        out += ["| " + " | ".join([name] + [f"{x:.4f}" for x in launch_probe_row(v)]) + " |" for name, v in rows] + [""]
        out += [f"{name}: {json.dumps(census)}" for name, census in launch_probe_graphs(r)] + [""]
    return out


def graph_context_tables(results):
    """benchmarks/graph_context_probe.py: graph engines timed before and after the cumulative matrix's other rows."""
    from vlaperf.report.probes import graph_context_rows

    out = []
    for path, r in results:
        if r["command"] != "graph-context-probe":
            continue
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {_short(r['graph_spec'])}, commit "
                f"{(r['env'].get('git_commit') or '')[:7]}, {r['iters']} calls after {r['warmup']} warm-up at each point; "
                "g1 captured first, g2 after the eager rows, g3 after the compiled rows)", "",
                "| point | engine | wall median ms | event median ms | first call s | switches changed |", "|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(_ms(c) if isinstance(c, float) else str(c if c is not None else "-") for c in row)
                + " |" for row in graph_context_rows(r)] + [""]
        for pair, rows in (r.get("kernel_diff") or {}).items():
            if rows:
                out += [f"Kernels, {pair} (per call, largest differences first):", "",
                        "| kernel | us before | us after |", "|---|---|---|"]
                out += [f"| `{k['name'][:90]}` | {k['us_a']:.1f} | {k['us_b']:.1f} |" for k in rows] + [""]
    return out


def upload_probe_tables(results):
    """benchmarks/upload_probe.py: the policy path's host <-> device pieces, each timed alone."""
    out = []
    for path, r in results:
        if r["command"] != "upload-probe":
            continue
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, commit {(r['env'].get('git_commit') or '')[:7]}, "
                f"{r['rounds']} rounds each, the GPU idle before each piece, {r['staging_bytes']} bytes staged a call)", "",
                "| piece | median ms |", "|---|---|"] + [f"| {k.replace('_', ' ')} | {v:.3f} |" for k, v in r["median_ms"].items()]
        out.append("")
        if r.get("hugepage_staging"):
            out += [f"The staging buffer in 2 MB pages: {json.dumps(r['hugepage_staging'])}", ""]
    return out


def prompt_len_tables(results):
    """benchmarks/prompt_len_probe.py: one engine, libero-pi0's observation with its kept prompt padded to several
    lengths, interleaved in one process."""
    from vlaperf.report.probes import prompt_len_probe_header, prompt_len_probe_rows

    out = []
    for path, r in results:
        if r["command"] != "prompt-len-probe":
            continue
        header = prompt_len_probe_header(r)
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {_short(r['variant']['label'])}, commit "
                f"{(r['env'].get('git_commit') or '')[:7]}, {r['valid_prompt_tokens']} valid prompt tokens, "
                f"{r['rounds']} rounds)", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in prompt_len_probe_rows(r)] + [""]
    return out


def _probe_tables(results, command: str, header: list[str], rows_fn, note: str = "", small_floats: bool = False):
    """One table per result file of `command` (the GEMM probes and benches): the file and its
    commit, then `rows_fn(result)` under `header`; with `small_floats`, values below 0.1 (errors)
    in scientific notation."""
    out = []
    for path, r in results:
        if r["command"] != command:
            continue
        out += [f"`{path.relative_to(ROOT)}` (commit {(r['env'].get('git_commit') or '')[:7]}; CUDA-graph replays{note})", "",
                "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(f"{c:.1e}" if small_floats and isinstance(c, float) and c < 0.1 else str(c) for c in row)
                + " |" for row in rows_fn(r)] + [""]
    return out


def gemm_probe_tables(results):
    """benchmarks/gemm_probe.py: the prefix's GEMM shapes alone, cuBLAS against max-autotune."""
    from vlaperf.report.probes import gemm_probe_rows

    return _probe_tables(results, "gemm-probe", ["shape", "M x K x N", "cuBLAS us", "TFLOP/s", "max-autotune us", "TFLOP/s"],
                         gemm_probe_rows)


def cublaslt_probe_tables(results):
    """benchmarks/cublaslt_probe.py: the prefix's GEMM shapes through every algorithm of cuBLASLt's heuristic."""
    from vlaperf.report.probes import CUBLASLT_PROBE_HEADER, cublaslt_probe_rows

    return _probe_tables(results, "cublaslt-probe", CUBLASLT_PROBE_HEADER, cublaslt_probe_rows)


def fp8_gemm_probe_tables(results):
    """benchmarks/fp8_gemm_probe.py: libero-pi0's GEMM shapes in float8 (row-wise scales) against bf16."""
    from vlaperf.report.probes import FP8_GEMM_PROBE_HEADER, fp8_gemm_probe_rows

    return _probe_tables(results, "fp8-gemm-probe", FP8_GEMM_PROBE_HEADER, fp8_gemm_probe_rows,
                         note=", weight copies larger than L2", small_floats=True)


def fp8_action_error_tables(results):
    """benchmarks/fp8_action_error.py: the actions with every transformer matmul's operands rounded (CPU, emulated)."""
    out = []
    for path, r in results:
        if r["command"] != "fp8-action-error":
            continue
        weights = r["variant"].get("checkpoint") or "random weights"
        out += [f"`{path.relative_to(ROOT)}` ({r['workload']['id']}, {weights}, {r['matmuls_rounded']} matmuls rounded, against the "
                f"float32 reference on {r['env'].get('cpu') or 'the CPU'}; commit {(r['env'].get('git_commit') or '-')[:7]})", "",
                "| operands rounded to | actions rel L2 | max abs | within bf16's tolerance |", "|---|---|---|---|"]
        names = {"bf16": "bf16 (weights and inputs)", "fp8_w": "e4m3 weights (row scales), bf16 inputs",
                 "fp8_w_a": "e4m3 weights and inputs (row scales)"}
        out += [f"| {names.get(row['rounding'], row['rounding'])} | {row['rel_l2']:.1e} | {row['max_abs']:.3f} | "
                f"{'yes' if row['within_bf16_tolerance'] else 'no'} ({row['bf16_tolerance']:g}) |" for row in r["rows"]] + [""]
    return out


def splitk_probe_tables(results):
    """benchmarks/splitk_probe.py: the prefix's weakest GEMMs as other cuBLAS formulations."""
    from vlaperf.report.probes import splitk_probe_rows

    return _probe_tables(results, "splitk-probe", ["shape", "M x K x N", "formulation", "us", "TFLOP/s", "rel L2"],
                         splitk_probe_rows, small_floats=True)


def geglu_bench_tables(results):
    """benchmarks/geglu_matmul_bench.py (session 10; the kernel was taken out): gate_up + GELU x up."""
    from vlaperf.report.probes import geglu_bench_rows

    return _probe_tables(results, "geglu-bench", ["M", "tiling", "us", "TFLOP/s", "rel L2", "speedup"], geglu_bench_rows,
                         note="; tiling: kind, BM, BN, BK, GROUP_M, warps, stages", small_floats=True)


def wam_attention_probe_tables(results):
    """benchmarks/wam_attention_probe.py: the world-action model's attention calls by SDPA backend."""
    from vlaperf.report.probes import WAM_ATTENTION_BACKENDS, wam_attention_probe_rows

    return _probe_tables(results, "wam-attention-probe",
                         ["call", "q x k tokens", *(f"{b} us" for b in WAM_ATTENTION_BACKENDS)], wam_attention_probe_rows)


def prefix_attention_probe_tables(results):
    """benchmarks/prefix_attention_probe.py: the prefix attention by PyTorch's fused kernels."""
    from vlaperf.report.probes import prefix_attention_probe_rows

    return _probe_tables(results, "prefix-attention-probe", ["kernel", "us", "rel L2 (valid rows, vs float32)"],
                         prefix_attention_probe_rows, small_floats=True)


def first_call_tables(results):
    """benchmarks/first_call.py: the first call of a fresh process, cold and warm caches."""
    from vlaperf.report.probes import FIRST_CALL_HEADER, first_call_rows

    rows = first_call_rows([(str(p.relative_to(ROOT)), r) for p, r in results if r["command"] == "first-call"])
    if not rows:
        return []
    fmt = lambda c: f"{c:.2f}" if isinstance(c, float) else str(c)  # noqa: E731
    return ["A fresh process each (commit in the file); torch.compile s = Dynamo's whole compile "
            "(`_compile.compile_inner`), inductor s = its `compile_fx_inner` part; Triton in process = the engine's "
            "kernels compiled in this process (inductor compiles its own in worker processes); since version 52 "
            "(`best-precompile` files) mostly in a thread beside torch.compile, so not all of it adds to the first call. "
            "Inductor warm-up: its compiler, worker pool and source hash started during the engine's construction "
            "(session 12; `-`: a file without the field); compile threads: the kernel-compile thread's workers (`-`: "
            "the engine's default); compile workers: the worker processes that compile the engine's kernels during "
            "the first call (`Engine` `COMPILE_WORKERS`, 3 since session 12; 0: the thread alone; `-`: before them).", "",
            "| " + " | ".join(FIRST_CALL_HEADER) + " |", "|" + "---|" * len(FIRST_CALL_HEADER)] + \
        ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows] + [""]


def _ratio(q):
    if not q:
        return "-"
    return f"{q['speedup']:.2f}x ({q['ratio_p10']:.2f}..{q['ratio_p90']:.2f})" + ("" if q["significant"] else " noise")


def wam_tables(results):
    """The world-action model's files: benches, checks and matrices (variant x sparsity)."""
    out = ["| workload | mode | variant | settings | median ms | p95 ms | first call s | peak GiB | floor ms | x floor | commit | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in results:
        if r["command"] != "bench":
            continue
        w, fl, st = r["timers"]["wall_ms"], r.get("roofline") or {}, r["workload"].get("settings", {})
        settings = ", ".join(f"{k} {st[k]}" for k in ("batch", "steps", "video_steps", "sparsity", "cfg_scale") if k in st)
        peak = r.get("peak_memory_bytes")
        out.append(f"| {r['workload']['id']} | {r['mode']} | {_short(r['variant']['label'])} | {settings} | {_ms(w['median'])} | "
                   f"{_ms(w['p95'])} | {_first(r, r['first_call_s'], not r['variant']['levers'])} | "
                   f"{f'{peak / 2**30:.2f}' if peak else '-'} | {_ms(fl.get('floor_ms'))} | "
                   f"{w['median'] / fl['floor_ms']:.1f}x | {(r['env'].get('git_commit') or '-')[:7]} | `{path.relative_to(ROOT)}` |")
    out.append("")
    for path, r in results:
        if r["command"] != "check":
            continue
        out += [f"### equivalence on {workload_label(r)} ({r['variant']['dtype']}, {_env(r)})", "",
                f"`{path.relative_to(ROOT)}`; actions and predicted video against `WorldActionModel.generate`", "",
                "| variant | sparsity | actions rel L2 | video rel L2 | tolerance | passed |", "|---|---|---|---|---|---|"]
        for c in r["checks"]:
            out.append(f"| {_short(c['variant'])} | {c['sparsity']} | {c['rel_l2']:.3g} | {c['video_rel_l2']:.3g} | "
                       f"{c['tolerance']:.0e} | {'yes' if c['passed'] else 'NO'} |")
        out.append("")
    for path, r in results:
        if r["command"] != "matrix":
            continue
        st = r["workload"].get("settings", {})
        what = "one forward" if r["mode"] == "forward" else "one generate call"
        out += [f"### matrix `{r['variant']['label']}` on {r['workload']['id']}{_dtype_note(r)}, batch {st.get('batch')}, {what} ({_env(r)})", "",
                f"`{path.relative_to(ROOT)}`; every row interleaved in one process, {r['iters']} rounds after {r['warmup']} "
                "warm-up calls" + _idle_note(r) + "; ratios of medians with the p10..p90 of the per-round ratios; vs reference = the reference "
                "at the same sparsity over the row; sparsity gain = the same variant at sparsity none over the row.", "",
                "| variant | sparsity | median ms | p95 ms | vs reference | sparsity gain | actions rel L2 | first call s | floor ms |",
                "|---|---|---|---|---|---|---|---|---|"]
        for v in r["variants"]:
            if "timers" not in v:
                out.append(f"| {_short(v['variant'])} | {v['sparsity']} | {v.get('skipped', '')} | | | | | | |")
                continue
            w = v["timers"]["wall_ms"]
            out.append(f"| {_short(v['variant'])} | {v['sparsity']} | {_ms(w['median'])} | {_ms(w['p95'])} | "
                       f"{_ratio(v.get('vs_reference'))} | {_ratio(v.get('sparsity_gain'))} | {_rel(v.get('equivalence'))} | "
                       f"{_first(r, v['first_call_s'], v['variant'] == 'reference')} | {_ms(v.get('roofline_floor_ms'))} |")
        out.append("")
    return out


def _load(path: Path) -> dict:
    """One result file's JSON object; a damaged file stops the script with its path (a bare JSONDecodeError
    did not say which of the hundreds of files it was)."""
    try:
        r = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:  # a binary file (a gzip, say) was a traceback that named no file
        raise SystemExit(f"{path}: not valid JSON (not UTF-8 text: byte {e.start}: {e.reason})") from None
    if not isinstance(r, dict):
        raise SystemExit(f"{path}: expected a result object, got {json_kind(r)}")
    return r


def main() -> None:
    from vlaperf.workloads import WAM_WORKLOADS

    # profiles/ holds logs and the raw records of probes (e.g. another commit's code timed beside today's): not figures
    every = [(p, _load(p)) for p in sorted(RESULTS.rglob("*.json"))
             if "profiles" not in p.relative_to(RESULTS).parts]
    wam = [(p, r) for p, r in every if r.get("workload", {}).get("id") in WAM_WORKLOADS]
    results = [(p, r) for p, r in every if r.get("workload", {}).get("id") not in WAM_WORKLOADS]
    lines = ["# Performance", "",
             "Generated by `python benchmarks/make_performance_md.py` from the result files under `benchmarks/results/`",
             "(do not edit by hand). Abbreviations: loop = for_loop, skip = skip_masked_images, trim = trim_prompt_padding,",
             "kv = static_kv_cache, fuse = fuse_projections, graph = cuda_graph. Weights are random bf16 (openpi dtypes);",
             "model mode = `sample_actions` on device tensors with fixed noise; wall = synced host clock.",
             "x floor = median over the roofline floor of the variant's computed tokens (vlaperf/roofline.py) at the file's ceilings:",
             "the H200's 780 TFLOP/s and 4.23 TB/s, or the device's own measured by `vlaperf bench --ceilings measure`.",
             "", "## Where each workload stands", "",
             "The newest `vlaperf bench` file of each workload and mode for three presets: `reference` (no levers: openpi's",
             "semantics), `graph` (the exact levers in one CUDA graph, no compile) and `best` as it is today on Hopper GPUs",
             "(graph + compile=default + compile_layers + triton_kernels + megakernel; the world-action model's own presets for",
             "wam-761, `vlaperf levers`). Each figure is that file's wall-clock",
             "median (of `bench --processes N`: the middle process's, with all N medians' range where they differ by "
             f"{PROCESS_RANGE_SHOWN_PCT:g}% or more);",
             "another preset's figure carries its own day where it was measured on another day than `best`'s. `best vs",
             "reference` divides two files' medians (separate processes; the matrices below compare in one). LeRobot eager:",
             "LeRobot's pi0 / pi05 as shipped, from the newest `vlaperf compare` file of the workload (model mode rows).",
             "best x floor: at the GPU's own ceilings wherever a file measured them (`--ceilings measure`, the newest such",
             "file's; its rates are below the README's table), so that one GPU's rows share one floor; else at the file's.",
             "Every file of every run follows under Single runs.", ""]
    lines += headline_rows(results, wam) + ["", "## Single runs (`vlaperf bench`)", ""]
    lines += bench_rows(results) + [""]
    rtc = rtc_cost_rows(results)
    lines += ["## What real-time chunking's guidance costs (`vlaperf bench --rtc`)", "",
              "The guided call (a previous chunk with 3 actions executed and a delay of 2, LeRobot's RTCConfig defaults) "
              "against the unguided one of the same variant, interleaved in one process after the file's main timing "
              "(`rtc.vs_unguided`); the single runs above give the guided call's own timing.", ""] + rtc + [""] if rtc else []
    idle = idle_cost_rows(results)
    lines += ["## What an idle between calls costs (`vlaperf bench --idle-ms`)", "",
              "A robot calls its policy once per control period and waits in between. The file's call again after that "
              "idle (the host asleep, or spinning on the clock where it says so; the device synchronized) against the same "
              "call back to back, interleaved in one "
              "process after the file's main timing (`idle`); the single runs above are back to back.", ""] + idle + [""] \
        if idle else []
    lines += ["## Matrices (`vlaperf matrix`)", ""] + matrix_tables(results)
    lines += ["## Equivalence (`vlaperf check`)", ""] + check_tables(results)
    lines += ["## World-action model (`wam-761`: seed 000's model class; models/wam.py, engine/wam.py)", "",
              "Abbreviations as above plus the world-action levers (`vlaperf levers`); exact = host_schedule, cached_keep_index,",
              "sparse_sampler, context_kv_cache, video_kv_cache, sdpa; graph = exact + cuda_graph; best = graph + compile=default.",
              "The floor: vlaperf/roofline.py `wam_roofline` (each forward at max(FLOPs / 780 TFLOP/s, weight bytes / 4.23 TB/s)).", ""]
    lines += wam_tables(wam)
    lines += ["## Stage breakdowns (`vlaperf breakdown`)", ""] + breakdown_tables(results)
    lines += ["## Step scaling (`vlaperf scaling`)", ""] + scaling_tables(results)
    lines += ["## Host syncs per call (`vlaperf syncs`)", ""] + sync_tables(results)
    lines += ["## Serving (`vlaperf serve` + `vlaperf loadgen`)", ""] + loadgen_tables(results) + \
        rollout_cadence_rows(results)
    lines += ["## Where a served call's time goes beyond the model call (`benchmarks/served_path_probe.py`)", ""] + \
        served_path_tables(results) + upload_probe_tables(results) + launch_probe_tables(results)
    lines += ["## Side by side with LeRobot (`vlaperf compare`)", ""] + compare_tables(results)
    lines += ["## One change inside the whole call, A/B in one process (`benchmarks/*_ab.py`)", ""] + ab_tables(results)
    lines += ["## What the kept prompt's length costs the call (`benchmarks/prompt_len_probe.py`)", ""] + \
        prompt_len_tables(results)
    lines += ["## A graphed call besides its replay (`benchmarks/call_overhead.py`)", ""] + call_overhead_tables(results)
    context = graph_context_tables(results)  # from session 44's script on: no heading before a file exists
    lines += ["## The graph row in the cumulative matrix's context (`benchmarks/graph_context_probe.py`)", ""] + \
        context if context else []
    lines += ["## GEMM shapes alone (`benchmarks/gemm_probe.py`)", ""] + gemm_probe_tables(results)
    lines += ["## Prefix GEMMs as other cuBLAS calls (`benchmarks/splitk_probe.py`)", ""] + splitk_probe_tables(results)
    lines += ["## Prefix GEMMs through every algorithm of cuBLASLt's heuristic (`benchmarks/cublaslt_probe.py`)", ""] + \
        cublaslt_probe_tables(results)
    lines += ["## libero-pi0's GEMM shapes in float8 (`benchmarks/fp8_gemm_probe.py`)", ""] + fp8_gemm_probe_tables(results) + \
        fp8_action_error_tables(results)
    lines += ["## Gemma gate_up with GELU x up in one Triton GEMM (session 10, taken out)", ""] + geglu_bench_tables(results)
    lines += ["## The prefix attention by PyTorch's fused kernels (`benchmarks/prefix_attention_probe.py`)", ""] + \
        prefix_attention_probe_tables(results)
    lines += ["## The world-action model's attention calls by SDPA backend (`benchmarks/wam_attention_probe.py`)", ""] + \
        wam_attention_probe_tables(wam)
    lines += ["## The first call of a fresh process (`benchmarks/first_call.py`)", ""] + first_call_tables(results)
    lines += ["## Kernels (`benchmarks/*_bench.py`)", ""] + kernel_tables(results)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")
    if write_readme_block(README, readme_rows(results, wam)):
        print(f"updated the figures in {README}")


if __name__ == "__main__":
    import argparse

    # no options: --help says what the script writes, and anything else is refused before the docs are rewritten
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
