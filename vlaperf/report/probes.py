"""The report's sections for the files the scripts in benchmarks/ write: the probes, A/B runs and kernel benches
that docs/perf-notes.md cites (vlaperf's own commands have theirs in render.py). Each renderer is
renderer(doc, path, result), or renderer(doc, [(path, result), ...]) for a section drawn over several files;
the `*_rows` helpers are shared with benchmarks/make_performance_md.py, so both tables read a file one way."""

from __future__ import annotations

from pathlib import Path

from vlaperf.report.document import (Doc, clip, gpu_name, new_figure, plots_available, sci, short_variant,
                                      workload_label)


def _ab_text(r: dict, ratio: str, rel_l2: float | None, new_side: str, eq: dict) -> str:
    """What every in-process A/B file says the same way: rounds, the per-round ratio and its
    spread, how far the two sides' outputs are apart, and the new side's equivalence."""
    apart = f"; outputs differ by rel L2 {rel_l2:.1e}" if rel_l2 is not None else ""
    return (f"{r['rounds']} interleaved rounds in one process; speedup = {ratio}, median of per-round ratios (p10..p90 "
            f"{r['speedup_p10_p90'][0]:.3f}..{r['speedup_p10_p90'][1]:.3f}){apart}; {new_side} against the reference: "
            f"rel L2 {sci(eq.get('rel_l2'))}, passed {eq.get('passed')}")


def _ab_medians(doc: Doc, r: dict, first: str = "side") -> None:
    doc.table([first, "median ms"], [[k, v] for k, v in r["median_ms"].items()] + [["speedup", r["speedup_median"]]])


def _heads_ab(doc: Doc, path: str, r: dict) -> None:
    """The interleaved A/B of the denoise step's float32 heads, cuBLAS against the small_m_matmul
    kernel (benchmarks/heads_ab.py: float32 FMA products in session 5, TF32x3 since session 6)."""
    eq = r.get("equivalence_kernel_heads") or {}
    doc.h(3, f"heads A/B: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(_ab_text(r, "cuBLAS heads over kernel heads", r["rel_l2_kernel_vs_cublas_heads"], "kernel heads", eq), "")
    _ab_medians(doc, r, "heads")


# StepKernelConfig's fields whose value means "fitted to the launch" (expert_step.fit_config)
STEP_FITTED = {"qkv_pairs": -1, "splits": 0, "merge_bd": 0, "ssq_from_writers": -1}


def step_config_value(field: str, value, fitted: dict | None = None) -> str:
    """A step-kernel config value as the tables show it: a fitted field as `fitted`, with what it
    resolved to when the file records that (`fitted`: the resolved config)."""
    if STEP_FITTED.get(field) == value:
        return f"fitted ({fitted[field]})" if fitted and field in fitted else "fitted"
    return str(value)


def step_config_diff(config: dict, first: dict, fitted: dict | None = None) -> str:
    """The fields of a sweep row's config that differ from the run's first row, `k=v, ...`."""
    return ", ".join(f"{k}={step_config_value(k, v, fitted)}" for k, v in config.items() if first.get(k) != v)


def _step_config_ab(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/step_config_ab.py: `best` with an older step-kernel tiling against today's
    defaults, interleaved in one process; the table lists the fields where the two differ."""
    eq = r.get("equivalence_defaults") or {}
    base, new = r["base_config"], r["default_config"]
    doc.h(3, f"step-kernel tiling A/B: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(_ab_text(r, "base over defaults", r["rel_l2_defaults_vs_base"], "defaults", eq), "")
    fb, fd = ((r.get(side) or {}).get("config") for side in ("base_launch", "default_launch"))  # as resolved
    rows = [[k, step_config_value(k, base.get(k), fb), step_config_value(k, v, fd)] for k, v in new.items()
            if base.get(k) != v]
    if r.get("identity_mod"):  # step_config_ab.py --identity-mod: pi0 through pi0.5's modulated kernel path
        rows.append(["modulation table (pi0)", "none", "identity (pi0.5's modulated path)"])
    doc.table(["field", "base", "defaults"], rows)
    _ab_medians(doc, r)


def stream_probe_best(r: dict) -> list[dict]:
    """tma_probe.py files: the fastest correct run (rel L2 < 1e-3) per (task shape, mode)."""
    best: dict = {}
    for c in r["configs"]:
        key = (c["shape"], c["mode"])
        if "us" in c and c["rel_l2"] < 1e-3 and (key not in best or c["us"] < best[key]["us"]):
            best[key] = c
    return list(best.values())


def _prefix_tiles_ab(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/prefix_tiles_ab.py: the prefix attention kernel's tiles, a kernel sweep then
    the fastest against today's inside the whole `best` call, interleaved in one process."""
    eq = r.get("equivalence_pick") or {}
    today, pick = r["today_tiles"], r["pick_tiles"]
    doc.h(3, f"prefix attention tiles A/B: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    ok = sorted((x for x in r["kernel_sweep"] if "us" in x and x["rel_l2"] < 1e-2), key=lambda x: x["us"])
    doc.p(f"kernel sweep: {len(ok)} of {len(r['kernel_sweep'])} tilings correct; then the whole call: "
          + _ab_text(r, "today over pick", None, "pick", eq), "")
    doc.table(["tiling", "kernel us", "rel L2"],
              [[" ".join(f"{k}={x[k]}" for k in today), x["us"], x["rel_l2"]] for x in ok[:5]])
    doc.table(["field", "today", "pick"], [[k, today.get(k), v] for k, v in pick.items() if today.get(k) != v])
    _ab_medians(doc, r)


def _change_ab(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/change_ab.py (session 8's first file says "prefix-ab"): `best` (or the file's
    levers) with one engine change undone for engine A's capture against the same with it."""
    eq = r.get("equivalence_with") or {}
    doc.h(3, f"change A/B: {r['change']}: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(_ab_text(r, "without over with", r["rel_l2_with_vs_without"], "with the change", eq), "")
    _ab_medians(doc, r)
    flat = {}
    for key, probe in (r.get("probe") or {}).items():
        if isinstance(probe, dict):  # per dtype (siglip_gelu_epilogue): errors against the two GELUs; lt_fc2: algorithms
            doc.p(f"probe ({key}): " + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in probe.items()), "note")
        else:  # plain facts the change's probe recorded (inductor_pdl: kernels that wait; kernel_pdl: PDL on)
            flat[key] = probe
    if flat:
        doc.p("probe: " + ", ".join(f"{k} {v}" for k, v in flat.items()), "note")


def prompt_len_probe_header(r: dict) -> list[str]:
    return ["kept prompt", "prefix rows", "median ms", f"vs {r['ratio_to']}", "rel L2", "passed"]


def prompt_len_probe_rows(r: dict) -> list[list]:
    """benchmarks/prompt_len_probe.py's file: a row per kept prompt length (the report and docs/performance.md)."""
    eq = r.get("equivalence") or {}
    return [[name.removeprefix("prompt_"), r["prefix_rows"].get(name), f"{ms:.3f}", f"{r['speedup_vs_base'][name]:.4f}x",
             f"{eq[name]['rel_l2']:.1e}" if name in eq else "-", "yes" if (eq.get(name) or {}).get("passed") else "no"]
            for name, ms in r["median_ms"].items()]


def _prompt_len_probe(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/prompt_len_probe.py: one engine, one observation, its kept prompt padded to several lengths,
    interleaved: what the prefix's row count costs the call."""
    doc.h(3, f"kept prompt lengths: {workload_label(r)}, {short_variant(r['variant']['label'])} on {gpu_name(r)}")
    doc.p(f"{r['valid_prompt_tokens']} valid prompt tokens; {r['rounds']} interleaved rounds; speed-up: "
          f"{r['ratio_to']}'s median over the length's (per round)", "")
    doc.table(prompt_len_probe_header(r), prompt_len_probe_rows(r))


def _upload_probe(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/upload_probe.py: the policy path's host <-> device pieces, each timed alone."""
    doc.h(3, f"policy transfers: {workload_label(r)} on {gpu_name(r)}")
    doc.p(f"{r['rounds']} rounds each, the GPU idle before each piece; {r['staging_bytes']} bytes staged a call", "")
    doc.table(["piece", "median ms"], [[k.replace("_", " "), v] for k, v in r["median_ms"].items()])
    if r.get("hugepage_staging"):
        doc.p(f"the staging buffer in 2 MB pages: {r['hugepage_staging']}", "")


def _served_path(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/served_path_probe.py: the policy path phase by phase, and the websocket front
    end around the real policy, a stand-in that sleeps as long, and one that returns at once."""
    pol, fe = r["policy"], r["front_end"]
    doc.h(3, f"served path: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(f"{r['rounds']} rounds: the policy call {pol['infer_ms']:.3f} ms against the model call "
          f"{pol['model_ms']:.3f} ms (+{pol['infer_ms'] - pol['model_ms']:.3f}); each phase below synced on its own", "")
    doc.table(["policy phase", "median ms"], [[k, v] for k, v in pol["phases_ms"].items()])
    doc.table(["front end around", "round trip ms", "server infer ms", "front end ms"] + [h for _, h in FRONT_END_SPLIT],
              [[k.replace("_", " "), v["round_trip_ms"], v["server_infer_ms"], v["front_end_ms"]]
               + [v.get(key) for key, _ in FRONT_END_SPLIT] for k, v in fe.items()])


# served_path_probe.py's split of a front end (files from session 22 on; earlier ones leave the columns empty)
FRONT_END_SPLIT = (("client_side_ms", "client side ms"), ("server_queue_ms", "worker wake-up ms"),
                   ("server_decode_ms", "decode ms"), ("server_rest_ms", "server rest ms"))


def _launch_probe(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/launch_probe.py: the host latency a replayed call exposes (its GPU span with
    the GPU idle at the start against queued behind a sleep kernel), its pieces, and graphs of
    N one-element kernels."""
    doc.h(3, f"launch latency: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(f"{r['rounds']} rounds each; 'exposed' is the GPU span with the GPU idle at the start less the span "
          "queued behind a 2 ms sleep kernel (the host's latency the GPU waits for)", "")
    doc.table(["what", "GPU span, idle start ms", "GPU span, host hidden ms", "exposed ms", "host until return ms",
               "wall, synced ms"], [[name] + launch_probe_row(v) for name, v in launch_probe_rows(r)])
    for name, census in launch_probe_graphs(r):
        doc.p(f"{name}: {census}", "")


def launch_probe_rows(r: dict) -> list[tuple[str, dict]]:
    """(what, its exposure record) for every timed thing of a launch-probe file, in order."""
    def timed_items(prefix: str, d: dict):
        for k, v in d.items():
            if isinstance(v, dict) and "gpu_span_idle_start_ms" in v:
                yield prefix + k.replace("_", " "), v
            elif isinstance(v, dict) and k != "graph":
                yield from timed_items(prefix + k.replace("_", " ") + ": ", v)

    return ([("call (sample_actions)", r["call"])] + list(timed_items("", r.get("pieces") or {}))
            + [(f"graph of {n} one-element kernels", v) for n, v in r["synthetic_graphs"].items()]
            + [(f"graph of 600: {k.replace('_', ' ')}", v) for k, v in (r.get("graph_kinds") or {}).items()])


def launch_probe_graphs(r: dict) -> list[tuple[str, dict]]:
    """The node censuses of a launch-probe file: (whose graph, census)."""
    pieces = r.get("pieces") or {}
    out = [("the engine's graph", pieces["graph"])] if pieces.get("graph") else []
    other = pieces.get("without_inductor_pdl") or {}
    out += [("without inductor's PDL", other["graph"])] if other.get("graph") else []
    out += [(f"a graph of {n} one-element kernels", c) for n, c in (r.get("synthetic_census") or {}).items()
            if c and n == "600"]
    return out + [(f"a graph of 600: {k.replace('_', ' ')}", c) for k, c in (r.get("graph_kinds_census") or {}).items() if c]


def launch_probe_row(v: dict) -> list:
    return [v["gpu_span_idle_start_ms"], v["gpu_span_host_hidden_ms"], v["exposed_host_ms"], v["host_return_ms"],
            v["wall_synced_ms"]]


def _graph_context_probe(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/graph_context_probe.py: graph engines timed before and after the matrix's eager and compiled rows."""
    doc.h(3, f"graph in the matrix's context: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(f"{r['iters']} calls after {r['warmup']} warm-up at each point; g1 captured before anything else ran, g2 after "
          f"the {len(r['eager_rows'])} eager rows, g3 after the {len(r['compiled_rows'])} compiled rows. switches: "
          "the process-wide settings that differ from the first point's", "")
    doc.table(["point", "engine", "wall median ms", "event median ms", "first call s", "switches changed"],
              graph_context_rows(r))
    for pair, rows in (r.get("kernel_diff") or {}).items():
        if rows:
            doc.p(f"kernels, {pair}: per call, the largest differences first", "")
            doc.table(["kernel", "us before", "us after", "count before", "count after"],
                      [[clip(k["name"], 90), k["us_a"], k["us_b"], k["count_a"], k["count_b"]] for k in rows])


def graph_context_rows(r: dict) -> list[list]:
    """A graph-context-probe file's points in order: [point, engine, wall median, event median, first call s,
    the switches that differ from the first point's]."""
    phases = r["phases"]
    first = phases[0].get("switches") or {}
    rows = []
    for ph in phases:
        changed = ", ".join(f"{k}={v}" for k, v in (ph.get("switches") or {}).items() if first.get(k) != v) or "-"
        timers = ph.get("timers") or {}
        wall, events = timers.get("wall_ms") or {}, timers.get("cuda_event_ms") or {}
        engine = ph.get("engine") or ("prepared: " + "; ".join(short_variant(s) for s in ph.get("prepared", [])))
        rows.append([ph["phase"], engine, wall.get("median"), events.get("median"), ph.get("first_call_s"), changed])
    return rows


def _call_overhead(doc: Doc, path: str, r: dict) -> None:
    """benchmarks/call_overhead.py: a graphed call against its replay alone and its pieces."""
    m = r["median_ms"]
    doc.h(3, f"call overhead: {workload_label(r)}, {r['variant']['label']} on {gpu_name(r)}")
    doc.p(f"{r['rounds']} interleaved rounds, each piece synced and timed on the host clock; the call costs "
          f"{m['call'] - m['replay']:.3f} ms more than its graph replay alone ({r['input_bytes'] / 1e6:.2f} MB of inputs)", "")
    doc.table(["piece", "median ms"], [[k, v] for k, v in m.items()])
    contexts = r.get("contexts_host_us")
    if contexts:  # from session 71: the contexts every engine call enters, each timed in a host loop
        doc.p("the contexts every engine call enters, each entered and left in a host loop (median us a call)", "")
        doc.table(["context", "host us"], [[k, v] for k, v in contexts.items()])


def gemm_probe_rows(r: dict) -> list[list]:
    """benchmarks/gemm_probe.py rows: shape, M x K x N, then cuBLAS and inductor's max-autotune
    choice (us and TFLOP/s, or the error a side ended with)."""
    rows = []
    for row in r["rows"]:
        sides = []
        for side in ("cublas", "max_autotune"):
            got = row.get(side) or {}
            sides += [got["us"], got["tflops"]] if "us" in got else [got.get("error", "-")[:60], "-"]
        rows.append([row["name"], f"{row['M']} x {row['K']} x {row['N']}"] + sides)
    return rows


def _gemm_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"GEMM shapes of the prefix on {gpu_name(r)}")
    doc.p("each shape alone in CUDA-graph replays: cuBLAS as the engine calls it against inductor's max-autotune "
          "choice (its Triton templates and cuBLAS, timed when it compiles)", "")
    doc.table(["shape", "M x K x N", "cuBLAS us", "TFLOP/s", "max-autotune us", "TFLOP/s"], gemm_probe_rows(r))


def fp8_gemm_probe_rows(r: dict) -> list[list]:
    """benchmarks/fp8_gemm_probe.py rows: shape, M x K x N, bf16 us, float8 us, the activations' quantization us,
    float8's speedup without and with that quantization, and each side's rel L2 against float64."""
    return [[row["name"], f"{row['M']} x {row['K']} x {row['N']}", row["bf16"]["us"], row["fp8"]["us"], row["quant_us"],
             row["speedup_fp8"], row["speedup_fp8_with_quant"], row["bf16"]["rel_l2"], row["fp8"]["rel_l2"]]
            for row in r["rows"]]


FP8_GEMM_PROBE_HEADER = ["shape", "M x K x N", "bf16 us", "float8 us", "quantize us", "speedup", "speedup with quantize",
                         "bf16 rel L2", "float8 rel L2"]


def _fp8_gemm_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"GEMM shapes of libero-pi0 in float8 on {gpu_name(r)}")
    doc.p("each shape in CUDA-graph replays over weight copies larger than L2: bf16 F.linear (what the engine runs) "
          "against torch._scaled_mm with e4m3 operands and row-wise scales; the activations' row-wise quantization "
          "timed apart; errors against float64", "")
    doc.table(FP8_GEMM_PROBE_HEADER, [[f"{c:.1e}" if isinstance(c, float) and c < 0.1 else c for c in row]
                                      for row in fp8_gemm_probe_rows(r)])


def cublaslt_probe_rows(r: dict) -> list[list]:
    """benchmarks/cublaslt_probe.py rows: shape, M x K x N, what best runs (us before and after the algorithms,
    TFLOP/s), algorithms offered / correct and timed, the fastest (us, TFLOP/s, its heuristic rank, tile id,
    split-K, cluster shape id) and its speedup over the faster baseline timing."""
    rows = []
    for row in r["rows"]:
        b, algos = row.get("best") or {}, row.get("algos") or []
        rows.append([row["name"], f"{row['M']} x {row['K']} x {row['N']}", " / ".join(f"{u:.2f}" for u in row["baseline_us"]),
                     row["baseline_tflops"], f"{len(algos)} / {sum('us' in a for a in algos)}", b.get("us", "-"),
                     b.get("tflops", "-"), b.get("rank", "-"), b.get("tile", "-"), b.get("splitk", "-"),
                     b.get("cluster_shape", "-"), row.get("best_vs_baseline") or "-"])
    return rows


CUBLASLT_PROBE_HEADER = ["shape", "M x K x N", "best runs: us (before / after)", "TFLOP/s", "algorithms offered / timed",
                         "fastest us", "TFLOP/s", "heuristic rank", "tile id", "split-K", "cluster id", "speedup"]


def _cublaslt_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"GEMM shapes of the prefix through cuBLASLt's algorithms on {gpu_name(r)}")
    doc.p("each shape in CUDA-graph replays over weight copies larger than L2: what the engine runs (F.linear or the "
          "GELU epilogue), timed before and after every algorithm cuBLASLt's heuristic offers (each checked against "
          "it first)", "")
    doc.table(CUBLASLT_PROBE_HEADER, cublaslt_probe_rows(r))


def memset_probe_rows(r: dict) -> list[list]:
    """benchmarks/memset_probe.py rows: chain, formulation, us a link of the chain, speedup over the chain's
    first formulation (median of the interleaved rounds' ratios), memset nodes in its graph, rel L2 against
    float32 (or the error that formulation raised)."""
    rows = []
    for chain, variants in r["chains"].items():
        for name, v in variants.items():
            if "error" in v:
                rows.append([chain, name, v["error"][:60], "-", "-", "-"])
                continue
            speedup = next((val for key, val in v.items() if key.startswith("speedup_vs_")), "-")
            rows.append([chain, name, v["per_link_us"], speedup, v["memsets"], f"{v['rel_l2_vs_fp32']:.1e}"])
    return rows


def _memset_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"Memset nodes and attention formulations in graph chains on {gpu_name(r)} ({r['variant']['label']})")
    doc.p("chains of 17-27 links shaped like the call (a norm, the op, the next GEMM) in one CUDA graph, each "
          "formulation replayed in turn over the rounds; memsets counted by torch.profiler over one replay", "")
    doc.table(["chain", "formulation", "us a link", "speedup", "memsets", "rel L2"], memset_probe_rows(r))


def geglu_bench_rows(r: dict) -> list[list]:
    """benchmarks/geglu_matmul_bench.py (session 10, kernel since taken out) rows: M, the tiling
    (or cuBLAS + inductor, what `best` runs), us, TFLOP/s, rel L2 against float32, speedup."""
    rows = []
    for row in r["rows"]:
        base = row["inductor_cublas"]
        rows.append([row["M"], "cuBLAS gate_up + inductor GELU x up", base["us"], base["tflops"], base["rel_l2"], 1.0])
        for c in row["configs"]:
            label = " ".join(str(v) for v in c["config"])
            rows.append([row["M"], label, c["us"], c["tflops"], c["rel_l2"], c["speedup"]] if "us" in c
                        else [row["M"], label, c.get("error", "-")[:60], "-", "-", "-"])
    return rows


def splitk_probe_rows(r: dict) -> list[list]:
    """benchmarks/splitk_probe.py rows: shape, M x K x N, formulation, us, TFLOP/s, rel L2."""
    rows = []
    for row in r["rows"]:
        for label, v in row["variants"].items():
            rows.append([row["name"], f"{row['M']} x {row['K']} x {row['N']}", label] +
                        ([v["us"], v["tflops"], v["rel_l2"]] if "us" in v else [v.get("error", "-")[:60], "-", "-"]))
    return rows


FIRST_CALL_HEADER = ["file", "workload", "variant", "cache", "first call s", "torch.compile s", "of it inductor s",
                     "Triton in process s", "slowest Triton kernel", "engine init s", "later median ms", "commit",
                     "inductor warm-up", "compile threads", "compile workers"]


def first_call_rows(results: list[tuple[str, dict]]) -> list[list]:
    """benchmarks/first_call.py files: the first call of a fresh process and what it spent compiling
    (torch's timers: Dynamo's whole compile and inductor's part of it; the Triton kernels compiled
    in the process itself, i.e. ours), with cold (empty) or warm compile caches."""
    rows = []
    for path, r in results:
        phases, triton = r.get("compile_phases") or {}, r.get("triton_compiles") or []
        before = r.get("cache_files_before")
        cache = "-" if before is None else "cold" if before == 0 else f"warm ({before} files)"
        slowest = f"{triton[0]['kernel']} {triton[0]['s']:.2f} s" if triton else "-"
        rows.append([Path(path).name, workload_label(r), short_variant(r["variant"]["label"]), cache, r["first_call_s"],
                     phases.get("_compile.compile_inner", 0.0), phases.get("compile_fx_inner", 0.0),
                     r.get("triton_compile_s", 0.0), slowest, r.get("engine_init_s"), r.get("later_median_ms"),
                     ((r.get("env") or {}).get("git_commit") or "-")[:7],
                     {True: "yes", False: "no"}.get(r.get("inductor_warmup"), "-"), r.get("compile_threads") or "-",
                     "-" if "compile_workers" not in r else "engine's" if r["compile_workers"] is None else r["compile_workers"]])
    return rows


def prefix_attention_probe_rows(r: dict) -> list[list]:
    """benchmarks/prefix_attention_probe.py rows: kernel, us, rel L2 against float32 (or its error)."""
    return [[row["name"], round(row["us"], 2), f"{row['rel_l2_vs_fp32']:.1e}"] if "us" in row
            else [row["name"], row.get("error", "-")[:90], "-"] for row in r["rows"]]


def _first_call(doc: Doc, items: list[tuple[str, dict]]) -> None:
    doc.p("a fresh process each: the first call (compiles and the CUDA-graph capture included), torch.compile's "
          "own timers (Dynamo's whole compile, inductor's part of it), the Triton kernels compiled in the process "
          "(the engine's; inductor compiles its own in worker processes; with the engine's kernel-compile thread, "
          "mostly beside torch.compile, so not all of it adds to the first call), and the calls after", "")
    doc.table(FIRST_CALL_HEADER, first_call_rows(items))


def _geglu_bench(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"Gemma gate_up with GELU x up on {gpu_name(r)}")
    doc.p("the prefix's MLP input as one Triton GEMM with the GEGLU in its epilogue (tiling: kind, BM, BN, BK, "
          "GROUP_M, warps, stages) against cuBLAS's GEMM and inductor's GELU x up kernel, CUDA-graph replays", "")
    doc.table(["M", "tiling", "us", "TFLOP/s", "rel L2", "speedup"], geglu_bench_rows(r))


def _prefix_attention_probe(doc: Doc, path: str, r: dict) -> None:
    o = r["workload"]["overrides"]
    doc.h(3, f"{Path(path).name} on {gpu_name(r)}")
    doc.p(f"the Gemma prefix's attention, {o['tokens']} tokens of which {o['valid_keys']} valid keys, {o['heads']} query "
          f"heads over one K/V head of {o['head_dim']}: PyTorch's fused kernels given the valid key count against the "
          "engine's kernel (the exact mask), CUDA-graph replays; rel L2 over the valid query rows against float32", "")
    doc.table(["kernel", "us", "rel L2"], prefix_attention_probe_rows(r))


def prefix_splits_probe_rows(r: dict) -> list[list]:
    """benchmarks/prefix_splits_probe.py rows: batch x prefix rows (row blocks), us at each key split count, the
    fastest count, the count the engine picks and the fixed 3 of before session 36, each as a multiple of the
    fastest's time. Keys are strings in a JSON file, ints in memory."""
    rows = []
    for row in r["rows"]:
        us = {int(s): u for s, u in row["us"].items()}
        fastest = min(us, key=us.get)

        def of_fastest(s):
            return f"s{s} ({us[s] / us[fastest]:.3f}x)" if s in us else f"s{s} (-)"
        rows.append([f"{row['batch']} x {row['rows']} ({row['blocks']})",
                     *[us.get(s, "-") for s in range(1, 7)], f"s{fastest}", of_fastest(int(row["model_pick"])),
                     of_fastest(int(row["today"]))])
    return rows


PREFIX_SPLITS_PROBE_HEADER = ["batch x rows (blocks)", "1 split us", "2", "3", "4", "5", "6", "fastest",
                              "prefix_splits (x fastest)", "fixed 3 (x fastest)"]


def _prefix_splits_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"{Path(path).name} on {gpu_name(r)}")
    doc.p("the prefix attention kernel alone (partials and merge), 8 query heads over one K/V head of 256, its keys in "
          "1-6 splits at the row counts the prompt buckets make, CUDA-graph replays; the engine's pick "
          "(suffix_attention.prefix_splits) and the fixed 3 splits of before session 36 against the fastest. Files "
          "written before prefix_splits existed hold a wave model's pick in its column", "")
    doc.table(PREFIX_SPLITS_PROBE_HEADER, prefix_splits_probe_rows(r))


WAM_ATTENTION_BACKENDS = ("cudnn", "flash", "efficient")


def wam_attention_probe_rows(r: dict) -> list[list]:
    """benchmarks/wam_attention_probe.py rows: the call, q x k tokens, each SDPA backend's us (or its error)."""
    return [[row["shape"], f"{row['q_tokens']} x {row['k_tokens']}"]
            + [row[b]["us"] if "us" in row.get(b, {}) else row.get(b, {}).get("error", "-")[:60]
               for b in WAM_ATTENTION_BACKENDS] for row in r["rows"]]


def _wam_attention_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"{Path(path).name} on {gpu_name(r)}")
    doc.p("the world-action model's attention calls of one generate call (batch "
          f"{r['workload']['overrides'].get('batch', 1)}, 12 heads of 128) under each SDPA backend: 20 calls in one "
          "CUDA graph, the median replay over 20", "")
    doc.table(["call", "q x k tokens", *(f"{b} us" for b in WAM_ATTENTION_BACKENDS)], wam_attention_probe_rows(r))


def _splitk_probe(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"Prefix GEMMs as other cuBLAS calls on {gpu_name(r)}")
    doc.p("F.linear (what the engine runs) against M and N swapped and K split into a batched GEMM whose "
          "partials a compiled kernel sums, CUDA-graph replays", "")
    doc.table(["shape", "M x K x N", "formulation", "us", "TFLOP/s", "rel L2"], splitk_probe_rows(r))


BETWEEN_STEPS_HEADER = ["tiling (BN BK warps stages)", "us", "rel L2 x_t", "rel L2 tokens"]


def between_steps_rows(r: dict, top: int = 5) -> list[list]:
    """benchmarks/between_steps_bench.py (session 11; the kernel, kernels/denoise_loop.py, was taken
    out again and is at 38a4931): the fastest correct tilings of the kernel between steps
    (x_t within 1e-3 of float32 torch: the normalized rows are rounded to bf16 on both sides, and an
    ulp flips where rsqrt and 1/sqrt differ; the tokens within 1e-2: they are rounded to bf16)."""
    ok = sorted((x for x in r["rows"] if "us" in x and x["rel_l2_xt"] < 1e-3 and x["rel_l2_tokens"] < 1e-2
                 and x["state_row_ok"]), key=lambda x: x["us"])
    return [[" ".join(map(str, x["config"])), x["us"], x["rel_l2_xt"], x["rel_l2_tokens"]] for x in ok[:top]]


SPLIT_SWEEP_HEADER = ["splits asked", "splits run", "us", "vs the default's pick", "rel L2"]


def split_sweep_rows(r: dict) -> list[list]:
    """A --splits-only sweep's rows: each count asked (None: the kernel's own pick, named so), the count the kernel
    ran (whole key tiles a split round some counts down), its time and its time over the default pick's; a row the
    compiler rejected keeps its error in the time's place."""
    default = next((x for x in r["configs"] if x["splits"] is None and "ms" in x), None)
    rows = []
    for x in r["configs"]:
        asked = "default pick" if x["splits"] is None else x["splits"]
        if "ms" not in x:
            rows.append([asked, None, x.get("error", "no time"), None, None])
            continue
        ratio = f"{x['ms'] / default['ms']:.2f}x" if default else None
        rows.append([asked, x.get("effective_splits"), x["ms"] * 1e3, ratio, x["rel_l2"]])
    return rows


def _kernel_bench(doc: Doc, path: str, r: dict) -> None:
    doc.h(3, f"kernel bench: {r['variant']['label']} on {gpu_name(r)}")
    if r.get("kernel") == "between_steps":
        doc.p(f"{len(r['rows'])} tilings, back-to-back launches; the fastest correct:", "")
        doc.table(BETWEEN_STEPS_HEADER, between_steps_rows(r))
    elif "cases" in r:
        doc.table(["case", "weight MB", "cuBLAS (+ eager elementwise) us", "kernel us", "kernel TB/s", "rel L2", "tiling",
                   "tilings tried", "wrong (rel L2 >= the case's tolerance: 1e-2 bf16, 1e-5 float32)"],
                  [[row["case"], row["weight_bytes"] / 1e6, row["cublas_ms"] * 1e3, (row["best"] or {}).get("ms", float("nan")) * 1e3,
                    (row["best"] or {}).get("tb_s"), (row["best"] or {}).get("rel_l2"),
                    "bn={block_n} bk={block_k} split={split_k}".format(**row["best"]) + f" {row['best'].get('precision', '')}"
                    if row["best"] else None,
                    len(row["configs"]), sum(1 for x in row["configs"] if "ms" in x and x["rel_l2"] >= row.get("tolerance", 1e-2))]
                   for row in r["cases"]])
    elif "phases" in r:  # the step kernel (megakernel): tilings, then the time of each phase
        ok = sorted((x for x in r["configs"] if "us" in x and x["rel_l2_vs_fp32"] < 2e-2), key=lambda x: x["us"])
        c = r["checks"]
        repeats = (f"; {c['repeat_launches_differing']} of {c['repeat_launches']} repeated launches differ"
                   if "repeat_launches" in c else "")
        doc.p(f"{len(ok)} of {len(r['configs'])} tilings within 2e-2 of float32; persistent launch equals per-phase "
              f"launches bit for bit: {c['persistent_equals_multi_launch_bitwise']}{repeats}; barrier timeouts: "
              f"{c['barrier_timeouts']}", "")
        o = r["workload"]["overrides"]
        if o.get("modulation_tables"):
            doc.p(f"{workload_label(r)}: the timed launches cycled through {o['modulation_tables']} modulation table(s)", "")
        if o.get("from_engine"):
            doc.p(f"{workload_label(r)}: timed on the arguments its engine call launched ({o['from_engine']}); rel L2 "
                  "against the default configuration's output on them", "")
        first = r["configs"][0]["config"] if r["configs"] else {}
        doc.table(["tiling (fields that differ from the run's first row)", "us", "weights GB/s", "rel L2"],
                  [[step_config_diff(x["config"], first, x.get("fitted")) or "the run's defaults",
                    x["us"], x["weights_gb_per_s"], x["rel_l2_vs_fp32"]]
                   for x in r["configs"] if "us" in x and x["rel_l2_vs_fp32"] < 2e-2][:8])
        if r["phases"]:
            doc.table(["phase (all layers, with its barriers)", "us"], [[k, v] for k, v in r["phases"].items()])
        timed = [x for x in ok if x.get("timeline")]
        if timed:
            _step_timeline(doc, timed[0])
    elif r["variant"]["label"].startswith("tma_probe"):  # benchmarks/tma_probe.py: the matmul tasks streamed alone
        doc.p("the step kernel's matmul tasks alone (18 layers, no barriers, no epilogues), back-to-back launches; "
              "the fastest run per task shape and load mode (pointers / TMA, or where the weights come from)", "")
        doc.table(["task shape", "loads / weights from", "warps", "stages", "us", "weights TB/s", "KB/us a program", "rel L2"],
                  [[f"{c['shape']} ({c['BN']} x {c['BK']}, {c['KS']} slices)", c["mode"], c["warps"], c["stages"], c["us"],
                    c["weights_tb_per_s"], c["kb_per_us_per_program"], c["rel_l2"]] for c in stream_probe_best(r)])
    elif r.get("splits_only"):  # suffix_attention_bench.py --splits-only: every key split count on the default tiles
        doc.p(f"{workload_label(r)}: the key splits on the default tiles, the kernel's mask as the engine passes it "
              f"({r.get('kernel_mask', 'bool')}); reference path ({r.get('baseline', 'folded matmuls')}): "
              f"{r['folded_ms'] * 1e3:.1f} us", "")
        doc.table(SPLIT_SWEEP_HEADER, split_sweep_rows(r))
    else:
        ok = sorted((x for x in r["configs"] if "ms" in x and x["rel_l2"] < 1e-2), key=lambda x: x["ms"])
        doc.p(f"reference path ({r.get('baseline', 'folded matmuls')}): {r['folded_ms'] * 1e3:.1f} us; {len(ok)} of {len(r['configs'])} tilings "
              "correct; the fastest:", "")
        doc.table(["tiling", "us", "rel L2"],
                  [[" ".join(f"{k}={x[k]}" for k in ("block_m", "block_n", "splits", "num_warps", "num_stages")), x["ms"] * 1e3,
                    x["rel_l2"]] for x in ok[:5]])


def _step_timeline(doc: Doc, row: dict) -> None:
    """Where one step-kernel launch's time went (expert_step_bench.py --timeline): per phase,
    the median slot of a layer split into the median program's work and the rest (waiting
    for the slowest program, the barrier)."""
    t = row["timeline"]
    phases = t["phases"]
    doc.p(f"clock timeline of the fastest tiling with one ({row['us']:.1f} us a step): {t['layers']} layers x "
          f"{t['programs']} programs, {t['total_us']:.1f} us in the instrumented launch, work {100 * t['work_share']:.0f}% "
          "of it; medians over the layers, microseconds", "")
    doc.table(["phase", "slot us", "work median us", "work max us", "start skew us", "barrier release us", "slots, all layers us"],
              [[k, v["slot"], v["work_median"], v["work_max"], v["start_skew"], v["release"], v["slot_total_us"]]
               for k, v in phases.items()])
    if not plots_available():
        return
    fig, axes = new_figure(6.5, 0.8 + 0.35 * len(phases))
    ax = axes[0][0]
    names = list(phases)[::-1]
    work = [phases[n]["work_median"] for n in names]
    rest = [max(phases[n]["slot"] - phases[n]["work_median"], 0.0) for n in names]
    ax.barh(range(len(names)), work, color="#1f77b4", label="median program's work")
    ax.barh(range(len(names)), rest, left=work, color="#bbbbbb", label="waiting: slowest program, barrier")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("us per layer (median over layers)", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    doc.fig(fig, "step kernel timeline per phase")


# command -> the section heading, in report order (after vlaperf's own commands)
SECTIONS = (("kernel-bench", "Kernels (kernel-bench)"),
            ("heads-ab", "The step's float32 heads, A/B (heads-ab)"),
            ("step-config-ab", "The step kernel's tiling, A/B in the whole call (step-config-ab)"),
            ("prefix-tiles-ab", "The prefix attention kernel's tiles, A/B in the whole call (prefix-tiles-ab)"),
            ("change-ab", "Engine changes, A/B in the whole call (change-ab)"),
            ("call-overhead", "What a graphed call costs besides its replay (call-overhead)"),
            ("gemm-probe", "GEMM shapes alone: cuBLAS against max-autotune (gemm-probe)"),
            ("cublaslt-probe", "GEMM shapes alone: every algorithm of cuBLASLt's heuristic (cublaslt-probe)"),
            ("fp8-gemm-probe", "GEMM shapes alone: float8 against bf16 (fp8-gemm-probe)"),
            ("splitk-probe", "Prefix GEMMs as other cuBLAS calls (splitk-probe)"),
            ("prefix-attention-probe", "The prefix attention by PyTorch's fused kernels (prefix-attention-probe)"),
            ("prefix-splits-probe", "The prefix attention's key splits against its row count (prefix-splits-probe)"),
            ("wam-attention-probe", "The world-action model's attention calls by SDPA backend (wam-attention-probe)"),
            ("geglu-bench", "Gemma gate_up with GELU x up in one GEMM (geglu-bench)"),
            ("memset-probe", "The prefix's memset nodes and attention formulations (memset-probe)"),
            ("first-call", "The first call of a fresh process (first-call)"),
            ("served-path-probe", "Where a served call's time goes beyond the model call (served-path-probe)"),
            ("upload-probe", "The policy path's transfers, piece by piece (upload-probe)"),
            ("prompt-len-probe", "What the kept prompt's length costs the call (prompt-len-probe)"),
            ("launch-probe", "The host latency a replayed call exposes (launch-probe)"),
            ("graph-context-probe", "The graph row in the matrix's context (graph-context-probe)"))

# one section over all their files: renderer(doc, [(path, result), ...])
GROUP_RENDERERS = {"first-call": _first_call}
# a section per file: renderer(doc, path, result)
FILE_RENDERERS = {"kernel-bench": _kernel_bench, "heads-ab": _heads_ab, "step-config-ab": _step_config_ab,
                  "prefix-tiles-ab": _prefix_tiles_ab, "change-ab": _change_ab, "call-overhead": _call_overhead,
                  "gemm-probe": _gemm_probe, "cublaslt-probe": _cublaslt_probe, "fp8-gemm-probe": _fp8_gemm_probe,
                  "splitk-probe": _splitk_probe, "prefix-attention-probe": _prefix_attention_probe,
                  "prefix-splits-probe": _prefix_splits_probe, "wam-attention-probe": _wam_attention_probe,
                  "geglu-bench": _geglu_bench, "memset-probe": _memset_probe, "served-path-probe": _served_path,
                  "upload-probe": _upload_probe, "launch-probe": _launch_probe, "prompt-len-probe": _prompt_len_probe,
                  "graph-context-probe": _graph_context_probe}
