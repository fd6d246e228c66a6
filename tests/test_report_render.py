"""vlaperf.report.render: HTML and markdown reports from the committed H200 result files and
from freshly generated tiny results (breakdown, scaling, syncs, doctor, bench, matrix)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import torch

from vlaperf.report.document import cell
from vlaperf.report.render import load_results, render

H200 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200"
PNG = b"\x89PNG\r\n\x1a\n"


def _images(html_text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html_text)]


@pytest.fixture(scope="module")
def h200_files():
    files = sorted(H200.glob("*.json"))
    if not files:
        pytest.skip("no H200 result files in benchmarks/results/h200")
    return files


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """Fresh result files of every kind the profiler and the bench/matrix commands write."""
    from vlaperf.cli import main as profile_main

    d = tmp_path_factory.mktemp("tiny_results")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    common = ["--workload", "tiny", "--device", "cpu", "--no-progress"]
    try:
        assert profile_main(["breakdown", *common, "--warmup", "1", "--iters", "4", "--json", str(d / "bd.json")]) == 0
        assert profile_main(["breakdown", *common, "--levers", "best", "--mode", "policy", "--warmup", "1",
                             "--iters", "3", "--json", str(d / "bd_best.json")]) == 0
        assert profile_main(["scaling", *common, "--steps", "1,2,4", "--levers", "reference;for_loop", "--warmup", "1",
                             "--iters", "2", "--json", str(d / "sc.json")]) == 0
        assert profile_main(["syncs", *common, "--json", str(d / "sy.json")]) == 0
        profile_main(["doctor", *common, "--no-measure", "--json", str(d / "doc.json")])
        from vlaperf import cli

        assert cli.main(["bench", *common, "--warmup", "1", "--iters", "5", "--json", str(d / "bench.json")]) == 0
        assert cli.main(["matrix", *common, "--variants", "for_loop;best", "--warmup", "1", "--iters", "3",
                         "--json", str(d / "matrix.json")]) == 0
    finally:
        torch.set_num_threads(n)
    return d


def test_html_from_h200_results(h200_files, tmp_path):
    out = render(h200_files, tmp_path / "report.html")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for heading in ("Latency (bench)", "Optimization matrix", "Equivalence (check)", "Environment"):
        assert heading in text
    assert "NVIDIA H200" in text and "speedup" in text
    images = _images(text)
    # per bench group: histograms + CDF; per matrix: heatmap + CDF
    n_matrix = sum(1 for f in h200_files if json.loads(f.read_text())["command"] == "matrix")
    assert len(images) >= 2 + 2 * n_matrix
    assert all(img.startswith(PNG) for img in images)
    assert "matrix files hold no raw samples" in text or n_matrix == 0
    assert "http://" not in text and "<script" not in text  # readable offline, no server


@pytest.fixture(scope="module")
def h200_markdown(h200_files, tmp_path_factory):
    """One markdown report of every committed GPU result (h200 and h200x2): rendering ~400 files
    with their figures takes ~40 s on the CI machine, so the tests below share it."""
    dirs = [d for d in (H200, H200.parent / "h200x2") if d.is_dir()]
    out = render(dirs, tmp_path_factory.mktemp("h200_markdown") / "report.md")
    return dirs, out


def test_markdown_from_h200_results(h200_markdown):
    _, out = h200_markdown
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\((report_files/[^)]+\.png)\)", text)
    assert links
    for link in links:
        assert (out.parent / link).read_bytes().startswith(PNG)
    assert "| file | variant [mode] | timer | median ms" in text
    assert "## Environment" in text
    # the environment in narrow tables (a column per distinct environment made 281 of them)
    env = text[text.index("## Environment"):]
    assert max(line.count(" | ") + 1 for line in env.splitlines() if line.startswith("| ")) <= 4
    assert "could not render" not in text and "skipped" not in text
    # a matrix's peak memory is the process's (every variant's engine held), and its table says so
    assert "process peak GiB |" in text and "every variant's engine held in the one process" in text


def test_reports_from_fresh_tiny_results(tiny_results, tmp_path):
    html_out = render([tiny_results], tmp_path / "tiny.html")
    text = html_out.read_text()
    for heading in ("Stage breakdown", "T(N) scaling", "Host syncs", "Doctor", "Latency (bench)", "Optimization matrix"):
        assert heading in text, heading
    assert "stages sum to" in text and "prefix_prefill" in text
    assert "while time &gt;= -dt / 2" in text  # the sync site, escaped
    assert "T(N)" in text and "slope b ms/step" in text
    assert len(_images(text)) >= 6
    md_out = render([tiny_results], tmp_path / "tiny.md")
    md = md_out.read_text()
    assert "### breakdown: tiny reference (model mode, cpu)" in md
    assert len(list((tmp_path / "tiny_files").glob("*.png"))) >= 6


def test_bench_idle_files_get_a_table_of_their_own(tmp_path):
    """`bench --idle-ms` files: their idle against back to back in a table after the bench rows, spun idles named."""
    from vlaperf import cli

    for name, extra in (("idle", []), ("spun", ["--idle-spin"])):
        assert cli.main(["bench", "--workload", "tiny", "--device", "cpu", "--no-progress", "--warmup", "1", "--iters",
                         "3", "--idle-ms", "5", *extra, "--json", str(tmp_path / f"{name}.json")]) == 0
    md = render([tmp_path], tmp_path / "r.md").read_text()
    assert "Files of `bench --idle-ms`" in md
    # the two times are medians (back_to_back_median, after_idle_median), and the header says so
    assert "| idle ms | back to back median ms | after idle median ms | after idle / back to back |" in md
    for name, idle in (("idle", "5"), ("spun", "5 spinning")):
        w = json.loads((tmp_path / f"{name}.json").read_text())["idle"]["wall_ms"]
        row = next(line for line in md.splitlines() if line.startswith(f"| {name} | reference [model] | {idle} |"))
        assert f"{w['after_idle_over_back_to_back']:.3f}x" in row


def test_invalid_files_are_listed_not_fatal(tiny_results, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else"}))
    results, problems = load_results([tiny_results / "sy.json", bad])
    assert len(results) == 1 and len(problems) == 1 and "bad.json" in problems[0]
    text = render([tiny_results / "sy.json", bad], tmp_path / "r.html").read_text()
    assert "skipped" in text and "bad.json" in text
    with pytest.raises(ValueError):
        render([bad], tmp_path / "r2.html")
    with pytest.raises(ValueError):
        render([tiny_results / "sy.json"], tmp_path / "r.txt")


def test_breakdown_and_scaling_results_follow_the_schema(tiny_results):
    from vlaperf.report.schema import read_result

    for name in ("bd.json", "bd_best.json", "sc.json", "sy.json", "doc.json"):
        r = read_result(tiny_results / name)
        assert r["schema"] == "vlaperf.result/1" and r["workload"]["id"] == "tiny"


def test_serving_peer_and_kernel_results_have_renderers(h200_markdown):
    """loadgen (1 vs N replicas on one plot), compare and kernel-bench files get sections,
    tables and figures, not the 'no renderer' fallback."""
    dirs, out = h200_markdown
    results, _ = load_results(dirs)
    commands = {r["command"] for _, r in results}
    if not {"loadgen", "compare", "kernel-bench"} <= commands:
        pytest.skip("the committed results lack a loadgen, compare or kernel-bench file")
    md = out.read_text()
    assert "has no renderer" not in md and "could not render" not in md
    for heading in ("## Serving under load (loadgen)", "## Side by side with a peer (compare)", "## Kernels (kernel-bench)"):
        assert heading in md, heading
    assert "![server throughput and latency against clients]" in md
    assert "![comparison with the peer]" in md and "| vlaperf variant | max abs | rel L2 |" in md
    if "prompt-len-probe" in commands:  # session 30's probe: its own table, with each length's prefix rows
        assert "| kept prompt | prefix rows | median ms | vs prompt_32 | rel L2 | passed |" in md
        probe = next(r for _, r in results if r["command"] == "prompt-len-probe")
        name = next(iter(probe["median_ms"]))
        assert (f"| {name.removeprefix('prompt_')} | {probe['prefix_rows'][name]} | {probe['median_ms'][name]:.3f} | "
                f"{probe['speedup_vs_base'][name]:.4f}x | {probe['equivalence'][name]['rel_l2']:.1e} |") in md
    if "prefix-splits-probe" in commands:  # session 36: the prefix attention's key splits against its rows
        probe = next(r for _, r in results if r["command"] == "prefix-splits-probe")
        assert "| batch x rows (blocks) | 1 split us | 2 | 3 | 4 | 5 | 6 | fastest |" in md
        row = probe["rows"][0]
        us = {int(k): v for k, v in row["us"].items()}
        fastest = min(us, key=us.get)
        assert (f"| {row['batch']} x {row['rows']} ({row['blocks']}) | {' | '.join(cell(us[s]) for s in range(1, 7))} | "
                f"s{fastest} |") in md
    sweeps = [r for _, r in results if r["command"] == "kernel-bench" and r.get("splits_only")]
    if sweeps:  # session 37: the step attention's key splits at a batch, one row per count asked
        assert "| splits asked | splits run | us | vs the default's pick | rel L2 |" in md
        pick = next(x for x in sweeps[0]["configs"] if x["splits"] is None)
        assert f"| default pick | {pick['effective_splits']} | {cell(pick['ms'] * 1e3)} | 1.00x |" in md
    # the step kernel's clock timeline (expert_step_bench.py --timeline files): a table and a figure
    assert "| phase | slot us | work median us |" in md and "![step kernel timeline per phase]" in md
    assert "cuBLAS (+ eager elementwise) us" in md
    if any(r["command"] == "step-config-ab" for _, r in results):  # the whole call with an older step tiling
        assert "step-kernel tiling A/B" in md and "| field | base | defaults |" in md
    if any(r["command"] == "prefix-tiles-ab" for _, r in results):
        assert "prefix attention tiles A/B" in md and "| field | today | pick |" in md
    if any(r["variant"]["label"].startswith("tma_probe") for _, r in results):
        assert "| task shape | loads / weights from |" in md
    if any(r.get("variant", {}).get("label") == "expert_step" for _, r in results):  # the step kernel's sweep
        assert "| phase (all layers, with its barriers) | us |" in md and "persistent launch equals per-phase" in md
    if any(r["command"] == "gemm-probe" for _, r in results):  # the prefix's GEMM shapes, cuBLAS against max-autotune
        assert "| shape | M x K x N | cuBLAS us | TFLOP/s | max-autotune us | TFLOP/s |" in md
        assert "| gemma_gate_up | 544 x 2048 x 32768 |" in md
    if any(r["command"] == "fp8-gemm-probe" for _, r in results):  # float8 against bf16 on the same shapes
        assert "| shape | M x K x N | bf16 us | float8 us | quantize us | speedup | speedup with quantize |" in md
        assert "| gemma_gate_up | 544 x 2048 x 32768 |" in md and "| expert_down | 51 x 4096 x 1024 |" in md
    if any(r["command"] == "splitk-probe" for _, r in results):  # other cuBLAS formulations of the same GEMMs
        assert "| shape | M x K x N | formulation | us | TFLOP/s | rel L2 |" in md
        assert "| siglip_fc2 | 512 x 4304 x 1152 | split 2 |" in md
    if any(r["command"] == "geglu-bench" for _, r in results):  # the GEGLU GEMM against cuBLAS + inductor
        assert "| 544 | cuBLAS gate_up + inductor GELU x up |" in md and "| 544 | tma 128 128 64 8 8 3 |" in md
    if any(r["command"] == "served-path-probe" for _, r in results):  # the served call's phases and front end
        assert "| policy phase | median ms |" in md and "| upload |" in md
        assert "| front end around | round trip ms | server infer ms | front end ms |" in md and "| instant policy |" in md
    if any(r["command"] == "change-ab" and r.get("change") == "inductor_pdl" for _, r in results):
        assert "probe: inductor_cache" in md and "with_gdc_wait" in md  # a flat probe, not per dtype
    if any(r["command"] == "call-overhead" and r.get("contexts_host_us") for _, r in results):
        assert "| context | host us |" in md and "| engine_device_current |" in md
    if (H200.parent / "h200x2").is_dir():
        assert "Ray Serve, 2 replica(s) on 2 GPU(s)" in md


def test_new_probe_rows_keep_errors_as_findings():
    """A formulation or tiling that failed on the GPU is a row with its error, not a crash."""
    from vlaperf.report.probes import geglu_bench_rows, splitk_probe_rows

    split = {"rows": [{"name": "siglip_o", "M": 512, "K": 1152, "N": 1152,
                       "variants": {"linear": {"us": 5.0, "tflops": 267.0, "rel_l2": 1e-3},
                                    "split 2 fp32": {"error": "RuntimeError: bmm.dtype not available"}}}]}
    assert splitk_probe_rows(split) == [["siglip_o", "512 x 1152 x 1152", "linear", 5.0, 267.0, 1e-3],
                                        ["siglip_o", "512 x 1152 x 1152", "split 2 fp32", "RuntimeError: bmm.dtype not available",
                                         "-", "-"]]
    geglu = {"rows": [{"M": 544, "inductor_cublas": {"us": 117.0, "tflops": 620.0, "rel_l2": 3e-3},
                       "configs": [{"config": ["tma", 128, 256, 64, 8, 8, 3], "error": "OutOfResources: shared memory"},
                                   {"config": ["ptr", 128, 128, 32, 8, 8, 5], "us": 140.0, "tflops": 520.0, "rel_l2": 2e-3,
                                    "speedup": 0.836}]}]}
    rows = geglu_bench_rows(geglu)
    assert rows[0] == [544, "cuBLAS gate_up + inductor GELU x up", 117.0, 620.0, 3e-3, 1.0]
    assert rows[1] == [544, "tma 128 256 64 8 8 3", "OutOfResources: shared memory", "-", "-", "-"]
    assert rows[2] == [544, "ptr 128 128 32 8 8 5", 140.0, 520.0, 2e-3, 0.836]


def test_split_sweep_rows_name_the_count_run_and_the_ratio_to_the_default_pick():
    """suffix_attention_bench.py --splits-only: the kernel's own pick is named, each row says how many splits ran
    (6 asked over 600 keys run as 5) and its time over the pick's; a rejected row keeps its error."""
    from vlaperf.report.probes import SPLIT_SWEEP_HEADER, split_sweep_rows

    cfg = dict(block_m=32, block_n=32, num_warps=4, num_stages=2)
    r = {"configs": [{**cfg, "splits": None, "effective_splits": 2, "ms": 0.030, "rel_l2": 2e-3},
                     {**cfg, "splits": 1, "effective_splits": 1, "ms": 0.045, "rel_l2": 2.2e-3},
                     {**cfg, "splits": 6, "effective_splits": 5, "ms": 0.0305, "rel_l2": 2e-3},
                     {**cfg, "splits": 8, "error": "OutOfResources: shared memory"}]}
    rows = split_sweep_rows(r)
    assert len(SPLIT_SWEEP_HEADER) == len(rows[0])
    assert rows[0][:2] == ["default pick", 2] and rows[0][2] == pytest.approx(30.0) and rows[0][3] == "1.00x"
    assert rows[1][:2] == [1, 1] and rows[1][2] == pytest.approx(45.0) and rows[1][3] == "1.50x"
    assert rows[2][:2] == [6, 5] and rows[2][3] == "1.02x" and rows[2][4] == 2e-3
    assert rows[3] == [8, None, "OutOfResources: shared memory", None, None]


def test_gpu_state_goes_in_the_file_table_not_the_environment(tiny_results, tmp_path):
    """A GPU's clocks and power are the moment's, not the setup's: two runs that differ only in
    them share one environment group, and each file's row shows its own (held clocks named)."""
    bench = json.loads((tiny_results / "bench.json").read_text())
    states = [dict(uuid="GPU-1", pstate="P0", sm_clock_mhz=1980, max_sm_clock_mhz=1980, mem_clock_mhz=3201,
                   power_draw_w=312.4, power_limit_w=700.0, temperature_c=41, clock_event_reasons="0x0000000000000000"),
              dict(uuid="GPU-1", pstate="P0", sm_clock_mhz=1755, max_sm_clock_mhz=1980, mem_clock_mhz=3201,
                   power_draw_w=699.0, power_limit_w=700.0, temperature_c=80, clock_event_reasons="0x0000000000000004")]
    for i, st in enumerate(states):
        bench["env"]["gpu_state"] = st
        (tmp_path / f"b{i}.json").write_text(json.dumps(bench))
    md = render([tmp_path / "b0.json", tmp_path / "b1.json"], tmp_path / "r.md").read_text()
    assert "SM 1980/1980 MHz, 312/700 W, 41 C |" in md
    assert "SM 1755/1980 MHz, 699/700 W, 80 C, held by software power cap" in md
    env_section = md[md.index("## Environment"):]
    assert "gpu_state" not in env_section and "1755" not in env_section


# ----------------------------------------------------------------- damaged files, duplicates


def test_validate_result_names_wrong_types_as_schema_errors(tiny_results):
    """A damaged result raises SchemaError naming the field, never AttributeError/TypeError from
    the checker itself (a top-level array, env null, timers an array, ...)."""
    from vlaperf.report.schema import SchemaError, validate_result

    good = json.loads((tiny_results / "bench.json").read_text())
    cases = [([1, 2, 3], "expected a JSON object, got array"),
             ({**good, "env": None}, "env: expected an object, got null"),
             ({**good, "timers": [1]}, "timers: expected an object or null, got array"),
             ({**good, "timers": {"wall_ms": good["timers"]["wall_ms"], "cuda_event_ms": "x"}},
              "timers.cuda_event_ms: expected a summary object, got string"),
             ({**good, "timers": {"wall_ms": {**good["timers"]["wall_ms"], "median": "fast"}}},
              "timers.wall_ms.median: expected a number, got string"),
             ({**good, "variant": "best"}, "variant: expected an object or null, got string"),
             ({**good, "mode": [1]}, "mode: expected a string or null, got array"),
             ({**good, "workload": {"id": "tiny", "overrides": None}}, "workload.overrides: expected an object"),
             # numbers no timing can be: they rendered as "nanx" and a 301-digit p95
             ({**good, "timers": {"wall_ms": {**good["timers"]["wall_ms"], "median": float("nan")}}},
              "timers.wall_ms.median: expected a finite number >= 0, got nan"),
             ({**good, "timers": {"wall_ms": {**good["timers"]["wall_ms"], "p95": 1e300 * 1e300}}},
              "timers.wall_ms.p95: expected a finite number >= 0, got inf"),
             ({**good, "timers": {"wall_ms": {**good["timers"]["wall_ms"], "min": -5}}},
              "timers.wall_ms.min: expected a finite number >= 0, got -5"),
             ({**good, "first_call_s": "slow"}, "first_call_s: expected a finite number of seconds >= 0 or null, got 'slow'"),
             # env fields the readers print, slice or read keys of (diff's traceback was its exit 1: a "slowdown")
             ({**good, "env": {**good["env"], "gpu": -1}}, "env.gpu: expected a string or null, got number"),
             ({**good, "env": {**good["env"], "gpu_state": "x"}},
              "env.gpu_state: expected an object or null, got string"),
             ({**good, "env": {**good["env"], "env_vars": [1]}}, "env.env_vars: expected an object or null, got array")]
    for result, message in cases:
        with pytest.raises(SchemaError, match=re.escape(message)):
            validate_result(result)
    validate_result(good)


def _damaged(tiny_results, name: str, change) -> dict:
    r = json.loads((tiny_results / name).read_text())
    change(r)
    return r


DAMAGED = {  # file name -> (source file, how it is damaged, what the skipped line says)
    "list.json": (None, None, "expected a JSON object, got array"),
    "env_null.json": ("bench.json", lambda r: r.update(env=None), "env: expected an object, got null"),
    "timers_list.json": ("bench.json", lambda r: r.update(timers=[1]), "timers: expected an object or null"),
    "variant_str.json": ("bench.json", lambda r: r.update(variant="best"), "variant: expected an object or null"),
    "samples_str.json": ("bench.json", lambda r: r["samples"].update(wall_ms=["x", "y"]),
                         "samples.wall_ms must be an array of numbers"),
    "breakdown_null.json": ("bd.json", lambda r: r.update(breakdown=None), "breakdown is null, expected an object"),
    "breakdown_str.json": ("bd.json", lambda r: r.update(breakdown="x"), "breakdown is string, expected an object"),
    "matrix_ints.json": ("matrix.json", lambda r: r.update(variants=[1, 2]), "variants holds number 1, expected objects"),
    "checks_strs.json": ("bench.json", lambda r: r.update(command="check", checks=["a"]),
                         "checks holds string \"a\", expected objects"),
    "loadgen_null.json": ("bench.json", lambda r: r.update(command="loadgen", loadgen=None),
                          "loadgen is null, expected an object"),
    # past the field checks: the renderer's own error, caught per file; a key it indexes and the file lacks is
    # named by its whole path, not Python's bare KeyError of its last part
    "stage_no_median.json": ("bd.json", lambda r: r["breakdown"].update(stages=[{"name": "x"}]),
                             "could not render it: missing field 'breakdown.stages[0].median_ms'"),
    "bench_no_timers.json": ("bench.json", lambda r: r.pop("timers"), "could not render it: missing field 'timers'"),
    "syncs_no_calls.json": ("sy.json", lambda r: r["syncs"].pop("calls"),
                            "could not render it: missing field 'syncs.calls'"),
    # past the field checks in a section drawn over several files: only this one is dropped
    "bench_roofline_str.json": ("bench.json", lambda r: r.update(roofline="x", env={**r["env"], "gpu": "NVIDIA H200"}),
                                "could not render it: AttributeError"),
}


def test_a_scaling_file_with_an_empty_series_says_so_instead_of_being_skipped(tiny_results, tmp_path):
    """An empty scaling.series is a well-formed array (field_problem takes it, as it takes an empty syncs.sites): the
    section says there is no series; it indexed the first series' points and the file was skipped with a bare
    'IndexError: list index out of range'."""
    empty = tmp_path / "sc_empty.json"
    empty.write_text(json.dumps(_damaged(tiny_results, "sc.json", lambda r: r["scaling"].update(series=[]))))
    md = render([empty], tmp_path / "r.md").read_text()
    assert "skipped" not in md and "IndexError" not in md
    said = "no series: scaling.series is empty, so there is no T(N) to show"
    assert f"### scaling: tiny on cpu, model mode\n\n{said}\n" in md
    assert "T(N) fit" not in md  # no figure of no lines


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_file_is_skipped_and_the_rest_renders(tiny_results, tmp_path, name):
    source, change, reason = DAMAGED[name]
    bad = tmp_path / name
    bad.write_text("[1, 2, 3]" if source is None else json.dumps(_damaged(tiny_results, source, change)))
    good = [tiny_results / "bench.json", tiny_results / "sy.json", tiny_results / "bd.json"]
    md = render([*good, bad], tmp_path / "r.md").read_text()
    skipped = [line for line in md.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1 and skipped[0].startswith(f"skipped {bad}: ") and reason in skipped[0], skipped
    assert "from 3 result file(s); 1 skipped" in md
    # the good files: their sections, the bench row, the figures
    for heading in ("## Latency (bench)", "## Host syncs", "## Stage breakdown", "## Environment"):
        assert heading in md, heading
    assert "| bench | reference [model] | wall_ms |" in md
    assert "| bench_roofline_str |" not in md
    assert md.count("![latency histograms") == 1 and "![stage breakdown]" in md
    # the file table numbers only what was rendered
    assert f"| {bad.name} |" not in md and "| 2 | sy.json |" in md and "| 3 | bd.json |" in md


def test_the_same_file_twice_is_counted_once(tiny_results, tmp_path):
    """`vlaperf report dir dir/bench.json`: bench.json once in the table, its samples once."""
    results, problems = load_results([tiny_results, tiny_results / "bench.json", str(tiny_results / "." / "bench.json")])
    paths = [p for p, _ in results]
    assert len(paths) == len(set(paths)) == len(list(tiny_results.glob("*.json"))) and not problems
    md = render([tiny_results / "bench.json", tiny_results, tiny_results / "bench.json"], tmp_path / "r.md").read_text()
    assert md.count("| bench | reference [model] | wall_ms |") == 1
    assert f"from {len(paths)} result file(s)_" in md


def test_files_of_the_same_name_in_two_folders_are_told_apart(tiny_results, tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "bench.json").write_text((tiny_results / "bench.json").read_text())
    md = render([tmp_path / "a", tmp_path / "b"], tmp_path / "r.md").read_text()
    assert "| 1 | a/bench.json | bench |" in md and "| 2 | b/bench.json | bench |" in md
    assert "| a/bench | reference [model] |" in md and "| b/bench | reference [model] |" in md


# ----------------------------------------------------------------- bench figures


@pytest.fixture
def figures(monkeypatch):
    """Every matplotlib figure the report saves, after its layout ran (savefig). The sections are
    drawn in this process (worker processes would not see the stand-in)."""
    from vlaperf.report import render as mod

    monkeypatch.setattr(mod, "PARALLEL_MIN_UNITS", 10**9)
    saved = []
    original = mod.Doc.fig

    def fig(self, f, alt):
        original(self, f, alt)
        saved.append((alt, f))

    monkeypatch.setattr(mod.Doc, "fig", fig)
    return saved


def _bench_copies(tiny_results, tmp_path, n: int) -> list[Path]:
    """n bench files of one variant label (as dozens of committed `best` runs are), medians apart."""
    r = json.loads((tiny_results / "bench.json").read_text())
    files = []
    for i in range(n):
        c = json.loads(json.dumps(r))
        c["samples"]["wall_ms"] = [x * (1 + i / 10) for x in r["samples"]["wall_ms"]]
        c["timers"]["wall_ms"]["median"] *= 1 + i / 10
        files.append(tmp_path / f"bench_run{i:02d}.json")
        files[-1].write_text(json.dumps(c))
    return files


def _renderer(fig):
    """A renderer of `fig` drawn as the report saved it (the layout runs at draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_bench_rows_and_panels_name_their_files_and_titles_do_not_overlap(tiny_results, tmp_path, figures):
    files = _bench_copies(tiny_results, tmp_path, 5)
    md = render(files, tmp_path / "r.md").read_text()
    assert "| file | variant [mode] | timer | median ms |" in md
    for f in files:  # one label, five rows: the file column tells them apart
        assert f"| {f.stem} | reference [model] | wall_ms |" in md
    (alt, fig), = [(a, f) for a, f in figures if a.startswith("latency histograms")]
    renderer = _renderer(fig)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().split("\n")[0] for ax in axes] == [f.stem for f in files]
    titles = [ax.title.get_window_extent(renderer) for ax in axes]
    for i, a in enumerate(titles):
        assert 0 <= a.x0 and a.x1 <= fig.bbox.x1, "a title is cut at the figure's edge"
        assert not any(_overlap(a, b) for b in titles[i + 1:]), "two panel titles overlap"
    sup = fig._suptitle.get_window_extent(renderer)
    assert not any(_overlap(sup, ax.get_window_extent(renderer)) or _overlap(sup, t) for ax, t in zip(axes, titles))
    # two rows: no title runs into the row above's tick labels or x label, none of those leaves the figure
    below = [ax.xaxis.get_tightbbox(renderer) for ax in axes]
    assert not any(_overlap(t, b) for t in titles for b in below), "a title overlaps the x axis of the row above"
    assert all(b.y0 >= 0 for b in below) and all(ax.yaxis.get_tightbbox(renderer).x0 >= 0 for ax in axes)


def test_worker_processes_draw_the_same_report(tiny_results, tmp_path, monkeypatch):
    """`vlaperf report --jobs 2`: the sections drawn in two spawned processes make the report that one
    process makes, byte for byte (its text less the generated line, and every figure); a file a
    worker could not render is listed as skipped as before; the sections' figures were not drawn here."""
    from vlaperf.cli import main
    from vlaperf.report import render as mod

    bad = tmp_path / "stage_no_median.json"
    bad.write_text(json.dumps(_damaged(tiny_results, *DAMAGED[bad.name][:2])))
    files = [*sorted(tiny_results.glob("*.json")), bad]
    monkeypatch.setattr(mod, "PARALLEL_MIN_UNITS", 1)  # the tiny set has 8 sections
    drawn_here = []
    original = mod.Doc.fig
    monkeypatch.setattr(mod.Doc, "fig", lambda self, f, alt: (drawn_here.append(alt), original(self, f, alt)))
    one = render(files, tmp_path / "one" / "r.md", jobs=1)
    n_one = len(drawn_here)
    assert main(["report", *map(str, files), "-o", str(tmp_path / "two" / "r.md"), "--jobs", "2"]) == 0
    two = tmp_path / "two" / "r.md"
    assert len(drawn_here) - n_one < n_one, "every figure was drawn in this process: no worker ran"
    assert all(alt.startswith("summary") or "speed-up" in alt for alt in drawn_here[n_one:]), drawn_here[n_one:]

    def text(p):
        return [line for line in p.read_text().splitlines() if not line.startswith("_generated ")]

    assert text(one) == text(two)
    assert f"skipped {bad}: could not render it: missing field 'breakdown.stages[0].median_ms'" in text(two)
    figs_one, figs_two = sorted((one.parent / "r_files").iterdir()), sorted((two.parent / "r_files").iterdir())
    assert len(figs_one) >= 6 and [f.name for f in figs_one] == [f.name for f in figs_two]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(figs_one, figs_two))


def test_a_report_is_drawn_in_this_process_when_no_worker_can_start(tiny_results, tmp_path, monkeypatch):
    """Where processes cannot be started (a process limit), the figures are drawn here and the report is whole."""
    import concurrent.futures

    from vlaperf.report import render as mod

    def no_workers(*args, **kwargs):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_workers)
    monkeypatch.setattr(mod, "PARALLEL_MIN_UNITS", 1)
    md = render(sorted(tiny_results.glob("*.json")), tmp_path / "r.md", jobs=2).read_text()
    for heading in ("## Latency (bench)", "## Optimization matrix", "## Stage breakdown", "## T(N) scaling"):
        assert heading in md, heading
    assert "skipped" not in md and len(list((tmp_path / "r_files").iterdir())) >= 6


def test_a_report_imports_no_torch(tmp_path):
    """`vlaperf report` only reads result files, on machines where torch is slow to import (about a second, in every
    worker process too) or missing: from the CLI, files whose sections have helpers beside measuring code (the file
    table's GPU-state column, a T(N) section, a compare's RTC note) render with no torch imported, in this process or
    in the workers that draw the sections."""
    import subprocess
    import sys

    results = H200.parent
    files = [results / "h200" / "scaling_libero-pi0_best_s9.json",  # T(N), and a GPU state in the file table
             results / "h100" / "compare_libero-pi0_lerobot_accelerated-s51.json"]  # a compare with its RTC rows
    out = tmp_path / "r.md"
    code = ("import sys\n"
            "from vlaperf.cli import main\n"
            "from vlaperf.report import render\n"
            "render.PARALLEL_MIN_UNITS = 1  # two sections: drawn in worker processes all the same\n"
            f"code = main(['report', *{[str(f) for f in files]!r}, '-o', {str(out)!r}, '--jobs', '2'])\n"
            "print(code, 'torch' in sys.modules)")
    # -X importtime writes a line per module imported, and spawned workers inherit it: the workers' imports show too
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "0 False", done.stdout[-2000:]  # exit code 0, no torch in sys.modules
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert imported.count("vlaperf.report.render") >= 2, "no worker process drew a section"
    assert "torch" not in imported, "torch was imported in a worker process"
    md = out.read_text()
    # the sections were drawn, not skipped: the test covers them
    assert "skipped" not in md and "## T(N) scaling" in md
    assert re.search(r"\| SM \d+/\d+ MHz, \d+/\d+ W, \d+ C", md), "no GPU state in the file table"
    assert "lerobot_predict_rtc / vlaperf_in_lerobot_predict_rtc: the same two calls with LeRobot's real-time" in md


def test_a_diff_imports_no_torch():
    """`vlaperf diff` reads two result files only, as a report does: from the CLI, two bench files of `--processes`
    (the process medians) and two breakdowns (the stage table) are compared with no torch imported."""
    import subprocess
    import sys

    results = H200.parent
    pairs = [(results / "h100" / "bench_libero-pi0_best-s55-4proc_model.json",
              results / "h100" / "bench_libero-pi0_best-s57-4proc_model.json"),
             (H200 / "breakdown_libero-pi0_best-s25.json", H200 / "breakdown_libero-pi0_best-s30.json")]
    code = ("import sys\n"
            "from vlaperf.cli import main\n"
            f"codes = [main(['diff', before, after]) for before, after in {[(str(a), str(b)) for a, b in pairs]!r}]\n"
            "print(codes, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[0, 0] False", done.stdout[-2000:]  # both compared, no torch imported
    # both files' sections were compared, not refused: the test covers them
    assert "process medians, ms: before" in done.stdout and "stages: each stage's median" in done.stdout


def test_the_file_only_commands_each_have_a_no_torch_test():
    """main parses these commands without the torch-importing parsers: each is checked above in a fresh process."""
    from vlaperf.profile.commands import FILE_COMMANDS

    assert list(FILE_COMMANDS) == ["report", "diff"], "a new file-only command needs a test that it imports no torch"


def test_report_jobs_must_be_a_positive_count(capsys):
    from vlaperf.cli import main

    with pytest.raises(SystemExit) as e:
        main(["report", str(H200), "-o", "r.md", "--jobs", "0"])
    assert e.value.code == 2 and "--jobs" in capsys.readouterr().err


def test_one_panel_histogram_keeps_its_whole_suptitle(tiny_results, tmp_path, figures):
    """One file in a group: a 4-inch figure whose suptitle (the workload and GPU) is wrapped into lines that stay
    inside it and above the panel's title (one line over it was cut at both edges)."""
    r = json.loads((tiny_results / "bench.json").read_text())
    r["env"]["gpu"] = "NVIDIA H200 with a long enough name"
    (tmp_path / "b.json").write_text(json.dumps(r))
    render([tmp_path / "b.json"], tmp_path / "r.md")
    (fig,) = [f for a, f in figures if a.startswith("latency histograms")]
    assert fig.get_size_inches()[0] == pytest.approx(4.0)
    renderer = _renderer(fig)
    sup = fig._suptitle.get_window_extent(renderer)
    assert fig._suptitle.get_text().count("\n") >= 1, fig._suptitle.get_text()
    assert 0 <= sup.x0 and sup.x1 <= fig.bbox.x1 and sup.y1 <= fig.bbox.y1, "the suptitle is cut at the figure's edge"
    assert not _overlap(sup, fig.axes[0].title.get_window_extent(renderer))


def test_histogram_median_is_the_summary_median(tiny_results, tmp_path, figures):
    """Four samples 1, 2, 3, 10: the summary's (interpolated) median is 2.5, the upper middle sample 3."""
    r = json.loads((tiny_results / "bench.json").read_text())
    r["samples"] = {"wall_ms": [1.0, 2.0, 3.0, 10.0], "cuda_event_ms": None}
    r["timers"]["wall_ms"].update(count=4, median=2.5, min=1.0, max=10.0)
    (tmp_path / "b.json").write_text(json.dumps(r))
    render([tmp_path / "b.json"], tmp_path / "r.md")
    (fig,) = [f for a, f in figures if a.startswith("latency histograms")]
    assert fig.axes[0].get_title().endswith("median 2.500 ms")
    assert [line.get_xdata()[0] for line in fig.axes[0].lines] == [2.5]


def test_many_bench_files_keep_the_figures_readable(tiny_results, tmp_path, figures):
    """14 files of one group: histograms in images of at most 12 panels, a CDF legend of at most
    10 entries outside the axes, every file still in the table."""
    from vlaperf.report.render import CDF_LEGEND, HIST_PANELS

    files = _bench_copies(tiny_results, tmp_path, 14)
    md = render(files, tmp_path / "r.md").read_text()
    assert all(f"| {f.stem} |" in md for f in files)
    hists = [f for a, f in figures if a.startswith("latency histograms")]
    assert len(hists) == 2 and [len([ax for ax in f.axes if ax.get_visible()]) for f in hists] == [HIST_PANELS, 2]
    (cdf,) = [f for a, f in figures if a.startswith("latency CDF")]
    ax = cdf.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == CDF_LEGEND and labels[0].startswith("bench_run00") and labels[-1].startswith("bench_run13")
    renderer = _renderer(cdf)
    assert not _overlap(ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer))


# ----------------------------------------------------------------- rollout, environment, small things


def _rollout_result(tiny_results) -> dict:
    """A result as `vlaperf rollout --json` writes it (vlaperf/serve/rollout.py), two episodes."""
    r = json.loads((tiny_results / "bench.json").read_text())
    head = {k: r[k] for k in ("schema", "workload", "variant", "env")}

    def calls(*ms):
        return {"count": len(ms), "mean": sum(ms) / len(ms), "median": sorted(ms)[len(ms) // 2], "p90": max(ms),
                "p95": max(ms), "p99": max(ms), "min": min(ms), "max": max(ms), "std": 0.0}

    episodes = [{"episode": 0, "steps": 20, "policy_calls": 4, "wall_s": 2.0039, "ideal_wall_s": 2.0,
                 "policy_wait_s": 0.0549, "policy_wait_share": 0.0274, "overrun_steps": 0,
                 "policy_call_ms": calls(12.0, 13.9, 14.0, 14.9)},
                {"episode": 1, "steps": 20, "policy_calls": 4, "wall_s": 2.1042, "ideal_wall_s": 2.0,
                 "policy_wait_s": 0.1447, "policy_wait_share": 0.0688, "overrun_steps": 1,
                 "policy_call_ms": calls(10.6, 10.9, 11.0, 112.3)}]
    return {**head, "command": "rollout", "mode": "serve",
            "server": {"levers_label": "for_loop+sdpa", "dtype": "float32", "device": "cpu", "max_batch": 8},
            "rollout": {"url": "ws://127.0.0.1:8000", "observations": "SYNTHETIC: random images and state; no "
                        "simulator or robot, actions are not applied", "episodes": 2, "steps_per_episode": 20,
                        "control_hz": 10.0, "replan_every": 5, "action_horizon": 10, "image_size": 224,
                        "timed_out": False, "errors": 0, "per_episode": episodes, "wall_s": 4.1081,
                        "policy_wait_s": 0.1996, "policy_wait_share": 0.0486, "overrun_steps": 1,
                        "policy_call_ms": calls(10.6, 10.9, 11.0, 12.0, 13.9, 14.0, 14.9, 112.3),
                        "server_infer_ms": calls(9.0, 9.5, 10.0, 10.2)}}


def test_rollout_results_get_a_section(tiny_results, tmp_path):
    (tmp_path / "rollout.json").write_text(json.dumps(_rollout_result(tiny_results)))
    md = render([tmp_path / "rollout.json"], tmp_path / "r.md").read_text()
    assert "has no renderer" not in md and "skipped" not in md
    assert "## A control loop against the server (rollout)" in md
    assert "### rollout: tiny, levers loop+sdpa on cpu" in md
    assert ("| episode | steps | policy calls | wall s | ideal s | waiting s | waiting | overrun steps | call p50 ms "
            "| call max ms |") in md
    assert "| 1 | 20 | 4 | 2.104 | 2.000 | 0.145 | 6.9% | 1 | 11.000 | 112.3 |" in md
    assert "| all | 40 | 8 | 4.108 | 4.000 | 0.2 | 4.9% | 1 |" in md
    assert "4.9% of it waiting for the policy; 1 overrun steps; 0 errors" in md
    assert "the observations are SYNTHETIC" in md
    assert "closed-loop calls" not in md  # a file from before --back-to-back

    r = _rollout_result(tiny_results)
    r["rollout"]["server_infer_ms"] = {"median": 10.5}
    r["rollout"]["back_to_back"] = {"calls_per_episode": 10, "errors": 0, "policy_call_ms": {"median": 10.0},
                                    "server_infer_ms": {"median": 10.0}}
    r["rollout"]["at_cadence_over_back_to_back"] = {"policy_call_ms": 1.39, "server_infer_ms": 1.05}
    (tmp_path / "rollout.json").write_text(json.dumps(r))
    md = render([tmp_path / "rollout.json"], tmp_path / "r.md").read_text()
    assert ("At 10 Hz a call's round trip took 13.90 ms (median) against 10.00 ms in 10 closed-loop calls after each "
            "episode: 1.390x; the server's own time 10.50 against 10.00 ms, 1.050x") in md


def test_environment_lists_shared_keys_once_and_who_differs(tiny_results, tmp_path):
    """One column per distinct environment made 281 columns of the committed results (the commit
    differs between most runs): keys equal everywhere are listed once, the rest per value with
    the files' numbers."""
    r = json.loads((tiny_results / "bench.json").read_text())
    for i, (commit, threads, env_vars) in enumerate([("aaa", 2, {}), ("bbb", 2, {"CUDA_VISIBLE_DEVICES": "0"}),
                                                    ("aaa", 2, {"CUDA_VISIBLE_DEVICES": "0"}), ("ccc", 4, {})]):
        r["env"].update(git_commit=commit, torch_threads=threads, env_vars=env_vars)
        (tmp_path / f"b{i}.json").write_text(json.dumps(r))
    md = render(sorted(tmp_path.glob("b*.json")), tmp_path / "r.md").read_text()
    env = md[md.index("## Environment"):]
    widths = {line.count(" | ") + 1 for line in env.splitlines() if line.startswith("| ")}
    assert max(widths) <= 4
    assert f"| torch | {r['env']['torch']} |" in env
    assert "| git_commit | aaa | 2 | 1, 3 |" in env and "| git_commit | bbb | 1 | 2 |" in env
    assert "| torch_threads | 2 | 3 | 1-3 |" in env and "| torch_threads | 4 | 1 | 4 |" in env
    assert "| env_vars.CUDA_VISIBLE_DEVICES | 0 | 2 | 2-3 |" in env
    assert "| env_vars.CUDA_VISIBLE_DEVICES | (absent) | 2 | 1, 4 |" in env
    assert "| env_vars |" not in env  # the empty objects are those (absent) rows, not a row of their own


def test_breakdown_syncs_and_output_details(tiny_results, tmp_path, figures):
    """The masked-image caption only where there are image slots (not on world-action
    breakdowns), shares as percentages, the syncs heading names its mode, and -o accepts
    exactly .html or .md (any case)."""
    wam = json.loads((tiny_results / "bd.json").read_text())
    wam["workload"]["id"] = "wam-tiny"
    wam["breakdown"]["stages"] = [e for e in wam["breakdown"]["stages"] if not e["name"].startswith("image_")]
    (tmp_path / "bd_wam.json").write_text(json.dumps(wam))
    md = render([tiny_results / "bd.json", tmp_path / "bd_wam.json", tiny_results / "sy.json"], tmp_path / "r.md").read_text()
    captions = [f.axes[0].get_title() for a, f in figures if a == "stage breakdown"]
    assert captions == ["stage breakdown (red: a masked image slot)", "stage breakdown"]
    shares = re.findall(r"^\| prefix_prefill \| [^|]+ \| [^|]+ \| [^|]+ \| ([^|]+) \|", md, re.M)
    assert shares and all(re.fullmatch(r"\d+\.\d%", s.strip()) for s in shares), shares
    assert "### syncs: tiny reference (model mode, cpu)" in md
    for bad in ("r.markdown", "r.htm", "r.txt", "r.md.bak"):
        with pytest.raises(ValueError, match=r"must end in \.html or \.md \(any case\)"):
            render([tiny_results / "sy.json"], tmp_path / bad)
    assert render([tiny_results / "sy.json"], tmp_path / "R.MD").read_text().startswith("# vlaperf report")
    assert render([tiny_results / "sy.json"], tmp_path / "R.HTML").read_text().startswith("<!DOCTYPE html>")


def test_x_floor_only_for_gpu_runs(tmp_path):
    """The roofline floor is of the H200's ceilings: a CPU run's file carries it, the report shows no
    "x floor" for it (a tiny CPU run was "111482x" its floor)."""
    from vlaperf.cli import main

    out = tmp_path / "b.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--iters", "2", "--warmup", "1", "--no-progress",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["roofline"]["floor_ms"] > 0
    render([str(out)], tmp_path / "r.md")
    row = next(line for line in (tmp_path / "r.md").read_text().splitlines() if line.startswith("| b | reference"))
    assert row.rstrip(" |").endswith("| - | -"), row  # roofline floor ms, x floor


def test_summary_takes_each_variants_newest_file_and_its_speed_up_over_the_reference(tiny_results, tmp_path, figures):
    """The report opens with the newest bench file of each variant per workload, device and mode, slowest first,
    each with the reference's median over its own; an older file of a variant is not in it; a group with no
    reference has no speed-up; a group of three or more variants with a reference gets a bar chart."""
    base = json.loads((tiny_results / "bench.json").read_text())

    def bench(name, levers, median, day, passed=True, overrides=None):
        c = json.loads(json.dumps(base))
        c["variant"].update({"levers": levers, "label": ",".join(levers) or "reference"})
        c["timers"]["wall_ms"]["median"] = median
        c["env"]["timestamp"] = f"2026-12-{day:02d}T10:00:00+00:00"
        c["equivalence"] = None if not levers else {"rel_l2": 1e-3, "max_abs": 1e-3, "tolerance": 1e-4,
                                                    "passed": passed, "dtype": "float32", "seeds": 2, "variant": "x"}
        c["workload"]["overrides"] = overrides or {}
        (tmp_path / f"{name}.json").write_text(json.dumps(c))
        return tmp_path / f"{name}.json"

    files = [bench("ref", [], 100.0, 1), bench("loop_new", ["for_loop"], 40.0, 2), bench("loop_old", ["for_loop"], 50.0, 1),
             bench("loop_sdpa", ["for_loop", "sdpa"], 20.0, 1, passed=False),
             bench("b2", ["for_loop"], 30.0, 1, overrides={"batch": 2})]
    md = render(files, tmp_path / "r.md").read_text()
    assert md.index("## Summary") < md.index("## Files") < md.index("## bench")
    summary = md.split("## Summary")[1].split("## Files")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| tiny")]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        ("tiny on cpu, model mode", "reference", "100.0", "1.00x"),
        ("tiny on cpu, model mode", "for_loop", "40.000", "2.50x"),  # the newer file of for_loop, not the 50 ms one
        ("tiny on cpu, model mode", "loop+sdpa", "20.000", "5.00x"),
        ("tiny (batch 2) on cpu, model mode", "for_loop", "30.000", "-")]
    assert [r[8] for r in rows] == ["-", "1.0e-03", "1.0e-03 (failed)", "1.0e-03"]
    assert [r[6] for r in rows][3] == "66.667"  # action chunks a second at batch 2
    assert [r[-1] for r in rows] == ["ref.json", "loop_new.json", "loop_sdpa.json", "b2.json"]
    assert [alt for alt, _ in figures if alt.startswith("speed-up")] == ["speed-up over the reference, tiny on cpu, model mode"]


def test_a_reference_of_another_dtype_is_no_reference(tiny_results, tmp_path):
    """Files of two dtypes are two computations: a bf16 file is not timed "vs reference" against a float32 reference
    (a fresh tiny pair read 1.24x, neither table naming a dtype). A dtype that is not the device's default is named
    in its group, in the summary and the bench section alike."""
    base = json.loads((tiny_results / "bench.json").read_text())
    assert base["variant"]["dtype"] == "float32" and not base["env"]["gpu"]  # the CPU's default
    fast = json.loads(json.dumps(base))
    fast["variant"].update({"levers": ["for_loop"], "label": "for_loop", "dtype": "bfloat16"})
    fast["timers"]["wall_ms"]["median"] = base["timers"]["wall_ms"]["median"] / 2
    (tmp_path / "ref.json").write_text(json.dumps(base))
    (tmp_path / "bf16.json").write_text(json.dumps(fast))
    md = render([tmp_path / "ref.json", tmp_path / "bf16.json"], tmp_path / "r.md").read_text()
    summary = md.split("## Summary")[1].split("## Files")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| tiny")]
    assert [(r[0], r[1], r[4]) for r in rows] == [("tiny on cpu, model mode", "reference", "1.00x"),
                                                  ("tiny on cpu in bfloat16, model mode", "for_loop", "-")]
    assert "### bench: tiny on cpu\n" in md and "### bench: tiny on cpu in bfloat16\n" in md
    # the matrix and scaling sections too (session 67's float32 matrix on an H100 read as the page's bfloat16)
    for name in ("matrix", "sc"):
        f = json.loads((tiny_results / f"{name}.json").read_text())
        f["variant"]["dtype"] = "bfloat16"
        (tmp_path / f"{name}.json").write_text(json.dumps(f))
    md = render([tiny_results / "matrix.json", tmp_path / "matrix.json", tiny_results / "sc.json", tmp_path / "sc.json"],
                tmp_path / "m.md").read_text()
    for section in ("matrix", "scaling"):
        assert md.count(f"### {section}: tiny on cpu in bfloat16, model mode") == 1, section
        assert md.count(f"### {section}: tiny on cpu, model mode") == 1, section


def test_no_summary_without_bench_files(tiny_results, tmp_path):
    md = render([tiny_results / "matrix.json"], tmp_path / "r.md").read_text()
    assert "## Summary" not in md and "## Files" not in md and "## matrix" in md.lower()


def test_a_ray_matrix_says_so_and_shows_each_rows_own_reference(tiny_results, tmp_path):
    """A `matrix --ray` file's speed-ups are each against the reference timed in that row's own task: the section
    says it is Ray's, its caption says what the speed-up divides, and each row shows that reference's median (the
    caption used to say "median of the baseline", next to a reference row of another task)."""
    m = json.loads((tiny_results / "matrix.json").read_text())
    for v in m["variants"]:
        if "timers" in v and v["variant"] != "reference":
            v["reference"] = {"timers": {"wall_ms": {**v["timers"]["wall_ms"], "median": 12.345}}}
    m["ray"] = {"tasks": 2, "devices": [], "ratios": "each row against its own task's reference"}
    (tmp_path / "mr.json").write_text(json.dumps(m))
    md = render([tmp_path / "mr.json"], tmp_path / "r.md").read_text()
    assert "### matrix (Ray): tiny" in md and "timed interleaved in the row's own Ray task" in md
    assert "| reference ms |" in md and "| 12.345 |" in md
    plain = render([tiny_results / "matrix.json"], tmp_path / "p.md").read_text()
    assert "(Ray)" not in plain and "reference ms" not in plain and "median of the baseline (reference)" in plain


def test_a_file_the_summary_cannot_use_costs_only_its_own_row(tiny_results, tmp_path):
    """One bench file with a field the summary cannot format is left out of the summary with its reason; the
    other files keep their rows (one such file used to replace the whole summary with an error). A timestamp
    that is not a string no longer breaks the newest-file choice, and a file that is no result at all (a
    Chrome trace) is skipped with a one-line reason, also handed to on_skip."""
    base = json.loads((tiny_results / "bench.json").read_text())

    def bench(name, levers, median, **changes):
        c = json.loads(json.dumps(base))
        c["variant"].update({"levers": levers, "label": ",".join(levers) or "reference"})
        c["timers"]["wall_ms"]["median"] = median
        for key, value in changes.items():
            c[key] = {**(c.get(key) or {}), **value}
        (tmp_path / f"{name}.json").write_text(json.dumps(c))
        return tmp_path / f"{name}.json"

    files = [bench("ref", [], 100.0), bench("loop", ["for_loop"], 40.0, env={"timestamp": 12}),
             bench("bad", ["sdpa"], 50.0, equivalence={"rel_l2": "x", "passed": True})]
    forward = json.loads(files[0].read_text())
    forward["mode"] = "forward"  # one model forward: no action chunk to count
    (tmp_path / "fwd.json").write_text(json.dumps(forward))
    files.append(tmp_path / "fwd.json")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    skipped = []
    md = render([*files, trace], tmp_path / "r.md", on_skip=skipped.append).read_text()
    summary = md.split("## Summary")[1].split("## Files")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| tiny")]
    assert [(r[0], r[1], r[4]) for r in rows] == [("tiny on cpu, model mode", "reference", "1.00x"),
                                                  ("tiny on cpu, model mode", "for_loop", "2.50x"),
                                                  ("tiny on cpu, forward mode", "reference", "1.00x")]
    assert rows[0][6] == "10.000" and rows[2][6] == "-"  # action chunks/s
    assert "no summary" not in summary
    assert "left out of the summary: bad.json: could not render it: ValueError" in summary
    assert "bad.json" in md.split("## Files")[1]  # its own section still has it
    assert skipped == [f"{trace}: not a vlaperf result file (no \"schema\" key; a result file has \"schema\": "
                       "\"vlaperf.result/1\")"]


def test_every_lever_has_a_short_name_so_long_variants_stay_distinct():
    """Tables show variants by short names; a world-action preset's full lever list was cut to a prefix that five
    rows of its cumulative matrix shared."""
    from vlaperf.engine.levers import LEVERS
    from vlaperf.engine.wam import WAM_LEVERS, WAM_PRESETS
    from vlaperf.report.document import LEVER_ABBREVIATIONS, short_variant

    abbreviated = set(LEVER_ABBREVIATIONS)
    assert set(LEVERS) - {"compile"} <= abbreviated and set(WAM_LEVERS) - {"compile"} <= abbreviated
    best = ",".join(WAM_PRESETS["best"])
    assert short_variant(best) == ("host+keepidx+sparse+ctxkv+vidkv+sdpa+fuse+graph+c:default+groupmod+flashact")
    assert short_variant("host_schedule,cached_keep_index") != short_variant("host_schedule,cached_keep_index,sparse_sampler")


def test_workload_label_names_the_overrides_and_one_value_for_equal_samples():
    """A file's workload with what the run changed: per-sample prompt lengths as one number where every sample
    has it (benchmarks' --valid), else each sample's."""
    from vlaperf.report.document import workload_label

    assert workload_label({"workload": {"id": "libero-pi0", "overrides": {}}}) == "libero-pi0"
    assert workload_label({"workload": {"id": "libero-pi0", "overrides": {"prompt_valid": [8]}}}) == "libero-pi0 (prompt_valid 8)"
    assert (workload_label({"workload": {"id": "libero-pi0-b4", "overrides": {"prompt_valid": [8, 8, 12, 8], "steps": 5}}})
            == "libero-pi0-b4 (prompt_valid 8/8/12/8, steps 5)")
    assert workload_label({"workload": {"id": None, "overrides": {}}}) == "-"  # doctor, environment only ("None")


def test_cells_keep_absurd_finite_values_short():
    """A value far outside any timing's range (an edited file: 1e300 passes the finite check) is rendered in a few
    characters, not as a 300-digit number; ordinary values keep their fixed decimals."""
    from vlaperf.report.document import cell

    assert cell(1e300) == "1e+300" and cell(-2.5e7) == "-2.5e+07" and cell(float("inf")) == "inf"
    assert cell(263.987) == "264.0" and cell(12.8046) == "12.805" and cell(0.00641) == "0.00641"


def test_markdown_carries_no_raw_html_from_result_files(tiny_results, tmp_path):
    """A variant label `<img src=x onerror=...>` went into the markdown report as a tag (three times), which viewers
    that render inline HTML would run; the HTML report escaped it. Both now show it as text."""
    result = json.loads((tiny_results / "bench.json").read_text())
    label = "<img src=x onerror=alert(2)>"
    result["variant"]["label"] = label
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bench.json").write_text(json.dumps(result))
    md = render([tmp_path / "in"], tmp_path / "r.md").read_text()
    assert "<img" not in md and "&lt;img src=x onerror=alert(2)>" in md
    page = render([tmp_path / "in"], tmp_path / "r.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(2)&gt;" in page


def test_an_unchecked_bench_is_marked_not_checked(tmp_path, capsys):
    """`bench --no-check` files looked like checked ones in the report (rel L2 "-") and said their first call was
    timed "before equivalence check", which never ran."""
    from vlaperf.cli import main

    out = tmp_path / "in" / "b.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", "exact", "--no-check", "--warmup", "1",
                 "--iters", "2", "--no-progress", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["equivalence"] is None and r["first_call_timing"] == "not checked (--no-check)"
    md = render([out.parent], tmp_path / "r.md").read_text()
    (row,) = [line for line in md.splitlines() if "b.json" in line and "not checked" in line]
    assert "for_loop" in row or "loop" in row


def test_a_fifo_among_the_inputs_is_skipped_not_waited_on(tiny_results, tmp_path):
    """`vlaperf report` given a named pipe (or a folder holding one named *.json) hung, reading it forever."""
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    (tmp_path / "in").mkdir()
    os.mkfifo(tmp_path / "in" / "pipe.json")
    (tmp_path / "in" / "bench.json").write_text((tiny_results / "bench.json").read_text())
    results, problems = load_results([tmp_path / "in", tmp_path / "in" / "pipe.json"])
    assert [Path(p).name for p, _ in results] == ["bench.json"]
    assert problems == [f"{tmp_path / 'in' / 'pipe.json'}: not a regular file"]


def test_a_markdown_report_written_again_leaves_no_figures_of_the_last_one(tiny_results, tmp_path):
    out = tmp_path / "r.md"
    render([tiny_results], out)
    before = sorted(p.name for p in (tmp_path / "r_files").glob("*.png"))
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "sc.json").write_text((tiny_results / "sc.json").read_text())
    md = render([tmp_path / "one"], out).read_text()
    after = sorted(p.name for p in (tmp_path / "r_files").glob("*.png"))
    assert len(after) < len(before) and all(f"r_files/{name}" in md for name in after)


# ----------------------------------------------------------------- table cells, names, reasons (mutation audit)


def test_cells_format_each_kind_at_its_boundaries():
    """Each branch of a table cell: null, booleans, NaN, zero, the decimals by magnitude (negative values by their
    size), objects as JSON, anything else as written."""
    assert cell(None) == "-" and cell(True) == "yes" and cell(False) == "no" and cell(float("nan")) == "nan"
    assert cell(0.0) == "0" and cell(1e6) == "1e+06" and cell(999999.0) == "999999.0"
    assert cell(100.0) == "100.0" and cell(99.99) == "99.990" and cell(-250.0) == "-250.0"
    assert cell(1.0) == "1.000" and cell(-1.5) == "-1.500" and cell(0.123456) == "0.123"
    assert cell({"a": 1}) == '{"a": 1}' and cell([1, "x"]) == '[1, "x"]' and cell(7) == "7" and cell("s") == "s"


def test_short_names_clips_labels_and_errors():
    from vlaperf.report.document import clip, gpu_name, sci, short_variant, workload_label
    from vlaperf.report.render import _label

    assert short_variant("none") == short_variant("") == short_variant("reference") == "reference"
    assert short_variant("for_loop") == "for_loop" and short_variant("for_loop+sdpa") == "loop+sdpa"
    # one lever of up to 36 characters keeps its name; a longer one is shortened like a list of levers
    assert short_variant("compile=" + "x" * 28) == "compile=" + "x" * 28
    assert short_variant("compile=" + "x" * 29) == "c:" + "x" * 29
    assert clip("abcde", 5) == "abcde" and clip("abcdef", 5) == "abcd\u2026" and clip(12345, 3) == "12\u2026"
    assert workload_label({"workload": {"id": "x", "overrides": {"steps": 5, "batch": 2}}}) == "x (batch 2, steps 5)"
    assert _label({"variant": None, "mode": None}) == "reference [-]"
    assert _label({"variant": {"label": "for_loop,sdpa"}, "mode": "policy"}) == "loop+sdpa [policy]"
    assert gpu_name({"env": {"gpu": None, "device": "cuda:1"}}) == "cuda:1" and gpu_name({"env": None}) == "cpu"
    assert sci(None) == "-" and sci(0.00123) == "1.2e-03" and sci(2) == "2.0e+00"
    for bad in (True, "1e-3"):
        with pytest.raises(ValueError, match="rel_l2: expected a number or null"):
            sci(bad)


def test_default_jobs_is_the_usable_cores_capped(monkeypatch):
    import os

    from vlaperf.report.render import MAX_JOBS, default_jobs

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert default_jobs() == MAX_JOBS == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert default_jobs() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert default_jobs() == 1


def test_skip_reasons_say_what_is_wrong_with_each_file(tiny_results, tmp_path):
    """Files of a folder in name order; a file that is not JSON, one that does not exist, one nested past the parser's
    depth and one that is a JSON object but no result are each a one-line problem that says so; a reason is one line
    of at most 300 characters."""
    from vlaperf.report.render import _reason

    d = tmp_path / "in"
    d.mkdir()
    for name in ("b.json", "a.json", "c.json"):
        (d / name).write_text((tiny_results / "sy.json").read_text())
    results, problems = load_results([d])
    assert [Path(p).name for p, _ in results] == ["a.json", "b.json", "c.json"] and problems == []
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "deep.json").write_text("[" * 100000)
    results, problems = load_results([tmp_path / "broken.json", tmp_path / "missing.json", tmp_path / "deep.json"])
    assert results == [] and len(problems) == 3
    assert problems[0].startswith(f"{tmp_path / 'broken.json'}: not valid JSON: ")
    assert problems[1].startswith(f"{tmp_path / 'missing.json'}: ") and "No such file" in problems[1]
    assert problems[2].startswith(f"{tmp_path / 'deep.json'}: RecursionError: ")
    assert _reason(ValueError("line one\n   line two")) == "ValueError: line one line two"
    long = _reason(ValueError("x" * 400))
    assert len(long) == 300 and long.endswith("x\u2026")
    with pytest.raises(ValueError, match=r"no valid vlaperf result files: .*broken\.json: not valid JSON"):
        render([tmp_path / "broken.json"], tmp_path / "r.md")


def test_field_problem_names_the_field_and_what_it_holds():
    from vlaperf.report.render import field_problem

    cases = [({"command": "matrix", "variants": None}, "matrix: variants is null, expected an array of objects"),
             ({"command": "matrix", "variants": {"a": 1}}, "matrix: variants is object, expected an array of objects"),
             ({"command": "check", "checks": [{}, 3, "x"]}, "check: checks holds number 3, expected objects"),
             ({"command": "check", "checks": [["a" * 100]]},
              'check: checks holds array ["' + "a" * 37 + '\u2026, expected objects'),
             ({"command": "rollout", "rollout": {}}, "rollout: rollout.per_episode is null, expected an array of objects"),
             ({"command": "scaling", "scaling": {"series": 1}}, "scaling: scaling.series is number, expected an array"),
             ({"command": "syncs", "syncs": {"sites": "x"}}, "syncs: syncs.sites is string, expected an array"),
             ({"command": "doctor", "findings": None}, "doctor: findings is null, expected an array of objects"),
             ({"command": "compare", "compare": {"equivalence": []}}, "compare: compare.equivalence is array, expected an object"),
             ({"command": "bench", "samples": "x"}, "bench: samples is string, expected an object"),
             ({"command": "bench", "samples": {"wall_ms": [1.0, "x"]}}, "bench: samples.wall_ms must be an array of numbers"),
             ({"command": "bench", "samples": {"wall_ms": 5}}, "bench: samples.wall_ms must be an array of numbers")]
    for r, message in cases:
        assert (field_problem(r) or "").startswith(message), (r, field_problem(r))
    assert field_problem({"command": "bench", "samples": {"wall_ms": [1.0, 2], "cuda_event_ms": None}}) is None
    assert field_problem({"command": "bench"}) is None and field_problem({"command": "scaling", "scaling": {"series": []}}) is None


def test_validate_result_names_each_missing_or_wrong_field(tiny_results):
    from vlaperf.report.schema import SchemaError, validate_result

    good = json.loads((tiny_results / "bench.json").read_text())
    wall = good["timers"]["wall_ms"]
    no_env = {k: v for k, v in good.items() if k != "env"}
    cases = [(no_env, "missing key 'env'"),
             ({**good, "schema": "vlaperf.result/2"}, "schema must be 'vlaperf.result/1', got 'vlaperf.result/2'"),
             ({**good, "command": 5}, "command: expected a string, got number"),
             ({**good, "workload": {"id": "tiny"}}, "workload: expected {'id': ..., 'overrides': {...}}"),
             ({**good, "workload": {"overrides": {}}}, "workload: expected {'id': ..., 'overrides': {...}}"),
             ({**good, "timers": {"wall_ms": {**wall, "median": True}}}, "timers.wall_ms.median: expected a number, got boolean"),
             ({**good, "timers": {"wall_ms": {k: v for k, v in wall.items() if k != "p99"}}}, "timers.wall_ms: missing 'p99'"),
             ({**good, "first_call_s": float("inf")}, "first_call_s: expected a finite number of seconds >= 0 or null, got inf"),
             ({**good, "first_call_s": -1.0}, "first_call_s: expected a finite number of seconds >= 0 or null, got -1.0")]
    for key in ("gpu", "driver", "cuda", "torch", "triton", "python", "vlaperf", "git_commit", "env_vars", "c_compiler"):
        cases.append(({**good, "env": {k: v for k, v in good["env"].items() if k != key}}, f"env: missing {key!r}"))
    for result, message in cases:
        with pytest.raises(SchemaError, match=re.escape(message)):
            validate_result(result)
    # every problem at once, not the first
    with pytest.raises(SchemaError, match=re.escape("command: expected a string, got number; mode: expected a string")):
        validate_result({**good, "command": 5, "mode": [1]})
    # zero is a time (a std of one sample, a cached first call), null a first call not timed
    for ok in ({**good, "first_call_s": 0.0}, {**good, "first_call_s": None},
               {**good, "timers": {"wall_ms": {**wall, "std": 0.0, "min": 0}}}):
        assert validate_result(ok) is ok


def test_summary_columns_and_the_newest_file_on_a_tie(tiny_results, tmp_path, figures):
    """The summary's other columns (p95, x floor for GPU runs only, first call, the day measured); of two files of a
    variant with one timestamp the later path; an equivalence without `passed` is not a failure; a bar chart only for
    a group of three variants or more, its long names cut at their start. The bench table's x floor and peak GiB."""
    base = json.loads((tiny_results / "bench.json").read_text())

    def bench(name, label, median, gpu=True, equivalence=None):
        c = json.loads(json.dumps(base))
        c["variant"].update({"levers": [] if label == "reference" else [label], "label": label})
        c["timers"]["wall_ms"].update(median=median, p95=median * 1.2)
        c["timers"]["cuda_event_ms"] = dict(c["timers"]["wall_ms"]) if gpu else None
        c["env"].update(timestamp="2026-12-03T10:00:00+00:00", gpu="NVIDIA H200" if gpu else None)
        c["variant"]["dtype"] = "bfloat16" if gpu else "float32"  # each device's default: no dtype in the group's name
        c.update(first_call_s=2.5, equivalence=equivalence, peak_memory_bytes=3 * 2**30,
                 roofline={**(c.get("roofline") or {}), "floor_ms": 50.0})
        (tmp_path / f"{name}.json").write_text(json.dumps(c))
        return tmp_path / f"{name}.json"

    eq = {"rel_l2": 2e-3, "max_abs": 1e-3, "tolerance": 1e-2, "dtype": "float32", "seeds": 2, "variant": "x"}
    long = "y" * 60
    files = [bench("ref", "reference", 200.0), bench("a_loop", "for_loop", 90.0, equivalence=eq),
             bench("b_loop", "for_loop", 80.0, equivalence=eq), bench("long", long, 100.0, equivalence=eq),
             bench("cpu_ref", "reference", 300.0, gpu=False), bench("cpu_loop", "for_loop", 150.0, gpu=False)]
    md = render(files, tmp_path / "r.md").read_text()
    summary = md.split("## Summary")[1].split("## Files")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| tiny")]
    gpu_key, cpu_key = "tiny on NVIDIA H200, model mode", "tiny on cpu, model mode"
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[8], r[9], r[10]) for r in rows] == [
        (gpu_key, "reference", "200.0", "240.0", "1.00x", "4.00x", "2.500", "-", "2026-12-03", "ref.json"),
        (gpu_key, long, "100.0", "120.0", "2.00x", "2.00x", "2.500", "2.0e-03", "2026-12-03", "long.json"),
        (gpu_key, "for_loop", "80.000", "96.000", "2.50x", "1.60x", "2.500", "2.0e-03", "2026-12-03", "b_loop.json"),
        (cpu_key, "reference", "300.0", "360.0", "1.00x", "-", "2.500", "-", "2026-12-03", "cpu_ref.json"),
        (cpu_key, "for_loop", "150.0", "180.0", "2.00x", "-", "2.500", "not checked", "2026-12-03", "cpu_loop.json")]
    charts = [(alt, f) for alt, f in figures if alt.startswith("speed-up")]
    assert [alt for alt, _ in charts] == [f"speed-up over the reference, {gpu_key}"]
    ticks = [t.get_text() for t in charts[0][1].axes[0].get_yticklabels()]
    assert ticks == ["reference", "\u2026" + "y" * 47, "for_loop"]
    bench_rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ref |")]
    assert sorted((r[2], r[12], r[13], r[14]) for r in bench_rows) == [("cuda_event_ms", "3.000", "50.000", "-"),
                                                                      ("wall_ms", "3.000", "50.000", "4.000")]
    env = md[md.index("## Environment"):]
    assert "the same in all 6 file(s):" in env


def test_bench_groups_keep_their_order_and_prefix_ab_files_are_change_ab(tiny_results, tmp_path):
    """Bench groups (workload and device) in the order they first appear, whichever section piece draws them; session
    8's "prefix-ab" file in the change-ab section, not in "Other results"."""
    base = json.loads((tiny_results / "bench.json").read_text())
    for name, gpu, overrides in (("a", None, {}), ("b", None, {"batch": 2}), ("c", "NVIDIA H200", {})):
        c = json.loads(json.dumps(base))
        c["env"]["gpu"], c["workload"]["overrides"] = gpu, overrides
        c["variant"]["dtype"] = "bfloat16" if gpu else "float32"  # the device's default
        (tmp_path / f"{name}.json").write_text(json.dumps(c))
    ab = {k: base[k] for k in ("schema", "workload", "variant", "env", "mode")}
    ab.update(command="prefix-ab", change="prefix_split", rounds=5, speedup_p10_p90=[1.01, 1.2], speedup_median=1.1,
              rel_l2_with_vs_without=1e-4, median_ms={"without": 11.0, "with": 10.0},
              equivalence_with={"rel_l2": 2e-3, "passed": True})
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    check = {**json.loads(json.dumps(base)), "command": "check", "checks": []}  # timers, but not a bench file
    check["variant"]["label"] = "for_loop"
    (tmp_path / "chk.json").write_text(json.dumps(check))
    md = render([tmp_path / f"{n}.json" for n in ("a", "b", "c", "ab", "chk")], tmp_path / "r.md").read_text()
    summary = md.split("## Summary")[1].split("## Files")[0]
    assert sorted(line.rstrip(" |").rsplit("| ", 1)[1] for line in summary.splitlines()
                  if line.startswith("| tiny")) == ["a.json", "b.json", "c.json"]
    heads = [line for line in md.splitlines() if line.startswith("### bench: ")]
    assert heads == ["### bench: tiny on cpu", "### bench: tiny (batch 2) on cpu", "### bench: tiny on NVIDIA H200"]
    assert "## Engine changes, A/B in the whole call (change-ab)" in md and "Other results" not in md
    assert "### change A/B: prefix_split: tiny," in md
    assert "5 interleaved rounds in one process; speedup = without over with" in md and "(p10..p90 1.010..1.200)" in md


def test_files_of_one_name_are_named_below_the_folder_all_are_in(tmp_path):
    """The path below the deepest folder all of them are in, however deep each one lies."""
    from vlaperf.report.render import file_names

    paths = [str(tmp_path / "x" / "bench.json"), str(tmp_path / "x" / "sub" / "bench.json"), str(tmp_path / "x" / "a.json")]
    assert file_names(paths) == {paths[0]: "bench.json", paths[1]: "sub/bench.json", paths[2]: "a.json"}
    assert file_names(paths[:1] + paths[2:]) == {paths[0]: "bench.json", paths[2]: "a.json"}


def test_validate_result_requires_each_top_level_key_and_summary_field(tiny_results):
    """Every required key and every summary field, each missing alone, is named; a missing schema also says what
    it must be; timers without wall_ms is an error (only cuda_event_ms may be null); a problem is named once."""
    from vlaperf.report.schema import REQUIRED, SUMMARY_KEYS, SchemaError, validate_result

    good = json.loads((tiny_results / "bench.json").read_text())
    wall = good["timers"]["wall_ms"]
    assert REQUIRED == ("schema", "command", "workload", "env")
    for key in REQUIRED:
        with pytest.raises(SchemaError, match=re.escape(f"missing key {key!r}")):
            validate_result({k: v for k, v in good.items() if k != key})
    with pytest.raises(SchemaError, match=re.escape("schema must be 'vlaperf.result/1', got None")):
        validate_result({k: v for k, v in good.items() if k != "schema"})
    for key in ("count", "mean", "median", "p90", "p95", "p99", "min", "max", "std"):
        with pytest.raises(SchemaError, match=re.escape(f"timers.wall_ms: missing {key!r}")):
            validate_result({**good, "timers": {"wall_ms": {k: v for k, v in wall.items() if k != key}}})
    assert set(SUMMARY_KEYS) == set(wall)
    with pytest.raises(SchemaError, match=re.escape("timers.wall_ms: expected a summary object, got null")):
        validate_result({**good, "timers": {"cuda_event_ms": None}})
    with pytest.raises(SchemaError) as e:
        validate_result({**good, "timers": {"wall_ms": {**wall, "median": "fast"}, "cuda_event_ms": None}})
    assert str(e.value) == "invalid vlaperf result: timers.wall_ms.median: expected a number, got string"


def test_validate_result_checks_the_workload_shape_and_first_call_kind(tiny_results):
    from vlaperf.report.schema import SchemaError, validate_result

    good = json.loads((tiny_results / "bench.json").read_text())
    cases = [({**good, "workload": ["id", "overrides"]}, "workload: expected {'id': ..., 'overrides': {...}}"),
             ({**good, "workload": {"id": "tiny", "overrides": ["steps=3"]}},
              "workload.overrides: expected an object, got array"),
             ({**good, "first_call_s": True}, "first_call_s: expected a finite number of seconds >= 0 or null, got True")]
    for result, message in cases:
        with pytest.raises(SchemaError, match=re.escape(message)):
            validate_result(result)


def test_write_and_read_result_refuse_invalid_results_and_unwritable_names_a_folder(tiny_results, tmp_path):
    """write_result checks before it writes (nothing is left behind); read_result checks what it reads;
    unwritable names a folder given as the file."""
    from vlaperf.report.schema import SchemaError, read_result, unwritable, write_result

    good = json.loads((tiny_results / "bench.json").read_text())
    out = tmp_path / "new" / "r.json"
    with pytest.raises(SchemaError, match="command: expected a string, got number"):
        write_result({**good, "command": 5}, out)
    assert not out.exists()
    (tmp_path / "bad.json").write_text(json.dumps({**good, "env": None}))
    with pytest.raises(SchemaError, match="env: expected an object, got null"):
        read_result(tmp_path / "bad.json")
    assert unwritable(tmp_path) == f"{str(tmp_path)!r} is a folder"
    assert unwritable(tmp_path / "x" / "y.json") is None


# ----------------------------------------------------------------- second mutation round: HTML, plots, rare kinds


def _head(tiny_results, command: str, **fields) -> dict:
    """A result of `command` with bench.json's schema, workload, variant, mode and environment, plus `fields`."""
    r = json.loads((tiny_results / "bench.json").read_text())
    return {**{k: r[k] for k in ("schema", "workload", "variant", "mode", "env")}, "command": command, **fields}


def _write(path: Path, r: dict) -> Path:
    path.write_text(json.dumps(r))
    return path


def _md_rows(md: str, first: str) -> list[list[str]]:
    """The cells of the markdown table rows that start with the cell `first`."""
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in md.splitlines()
            if line.startswith(f"| {first} |")]


class _Tags:
    """An HTML report parsed: start and end tags with their attributes and the text of each element."""

    def __init__(self, text: str):
        from html.parser import HTMLParser

        self.starts, self.ends, self.texts = [], [], []  # texts: (tag, attrs, text of the innermost element)
        stack = []
        tags = self

        class Parser(HTMLParser):
            def handle_starttag(self, tag, attrs):
                tags.starts.append((tag, dict(attrs)))
                if tag not in ("meta", "img"):
                    stack.append([tag, dict(attrs), ""])

            def handle_endtag(self, tag):
                tags.ends.append(tag)
                if stack and stack[-1][0] == tag:
                    tags.texts.append(tuple(stack.pop()))

            def handle_data(self, data):
                if stack:
                    stack[-1][2] += data

        Parser().feed(text)

    def text(self, tag: str) -> list[str]:
        return [t for g, _, t in self.texts if g == tag]


def test_html_shows_strings_from_result_files_as_typed_and_opens_only_its_own_tags(tiny_results, tmp_path):
    """A workload id, a variant label, a file name, an environment value, a probe's names and the title come from
    users: in the HTML report each shows as typed, as text or inside a quoted attribute, and the only elements are
    the report's own (a label `<img onerror=...>` would otherwise run). The skipped file's line is a warning."""
    hostile = "o'w<b>1</b>&"
    r = _head(tiny_results, "bench", **{k: v for k, v in json.loads((tiny_results / "bench.json").read_text()).items()
                                        if k in ("timers", "samples", "first_call_s")})
    r["workload"]["id"] = hostile
    r["variant"]["label"] = "<i>v</i>"
    r["env"]["env_vars"] = {"X": "<u>v</u>"}
    bench = _write(tmp_path / "bench.json", r)
    probe = _write(tmp_path / "probe.json", _head(
        tiny_results, "prompt-len-probe", rounds=3, valid_prompt_tokens=6, ratio_to="prompt_<i>32</i>",
        median_ms={"prompt_16": 1.0, "prompt_<i>32</i>": 2.0}, prefix_rows={"prompt_16": 64, "prompt_<i>32</i>": 80},
        speedup_vs_base={"prompt_16": 2.0, "prompt_<i>32</i>": 1.0}, equivalence={}))
    bad = tmp_path / "bad<s>.json"
    bad.write_text("[1]")
    title = "<script>alert('t')</script>"
    text = render([bench, probe, bad], tmp_path / "r.html", title=title).read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</body></html>")
    tags = _Tags(text)
    own = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "thead", "tbody", "tr", "th",
           "td", "img"}
    assert {t for t, _ in tags.starts} <= own, {t for t, _ in tags.starts} - own
    for tag in own - {"meta", "img"}:  # every element closed
        assert [t for t, _ in tags.starts].count(tag) == tags.ends.count(tag), tag
    assert tags.text("title") == [title] and tags.text("h1") == [title]
    key = f"{hostile} on cpu"
    assert f"bench: {key}" in tags.text("h3")
    assert hostile in tags.text("td") and "<i>v</i>" in tags.text("td") and "<u>v</u>" in tags.text("td")
    assert "vs prompt_<i>32</i>" in tags.text("th") and "<i>32</i>" in tags.text("td")
    images = [a for t, a in tags.starts if t == "img"]
    assert {a["alt"] for a in images} >= {f"latency histograms {key}", f"latency CDF {key}"}
    assert all(set(a) == {"alt", "src"} and base64.b64decode(a["src"].split(",", 1)[1]).startswith(PNG)
               and a["src"].startswith("data:image/png;base64,") for a in images)
    warnings = [t for g, a, t in tags.texts if g == "p" and a.get("class") == "warn"]
    assert len(warnings) == 1 and warnings[0].startswith(f"skipped {bad}: ") and warnings[0].endswith("expected a JSON object, got array")
    notes = [t for g, a, t in tags.texts if g == "p" and a.get("class") == "note"]
    assert notes[0].startswith("generated ") and notes[0].endswith("from 2 result file(s); 1 skipped (listed below)")


def test_markdown_numbers_its_figures_and_keeps_notes_apart_from_warnings(tiny_results, tmp_path):
    """Figures are fig01.png, fig02.png, ... in "<name>_files/", linked in order with their alt text (brackets made
    round so that the link stays a link); notes are in italics, warnings and table rows are not."""
    r = json.loads((tiny_results / "bench.json").read_text())
    r["workload"]["id"] = "w[1]"
    bench = _write(tmp_path / "bench.json", r)
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    md = render([bench, tiny_results / "bd.json", bad], tmp_path / "r.md").read_text()
    links = re.findall(r"^!\[([^\]]*)\]\(([^)]+)\)$", md, re.M)
    assert [link for _, link in links] == [f"r_files/fig{i:02d}.png" for i in range(1, len(links) + 1)]
    assert sorted(p.name for p in (tmp_path / "r_files").iterdir()) == [f"fig{i:02d}.png" for i in range(1, len(links) + 1)]
    assert [alt for alt, _ in links] == ["latency histograms w(1) on cpu", "latency CDF w(1) on cpu", "stage breakdown"]
    assert re.search(r"^_generated \S+ from 2 result file\(s\); 1 skipped \(listed below\)_$", md, re.M)
    assert re.search(rf"^skipped {re.escape(str(bad))}: .*expected a JSON object, got array$", md, re.M)
    header = next(line for line in md.splitlines() if line.startswith("| # | file |"))
    assert md.split(header + "\n", 1)[1].splitlines()[0] == "|" + "|".join(["---"] * 9) + "|"


def _loadgen(tiny_results, backend: dict, passed: bool, phases) -> dict:
    def phase(clients, rps, p50, timed_out=False):
        return {"clients": clients, "expected": 10, "ok": 9, "lost": 1, "misrouted": 2, "timed_out": timed_out,
                "unsent": 3 if timed_out else 0, "requests_per_s": rps,
                "round_trip_ms": {"median": p50, "p95": 2 * p50, "p99": 3 * p50}, "server_infer_ms": {"median": p50 / 2},
                "batch_size": {"mean": 1.5, "max": 4.0}}

    return _head(tiny_results, "loadgen", mode="serve",
                 server={**backend, "levers_label": "for_loop", "max_batch": 4, "max_wait_ms": 5.0},
                 loadgen={"observations": "synthetic", "passed": passed, "phases": [phase(*p) for p in phases]})


def _compare(tiny_results, reduced: bool) -> dict:
    def eq(passed):
        return {"max_abs": 0.01, "rel_l2": 0.002, "worst_dim": 3, "tolerance": 0.03, "passed": passed}

    return _head(tiny_results, "compare", compare={
        "against": "lerobot", "lerobot_version": "0.6.1", "dtype": "float32", "reduced": reduced,
        "as_shipped": ["lerobot as shipped: its own note"], "equivalence": {"reference": eq(True), "best": eq(False)}},
        timing={"summary": {"lerobot": {"wall_ms_median": 30.0, "speedup_vs_lerobot_wall": 1.0},
                            "vlaperf reference": {"wall_ms_median": 20.0, "speedup_vs_lerobot_wall": 1.5},
                            "vlaperf best": {"wall_ms_median": 10.0, "speedup_vs_lerobot_wall": 3.0}}})


def test_sections_come_in_report_order_and_skips_reach_the_caller(tiny_results, tmp_path):
    """Summary, file table, a section per command in SECTIONS' order whatever the order of the files, a section for
    a command without a renderer, the environment last; the title; on_skip hears every skipped file."""
    from vlaperf.report.render import SECTIONS

    files = [_write(tmp_path / "lg.json", _loadgen(tiny_results, {}, True, [(1, 50.0, 20.0)])),
             _write(tmp_path / "cmp.json", _compare(tiny_results, True)),
             _write(tmp_path / "odd.json", _head(tiny_results, "foo", extra=1)),
             *[tiny_results / n for n in ("doc.json", "sy.json", "sc.json", "bd.json", "matrix.json", "bench.json")]]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    heard = []
    md = render([*files, bad], tmp_path / "r.md", title="my title", on_skip=heard.append, jobs=1).read_text()
    assert md.startswith("# my title\n")
    heads = re.findall(r"^## (.*)$", md, re.M)
    names = dict(SECTIONS)
    assert heads == ["Summary", "Files", names["bench"], names["matrix"], names["breakdown"], names["scaling"],
                     names["syncs"], names["doctor"], names["loadgen"], names["compare"], "Other results (foo)", "Environment"]
    assert f"_{tmp_path / 'odd.json'}: command 'foo' has no renderer; keys: command, env, extra, mode, schema, variant, workload_" in md
    assert len(heard) == 1 and heard[0].startswith(f"{bad}: not valid JSON: ") and f"\nskipped {heard[0]}\n" in md
    # the file table: number, name, command, workload, variant, mode, device, GPU state, timestamp
    r = json.loads((tiny_results / "bench.json").read_text())
    row = next(row for row in _md_rows(md, "9") if row[1] == "bench.json")
    assert row == ["9", "bench.json", "bench", "tiny", "reference", "model", "cpu", "-", r["env"]["timestamp"]]


def test_loadgen_tables_and_figure_per_server_run(tiny_results, tmp_path, figures):
    """Each server run: a heading naming its backend (two replicas on one GPU are on 1 GPU), passed or FAILED, a row
    per client count (lost + misrouted, the unsent at a time limit); one figure: requests/s and the round trip's
    median against the clients, a line per run, on a log-2 axis with the counts as ticks."""
    ray = _loadgen(tiny_results, {"backend": "ray-serve", "replicas": 2,
                                  "replica_devices": [{"gpu_uuid": "GPU-a"}, {"gpu_uuid": "GPU-a"}]}, False,
                   [(1, 50.0, 20.0), (4, 120.0, 33.0, True)])
    one = _loadgen(tiny_results, {}, True, [(1, 40.0, 25.0), (2, 70.0, 28.0)])
    md = render([_write(tmp_path / "lg_ray.json", ray), _write(tmp_path / "lg_one.json", one)], tmp_path / "r.md").read_text()
    assert "### loadgen: tiny, Ray Serve, 2 replica(s) on 1 GPU(s) (lg_ray), levers for_loop on cpu" in md
    assert "### loadgen: tiny, in-process engine (lg_one), levers for_loop on cpu" in md
    assert "(lg_ray), levers for_loop on cpu\n\n_max batch 4, max wait 5.0 ms; synthetic; FAILED_" in md
    assert "(lg_one), levers for_loop on cpu\n\n_max batch 4, max wait 5.0 ms; synthetic; passed_" in md
    assert ["4", "9 / 10 (time limit: 3 unsent)", "3", "120.0", "33.000", "66.000", "99.000", "16.500", "1.500"] in _md_rows(md, "4")
    assert ["1", "9 / 10", "3", "50.000", "20.000", "40.000", "60.000", "10.000", "1.500"] in _md_rows(md, "1")
    (fig,) = [f for a, f in figures if a == "server throughput and latency against clients"]
    rps, rt = fig.axes[:2]
    assert [(list(line.get_xdata()), list(line.get_ydata())) for line in rps.lines] == [([1, 4], [50.0, 120.0]),
                                                                                     ([1, 2], [40.0, 70.0])]
    assert [list(line.get_ydata()) for line in rt.lines] == [[20.0, 33.0], [25.0, 28.0]]
    for ax, ylabel in ((rps, "requests / s"), (rt, "round trip p50 ms")):
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2 and list(ax.get_xticks()) == [1, 2, 4]
        assert ax.get_ylabel() == ylabel and ax.get_xlabel() == "closed-loop clients"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "Ray Serve, 2 replica(s) on 1 GPU(s) (lg_ray)", "in-process engine (lg_one)"]


def test_compare_tables_and_bars_name_each_side(tiny_results, tmp_path, figures):
    """A compare file: its heading says reduced or full size, each equivalence passed yes/NO, the peer's notes; bars
    in the summary's order from the top, vlaperf's blue and the peer's grey."""
    from matplotlib.colors import to_rgba

    files = [_write(tmp_path / "cmp_r.json", _compare(tiny_results, True)),
             _write(tmp_path / "cmp_f.json", _compare(tiny_results, False))]
    md = render(files, tmp_path / "r.md").read_text()
    assert re.findall(r"^### compare: .*$", md, re.M) == ["### compare: tiny vs lerobot 0.6.1 (float32, reduced, cpu)",
                                                         "### compare: tiny vs lerobot 0.6.1 (float32, full size, cpu)"]
    assert "_lerobot as shipped: its own note_" in md
    unknown = _compare(tiny_results, True)
    unknown["compare"]["lerobot_version"] = None  # the CLI writes null where no LeRobot version could be read
    md = render([_write(tmp_path / "cmp_u.json", unknown)], tmp_path / "u.md").read_text()
    assert re.findall(r"^### compare: .*$", md, re.M) == ["### compare: tiny vs lerobot (version unknown) (float32, "
                                                         "reduced, cpu)"]
    openpi = _compare(tiny_results, True)
    openpi["compare"]["against"] = "openpi"
    del openpi["compare"]["lerobot_version"]  # an openpi compare names no version
    md = render([_write(tmp_path / "cmp_o.json", openpi)], tmp_path / "o.md").read_text()
    assert re.findall(r"^### compare: .*$", md, re.M) == ["### compare: tiny vs openpi (float32, reduced, cpu)"]
    assert "LeRobot compiled" not in md
    # a LeRobot compiled row whose actions failed their check against eager is said to time another computation
    failed = _compare(tiny_results, True)
    failed["timing"]["lerobot_compile"] = {"mode": "default", "compile_s": 30.0, "vs_eager": {
        "max_abs": 0.4, "rel_l2": 0.2, "worst_dim": 1, "tolerance": 1e-4, "passed": False}}
    md = " ".join(render([_write(tmp_path / "cmp_f.json", failed)], tmp_path / "f.md").read_text().split())
    assert "LeRobot compiled (default) is NOT equivalent to LeRobot eager: rel L2 2.00e-01 > 1e-04" in md
    md = render(files, tmp_path / "r.md").read_text()
    assert _md_rows(md, "reference")[0] == ["reference", cell(0.01), cell(0.002), "3", cell(0.03), "yes"]
    assert _md_rows(md, "best")[0][-1] == "NO"
    assert _md_rows(md, "vlaperf best")[0] == ["vlaperf best", "10.000", "-", "3.000", "-"]
    fig = [f for a, f in figures if a == "comparison with the peer"][0]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["vlaperf best", "vlaperf reference", "lerobot"]
    assert [p.get_width() for p in ax.patches] == [10.0, 20.0, 30.0]
    assert [p.get_facecolor() for p in ax.patches] == [to_rgba("#1f77b4"), to_rgba("#1f77b4"), to_rgba("#7f7f7f")]


def test_compare_with_lerobots_policy_accelerated_says_what_each_row_is(tiny_results, tmp_path):
    r = _compare(tiny_results, True)
    r["timing"]["summary"]["vlaperf_in_lerobot_predict"] = {"wall_ms_median": 11.0, "speedup_vs_lerobot_wall": 2.7}
    check = {"rel_l2": 2e-6, "passed": True}
    r["timing"]["accelerated"] = {"levers": "for_loop+sdpa", "checks": [check], "first_call_s": {
        "lerobot_predict": 0.5, "vlaperf_in_lerobot_predict": 1.25}, "vs_lerobot_predict": {"rel_l2": 3e-6, "passed": True}}
    md = render([_write(tmp_path / "cmp.json", r)], tmp_path / "r.md").read_text()
    assert _md_rows(md, "vlaperf_in_lerobot_predict")[0] == ["vlaperf_in_lerobot_predict", "11.000", "-", "2.700", "-"]
    assert ("vlaperf_in_lerobot_predict: the same call with vlaperf (for_loop+sdpa) installed in the policy by "
            "accelerate_lerobot, rel L2 3.00e-06 from LeRobot's own (passed); its check against LeRobot on the first "
            "call: rel L2 2.00e-06 (passed); first call 1.25 s, the check included.") in md
    assert "real-time chunking" not in md
    r["timing"]["accelerated"]["rtc"] = {"schedule": "LINEAR", "max_guidance_weight": 10.0, "execution_horizon": 10,
                                         "leftover_len": 25, "inference_delay": 3, "guidance_moves": 0.31,
                                         "vs_lerobot_predict_rtc": {"rel_l2": 6e-3, "passed": True, "tolerance": 3e-2}}
    md = render([_write(tmp_path / "cmp.json", r)], tmp_path / "r.md").read_text()
    assert ("the same two calls with LeRobot's real-time chunking on (LINEAR schedule, max guidance weight 10, "
            "execution horizon 10) with a 25-action leftover of the previous chunk given with delay 3: rel L2 6.00e-03 "
            "from LeRobot's own guided call (passed, tolerance 3e-02); the guidance moved LeRobot's chunk by rel L2 "
            "3.10e-01.") in md


def test_compare_with_a_refused_accelerated_row_says_why_it_is_missing(tiny_results, tmp_path):
    """`time_lerobot` records the accelerator's refusal (timing.accelerated.refused) instead of ending the command
    without a file: the report says which row is missing and the check's numbers; a null rel L2 (not finite) reads
    as nan, not as a crash."""
    r = _compare(tiny_results, True)
    r["timing"]["summary"]["lerobot_predict"] = {"wall_ms_median": 29.0, "speedup_vs_lerobot_wall": 1.03}
    check = {"batch": 1, "images_valid": [True, True, False], "prompt_len": 6, "num_steps": 4, "guided": False,
             "max_abs": 1.0, "rel_l2": None, "tolerance": 1e-4, "passed": False}
    r["timing"]["accelerated"] = {"levers": "for_loop+sdpa", "checks": [check],
                                  "first_call_s": {"lerobot_predict": 0.5},
                                  "vs_lerobot_core": {"rel_l2": 0.0, "passed": True},
                                  "refused": {"row": "vlaperf_in_lerobot_predict", "message": "not equivalent",
                                              "check": check}}
    md = " ".join(render([_write(tmp_path / "cmp.json", r)], tmp_path / "r.md").read_text().split())
    assert "skipped" not in md
    assert ("installed in the policy by accelerate_lerobot, not compared (refused, below); its check against LeRobot "
            "on the first call: rel L2 nan (FAILED).") in md
    assert ("vlaperf_in_lerobot_predict NOT timed: the accelerator's check against LeRobot's sample_actions refused to "
            "answer on its first call (batch 1, cameras [True, True, False], prompt 6 tokens, 4 steps): rel L2 nan > "
            "tolerance 1e-04 (max abs 1.00e+00); the other rows were timed.") in md
    # the guided row refused after the plain ones passed: the RTC sentence says its distance was not measured
    r["timing"]["accelerated"].update(vs_lerobot_predict={"rel_l2": 3e-6, "passed": True}, rtc={
        "schedule": "LINEAR", "max_guidance_weight": 10.0, "execution_horizon": 10, "leftover_len": 25,
        "inference_delay": 3, "guidance_moves": 0.31})
    r["timing"]["accelerated"]["refused"] = {"row": "vlaperf_in_lerobot_predict_rtc", "message": "not equivalent",
                                             "check": None}
    md = " ".join(render([_write(tmp_path / "cmp.json", r)], tmp_path / "r.md").read_text().split())
    assert ("given with delay 3: vlaperf's guided call refused by the accelerator's check, so not compared; the "
            "guidance moved LeRobot's chunk by rel L2 3.10e-01.") in md
    assert ("vlaperf_in_lerobot_predict_rtc not timed: the accelerator refused to answer: not equivalent.") in md


@pytest.mark.parametrize("refused, reason", [
    ("x", "expected an object or null, got string"),
    ({"row": "vlaperf_in_lerobot_predict"}, "message: expected a string, got null"),
    ({"row": "r", "message": "m", "check": {"rel_l2": "big", "tolerance": 1e-4}},
     "check.rel_l2: expected a number or null"),
    ({"row": "r", "message": "m", "check": {"rel_l2": 0.5}}, "check.tolerance: expected a number, got null"),
])
def test_a_compare_file_with_a_damaged_refusal_is_skipped_naming_it(tiny_results, tmp_path, refused, reason):
    r = _compare(tiny_results, True)
    r["timing"]["accelerated"] = {"levers": "best", "checks": [], "first_call_s": {}, "refused": refused}
    md = render([_write(tmp_path / "cmp.json", r), tiny_results / "bench.json"], tmp_path / "r.md").read_text()
    [skipped] = [line for line in md.splitlines() if line.startswith("skipped ")]
    assert f"compare: timing.accelerated.refused: {reason}" in skipped, skipped


def test_bench_table_rows_are_the_files_summaries(tiny_results, tmp_path):
    """A bench row: file, variant [mode], timer, then the timer's summary in the header's order and the file's first
    call; a file without raw samples keeps its row and draws no figure; groups by workload and device."""
    r = json.loads((tiny_results / "bench.json").read_text())
    r["first_call_s"], r["warmup_s"] = 1.25, 7.5
    a = _write(tmp_path / "a.json", r)
    r2 = json.loads(json.dumps(r))
    r2["samples"]["wall_ms"] = None
    r2["env"]["gpu"], r2["variant"]["dtype"] = "NVIDIA H200", "bfloat16"
    b = _write(tmp_path / "b.json", r2)
    md = render([a, b], tmp_path / "r.md").read_text()
    s = r["timers"]["wall_ms"]
    (row,) = _md_rows(md, "a")
    assert row[:12] == ["a", "reference [model]", "wall_ms"] + [cell(float(s[k])) for k in (
        "median", "p90", "p95", "p99", "min", "max", "mean")] + [str(s["count"]), "1.250"]
    assert _md_rows(md, "b")[0][:3] == ["b", "reference [model]", "wall_ms"] and "skipped" not in md
    assert re.findall(r"^### bench: .*$", md, re.M) == ["### bench: tiny on cpu", "### bench: tiny on NVIDIA H200"]
    assert re.findall(r"^!\[(latency [^\]]*)\]", md, re.M) == ["latency histograms tiny on cpu", "latency CDF tiny on cpu"]


def test_histograms_bins_panels_and_images(tiny_results, tmp_path, figures, monkeypatch):
    """min(40, max(8, samples // 3)) bins a panel; one panel a file, as many columns as files up to HIST_COLS, the
    panels titled with file, variant [mode] and median; past HIST_PANELS files a further image that says which
    panels it holds and keeps counting the colours."""
    from matplotlib.colors import to_rgba

    from vlaperf.report import render as mod

    monkeypatch.setattr(mod, "HIST_PANELS", 2)
    base = json.loads((tiny_results / "bench.json").read_text())
    files = []
    for name, n in (("n5", 5), ("n60", 60), ("n150", 150)):
        c = json.loads(json.dumps(base))
        c["samples"]["wall_ms"] = [1.0 + k / n for k in range(n)]
        files.append(_write(tmp_path / f"{name}.json", c))
    render(files[:2], tmp_path / "two.md")
    (fig,) = [f for a, f in figures if a.startswith("latency histograms")]
    assert [a for a, _ in figures if a.startswith("latency histograms")] == ["latency histograms tiny on cpu"]
    assert fig.get_size_inches()[0] == pytest.approx(3.7 * 2 + 0.3) and len(fig.axes) == 2
    assert [len(ax.patches) for ax in fig.axes] == [8, 20]
    assert fig.axes[0].get_title().split("\n")[1] == "reference [model]"
    assert all(ax.get_xlabel() == "wall ms per call" for ax in fig.axes)
    figures.clear()
    render(files, tmp_path / "three.md")
    hists = [(a, f) for a, f in figures if a.startswith("latency histograms")]
    assert [a for a, _ in hists] == ["latency histograms tiny on cpu (panels 1-2 of 3)",
                                     "latency histograms tiny on cpu (panels 3-3 of 3)"]
    third = hists[1][1].axes[0]
    assert len(third.patches) == 40 and third.patches[0].get_facecolor() == to_rgba(mod.COLORS[2], 0.85)


def test_bench_cdf_lines_are_each_files_sorted_samples(tiny_results, tmp_path, figures):
    """The CDF: per file its sorted wall-clock samples at (k+1)/n, solid, and its CUDA-event samples dotted, fastest
    file first; only the wall-clock lines in the legend ("file, median"); a log axis labelled in plain ms once the
    samples span more than 4x, a linear one below that."""
    base = json.loads((tiny_results / "bench.json").read_text())
    fast, slow = json.loads(json.dumps(base)), json.loads(json.dumps(base))
    fast["samples"] = {"wall_ms": [3.0, 1.0, 2.0, 4.0], "cuda_event_ms": [2.5, 1.25, 1.5, 3.5]}
    fast["timers"]["wall_ms"]["median"] = 2.5
    fast["timers"]["cuda_event_ms"] = dict(fast["timers"]["wall_ms"])
    slow["samples"] = {"wall_ms": [30.0, 10.0, 20.0], "cuda_event_ms": None}
    slow["timers"]["wall_ms"]["median"] = 20.0
    files = [_write(tmp_path / "slow.json", slow), _write(tmp_path / "fast.json", fast)]
    render(files, tmp_path / "r.md")
    (fig,) = [f for a, f in figures if a == "latency CDF tiny on cpu"]
    ax = fig.axes[0]
    lines = [(list(ln.get_xdata()), list(ln.get_ydata()), ln.get_linestyle()) for ln in ax.lines]
    assert lines == [([1.0, 2.0, 3.0, 4.0], [0.25, 0.5, 0.75, 1.0], "-"), ([1.25, 1.5, 2.5, 3.5], [0.25, 0.5, 0.75, 1.0], ":"),
                     ([10.0, 20.0, 30.0], [1 / 3, 2 / 3, 1.0], "-")]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["fast, 2.500 ms", "slow, 20.000 ms"]
    assert legend.get_title().get_text() == "file, median"
    assert ax.get_xlabel() == "ms per call" and ax.get_ylabel() == "fraction of calls"
    assert ax.get_xscale() == "log"  # 1 .. 30 ms
    major, minor = ax.xaxis.get_major_formatter(), ax.xaxis.get_minor_formatter()
    assert major(10.0, 0) == "10" and [minor(v, 0) for v in (20.0, 30.0, 50.0, 0.2)] == ["20", "", "50", "0.2"]
    figures.clear()
    render(files[:1], tmp_path / "one.md")  # 10 .. 30 ms: 3x
    (fig,) = [f for a, f in figures if a.startswith("latency CDF")]
    assert fig.axes[0].get_xscale() == "linear"


def test_many_files_cdf_colours_by_median_rank(tiny_results, tmp_path, figures, monkeypatch):
    """Past CDF_LEGEND files the line colour is the file's median rank (fastest darkest), whatever their order."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    from vlaperf.report import render as mod

    monkeypatch.setattr(mod, "CDF_LEGEND", 2)
    files = _bench_copies(tiny_results, tmp_path, 3)  # bench_run00 fastest
    render(files[::-1], tmp_path / "r.md")
    (fig,) = [f for a, f in figures if a.startswith("latency CDF")]
    ax = fig.axes[0]
    assert ax.get_legend().get_title().get_text() == "2 of 3 files, fast to slow"
    assert [to_rgba(ln.get_color()) for ln in ax.lines] == [colormaps["viridis"](0.9 * k / 2) for k in range(3)]
    figures.clear()
    render(files[:2], tmp_path / "two.md")  # CDF_LEGEND files: a colour of its own each
    (fig,) = [f for a, f in figures if a.startswith("latency CDF")]
    assert [ln.get_color() for ln in fig.axes[0].lines] == mod.COLORS[:2]


def _matrix(tiny_results) -> dict:
    """tiny's matrix file with a row of each kind: a lever whose gain is noise, a compile lever, an old row without
    levers, one that was skipped."""
    m = json.loads((tiny_results / "matrix.json").read_text())
    ref, loop, best = m["variants"]
    del ref["levers"]  # an older file: levers from the variant's name
    loop["ratio"]["wall_ms"].update(speedup=1.25, ratio_p10=0.95, ratio_p90=1.5, significant=False)
    loop["peak_memory_bytes"] = 3 * 2**30
    best["levers"] = best["levers"] + ["compile=default"]
    best["ratio"]["wall_ms"].update(speedup=2.0, ratio_p10=1.75, ratio_p90=2.25, significant=True)
    best["timers"]["cuda_event_ms"] = {**best["timers"]["wall_ms"], "median": 3.25}
    m["variants"].append({"variant": "cuda_graph", "skipped": "needs a GPU"})
    return m


def test_matrix_peak_note_says_what_the_files_peak_covers(tiny_results, tmp_path):
    """From session 62 a matrix row's peak covers its first call (compile, capture) and warm-up (`peak_memory_over`);
    before, the peak was reset after the first call, and the note claimed the first call for those files too."""
    m = _matrix(tiny_results)
    md = render([_write(tmp_path / "m.json", m)], tmp_path / "r.md").read_text()
    assert "_process peak GiB: the allocator's peak over a variant's first call (compile, capture) and warm-up" in md
    old = {k: v for k, v in m.items() if k != "peak_memory_over"}
    old_md = render([_write(tmp_path / "old.json", old)], tmp_path / "old.md").read_text()
    assert "_process peak GiB: the allocator's peak over a variant's warm-up calls, after its first call" in old_md


def test_matrix_table_heatmap_and_cdf(tiny_results, tmp_path, figures):
    """The matrix's rows (speedup, '(noise)' where p10..p90 includes 1, the spread low..high, the event median, the
    levers or '-', a skipped row as wide as the others), its heatmap (a column per lever in the levers' order, compile
    levers as 'compile', the speed-up where a variant uses the lever and in the last column) and its CDF from the
    summary percentiles, which it says."""
    import numpy as np

    m = _matrix(tiny_results)
    md = render([_write(tmp_path / "m.json", m)], tmp_path / "r.md").read_text()
    assert re.search(r"^### matrix: tiny on cpu, model mode \(", md, re.M)  # the mode its calls were timed in
    rows = {r[0]: r for r in _md_rows(md, "reference") + _md_rows(md, "for_loop") + _md_rows(md, "cuda_graph")}
    best = _md_rows(md, "best")[0]
    assert rows["reference"][4:6] == ["1.00x", "1.00..1.00"] and rows["reference"][-1] == "-"
    assert rows["for_loop"][4:6] == ["1.25x (noise)", "0.95..1.50"] and rows["for_loop"][8] == "3.000"
    assert "_process peak GiB: the allocator's peak over a variant's first call (compile, capture) and warm-up" in md
    assert best[3:6] == ["3.250", "2.00x", "1.75..2.25"]
    assert rows["cuda_graph"] == ["cuda_graph", "needs a GPU"] + ["-"] * 8
    (heat,) = [f for a, f in figures if a == "matrix speedup heatmap"]
    ax = heat.axes[0]
    levers = ["for_loop", "skip_masked_images", "trim_prompt_padding", "static_kv_cache", "sdpa", "fuse_projections", "compile"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["loop", "skipimg", "trim", "kv", "sdpa", "fuse", "compile",
                                                            "speedup"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["reference", "for_loop", "best"]
    nan = float("nan")
    grid = np.ma.filled(ax.images[0].get_array(), nan)
    np.testing.assert_equal(grid, [[nan] * len(levers) + [1.0], [1.25] + [nan] * 6 + [1.25], [2.0] * 8])
    assert sorted(t.get_text() for t in ax.texts) == ["1.00x", "1.25x", "1.25x"] + ["2.00x"] * 8
    (cdf,) = [f for a, f in figures if a == "matrix latency CDF"]
    ax = cdf.axes[0]
    assert "drawn from the summary percentiles" in ax.get_title()
    assert "_The latency CDFs below are drawn from each variant's summary percentiles" in md
    for line, v in zip(ax.lines, m["variants"]):
        s = v["timers"]["wall_ms"]
        assert list(line.get_xdata()) == [s[k] for k in ("min", "median", "p90", "p95", "p99", "max")]
        assert list(line.get_ydata()) == [0.0, 0.5, 0.9, 0.95, 0.99, 1.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reference", "for_loop", "best"]
    policy = render([_write(tmp_path / "p.json", dict(m, mode="policy"))], tmp_path / "p.md").read_text()
    assert re.search(r"^### matrix: tiny on cpu, policy mode \(", policy, re.M)


def test_matrix_cdf_of_raw_samples_and_world_action_rows(tiny_results, tmp_path, figures):
    """Rows with raw samples: a step CDF at (k+1)/n, no percentile note, a log axis past 4x. World-action matrices:
    a row per variant and sparsity, the ratio under `vs_reference`."""
    m = json.loads((tiny_results / "matrix.json").read_text())
    for i, v in enumerate(m["variants"]):
        v["samples"] = {"wall_ms": [1.0 + 2 * i, 2.0 + 2 * i]}
        v["sparsity"] = "dense" if i == 0 else "sparse"
        v["vs_reference"] = v.pop("ratio")["wall_ms"]
    md = render([_write(tmp_path / "m.json", m)], tmp_path / "r.md").read_text()
    assert "summary percentiles" not in md
    assert _md_rows(md, "for_loop \\| sparse")[0][4].startswith(f"{m['variants'][1]['vs_reference']['speedup']:.2f}x")
    (cdf,) = [f for a, f in figures if a == "matrix latency CDF"]
    ax = cdf.axes[0]
    assert [list(ln.get_ydata()) for ln in ax.lines] == [[0.5, 1.0]] * 3 and list(ax.lines[2].get_xdata()) == [5.0, 6.0]
    assert ax.get_xscale() == "log" and "summary percentiles" not in ax.get_title()


def test_check_breakdown_scaling_syncs_and_doctor_sections(tiny_results, tmp_path, figures):
    """The rarer per-file sections say what their files hold: a check row per variant (and sparsity) with the video
    error and yes/NO; a breakdown's notes, a staged sequence that differs from the untimed call as a warning, masked
    slots, per-occurrence times, and its bars (stage order from the top, median with a p95 whisker, grey for the
    unmarked rest, red only for a masked image slot); the T(N) fit and points; the syncs expected and hidden; the
    doctor's cost column with its note (how the cost was found) and an environment-only run."""
    from matplotlib.colors import to_rgba

    from vlaperf.report.document import md_cell

    check = _head(tiny_results, "check", checks=[
        {"variant": "for_loop", "dtype": "float32", "max_abs": 1e-3, "rel_l2": 2e-3, "video_rel_l2": None,
         "tolerance": 1e-2, "seeds": 2, "passed": True},
        {"variant": "best", "sparsity": "sparse", "dtype": "float32", "max_abs": 0.5, "rel_l2": 0.25, "video_rel_l2": 0.125,
         "tolerance": 1e-2, "seeds": 2, "passed": False}])
    bd = json.loads((tiny_results / "bd.json").read_text())
    bd["breakdown"]["matches_reference"] = {"exact": False, "max_abs": 0.5}
    bd["breakdown"]["stages"][0].pop("info")  # an image slot the file says nothing about: not called masked
    sy = json.loads((tiny_results / "sy.json").read_text())
    sy["syncs"].update(expected_per_call=1, hidden_per_call=0)
    doc = json.loads((tiny_results / "doc.json").read_text())
    doc["findings"][0].update(cost=1.5, cost_note="measured: one thing - another")
    doc["findings"][1].update(cost=None, cost_note=None)
    env_only = json.loads(json.dumps(doc))
    env_only["workload"]["id"] = None
    files = [_write(tmp_path / n, r) for n, r in (("chk.json", check), ("bd.json", bd), ("sy.json", sy),
                                                   ("doc.json", doc), ("env.json", env_only))]
    md = render([*files, tiny_results / "sc.json"], tmp_path / "r.md").read_text()
    assert "\n### scaling: tiny on cpu, model mode\n" in md  # the mode its points were timed in
    assert _md_rows(md, "for_loop")[0] == ["for_loop", "float32", cell(1e-3), cell(2e-3), "-", cell(1e-2), "2", "yes"]
    assert _md_rows(md, "best \\| sparse")[0] == ["best \\| sparse", "float32", cell(0.5), cell(0.25), cell(0.125),
                                                 cell(1e-2), "2", "NO"]
    b = bd["breakdown"]
    assert f"_note: {b['notes'][0]}_" in md and "\nthe staged sequence differs from the untimed call (max abs 0.5)\n" in md
    stages = {e["name"]: e for e in b["stages"]}
    assert _md_rows(md, "image_2_embed")[0][-1] == "16 tokens, mask MASKED" and _md_rows(md, "image_1_embed")[0][-1] == "16 tokens, mask valid"
    step = stages["denoise_step"]
    assert _md_rows(md, "denoise_step")[0][5:8] == [str(step["per_call"]), cell(step["occurrence"]["mean_ms"]),
                                                    cell(step["occurrence"]["max_ms"])]
    (fig,) = [f for a, f in figures if a == "stage breakdown"]
    ax = fig.axes[0]
    names = [e["name"] for e in b["stages"]][::-1]
    assert [t.get_text() for t in ax.get_yticklabels()] == names
    assert [p.get_width() for p in ax.patches] == [stages[n]["median_ms"] for n in names]
    red, grey, blue = to_rgba("#d62728"), to_rgba("#bbbbbb"), to_rgba("#1f77b4")
    assert [p.get_facecolor() for p in ax.patches] == [
        grey if n == "(unmarked)" else red if n == "image_2_embed" else blue for n in names]
    (whiskers,) = [c for c in ax.collections if len(c.get_segments()) == len(names)]
    assert [x for seg in whiskers.get_segments() for x in (seg[0][0], seg[1][0])] == pytest.approx(
        [x for n in names for x in (stages[n]["median_ms"], max(stages[n]["p95_ms"], stages[n]["median_ms"]))])
    assert ax.get_xlabel() == f"ms per call (median, whisker p95; {b['timer']})"
    sc = json.loads((tiny_results / "sc.json").read_text())["scaling"]
    for s in sc["series"]:
        f = s["fit"]
        assert [row for row in _md_rows(md, s["label"]) if len(row) == 4 + len(s["points"])][0] == [s["label"]] + [cell(float(x)) for x in (f["intercept"], f["slope"], f["r2"])] + [
            cell(float(p["median_ms"])) for p in s["points"]]
    assert "| variant | intercept a ms | slope b ms/step | r2 | " + " | ".join(
        f"T({p['steps']}) median ms" for p in sc["series"][0]["points"]) + " |" in md  # medians, said so
    (fig,) = [f for a, f in figures if a == "T(N) fit"]
    assert fig.axes[0].get_title() == "T(N) = a + b*N, tiny"
    assert "\n5 host syncs per call (host_read, 2 calls); 1 expected (reading the actions), 0 hidden\n" in md
    assert f"_{sy['syncs']['note']}_" in md
    site = sy["syncs"]["sites"][0]
    assert f"| 5.000 | {site['location']} | {site['op']} |" in md
    assert "### doctor: tiny on cpu" in md and "### doctor: environment on cpu" in md
    f0 = doc["findings"][0]
    assert _md_rows(md, f0["severity"])[0][:6] == [f0["severity"], f0["id"], md_cell(f0["title"]), "1.500",
                                                   "measured: one thing - another", md_cell(f0["fix"])]
    f1 = doc["findings"][1]  # no cost and no note: both cells "-"
    assert [row for row in _md_rows(md, f1["severity"]) if row[1] == f1["id"]][0][3:5] == ["-", "-"]
    assert "| severity | id | finding | cost ms | cost note | fix | detail |" in md


def test_rollout_stops_and_errors_are_warnings(tiny_results, tmp_path):
    """A rollout that hit its time limit, had errors or lost its server says so in a warning; the heading names the
    server's device; an episode without an ideal time leaves the total's ideal empty."""
    r = _rollout_result(tiny_results)
    r["server"]["device"] = "cuda:1"
    r["rollout"].update(timed_out=True, errors=2, connection_lost="server closed the connection")
    del r["rollout"]["per_episode"][1]["ideal_wall_s"]
    text = render([_write(tmp_path / "ro.json", r)], tmp_path / "r.html").read_text()
    tags = _Tags(text)
    assert "rollout: tiny, levers loop+sdpa on cuda:1" in tags.text("h3")
    (warning,) = [t for g, a, t in tags.texts if g == "p" and a.get("class") == "warn"]
    assert warning == ("total 4.108 s, 4.9% of it waiting for the policy; 1 overrun steps; 2 errors; the server's model "
                       "call p50 10.000 ms; stopped at the time limit; stopped: server closed the connection")
    cells = tags.text("td")
    i = cells.index("all")
    assert cells[i:i + 6] == ["all", "40", "8", "4.108", "-", "0.2"]
    r["rollout"].update(timed_out=False, errors=0, connection_lost=None)
    text = render([_write(tmp_path / "ro.json", r)], tmp_path / "r.html").read_text()
    assert not [t for g, a, t in _Tags(text).texts if g == "p" and a.get("class") == "warn"]


def test_environment_keeps_first_seen_key_order_and_leaves_out_the_moment(tiny_results, tmp_path):
    """The environment tables list keys in the order the files have them (the timestamp and GPU state are in the
    file table, not here; the load average, of the moment too, in neither)."""
    r = json.loads((tiny_results / "bench.json").read_text())
    assert "load_avg" in r["env"]
    # no recorded variables (a GPU machine's CUDA_VISIBLE_DEVICES would be in the file): else their keys are rows too
    r["env"]["env_vars"] = {}
    files = []
    for i in range(2):
        r["env"]["timestamp"] = f"2026-12-0{i + 1}T10:00:00+00:00"
        files.append(_write(tmp_path / f"b{i}.json", r))
    md = render(files, tmp_path / "r.md").read_text()
    env = md[md.index("## Environment"):]
    keys = [line.split(" | ")[0][2:] for line in env.splitlines() if line.startswith("| ") and not line.startswith("| key")]
    # an object's keys are rows of their own (cpu_power on a Linux machine)
    expected = [k2 for k, v in r["env"].items() if k not in ("timestamp", "gpu_state", "load_avg")
                for k2 in ([f"{k}.{sub}" for sub in v] if isinstance(v, dict) and v else [k])]
    assert keys == expected
    assert "timestamp" not in env and "load_avg" not in env and "different between files" not in env


def test_summary_bar_chart_shows_each_variants_speed_up(tiny_results, tmp_path, figures):
    """The summary's bars: the reference's median over each variant's, slowest on top, each bar labelled with its
    speed-up and median; a forward-mode file makes no action chunk; modes are groups of their own."""
    from vlaperf.report.render import result_batch

    base = json.loads((tiny_results / "bench.json").read_text())

    def bench(name, levers, median, mode="model"):
        c = json.loads(json.dumps(base))
        c["variant"].update({"levers": levers, "label": ",".join(levers) or "reference"})
        c["timers"]["wall_ms"]["median"] = median
        c["mode"] = mode
        return _write(tmp_path / f"{name}.json", c)

    files = [bench("ref", [], 100.0), bench("loop", ["for_loop"], 40.0), bench("sdpa", ["for_loop", "sdpa"], 20.0),
             bench("fwd", [], 10.0, mode="forward")]
    md = render(files, tmp_path / "r.md").read_text()
    summary = md.split("## Summary")[1].split("## Files")[0]
    assert _md_rows(summary, "tiny on cpu, forward mode")[0][4:7] == ["1.00x", "-", "-"]
    assert _md_rows(summary, "tiny on cpu, model mode")[0][6] == cell(1e3 * result_batch(base) / 100.0)
    (fig,) = [f for a, f in figures if a == "speed-up over the reference, tiny on cpu, model mode"]
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [1.0, 2.5, 5.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["reference", "for_loop", "loop+sdpa"]
    assert ax.yaxis_inverted() and ax.get_xlim() == pytest.approx((0, 5.0 * 1.3))
    assert [t.get_text() for t in ax.texts] == [" 1.0x (100.0 ms)", " 2.5x (40.000 ms)", " 5.0x (20.000 ms)"]
    assert ax.get_xlabel() == "speed-up over the reference (median over median)"
    assert ax.get_title() == "tiny on cpu, model mode: newest bench file of each variant"


def test_markdown_figure_links_work_whatever_the_reports_name(tiny_results, tmp_path):
    """`-o "my report (1).md"`: the figures' folder has a space and parentheses in its name; its links are URL-encoded
    so that a CommonMark viewer shows the images (a raw space ended the link: the page showed the markdown text)."""
    from urllib.parse import unquote

    markdown_it = pytest.importorskip("markdown_it")
    out = render([tiny_results / "bench.json"], tmp_path / "my report (1).md")
    tokens = markdown_it.MarkdownIt("commonmark").parse(out.read_text())
    images = [c for t in tokens for c in (t.children or []) if c.type == "image"]
    figures = sorted((tmp_path / "my report (1)_files").iterdir())
    assert len(images) == len(figures) == 2
    assert [out.parent / unquote(i.attrs["src"]) for i in images] == figures


def test_a_markdown_report_written_again_removes_its_earlier_three_digit_figures(tiny_results, tmp_path):
    """docs/report/h200.md has 180 figures, fig01.png to fig180.png: written again with fewer, the clean-up (two digits
    only) left fig100.png and up of the last run beside the new report. Files the report does not write stay."""
    files = tmp_path / "r_files"
    files.mkdir()
    for name in ("fig99.png", "fig100.png", "fig180.png", "fig1.png", "figure.png", "fig01_notes.png"):  # as left there
        (files / name).write_bytes(PNG)
    render([tiny_results / "sc.json"], tmp_path / "r.md")  # one figure
    assert sorted(p.name for p in files.iterdir()) == ["fig01.png", "fig01_notes.png", "fig1.png", "figure.png"]


def test_keep_warm_wait_words_count_the_calls_that_met_a_run_and_say_nothing_without_keep_warm():
    from vlaperf.report.render import keep_warm_wait_words

    wait = {"count": 30, "median": 0.0, "max": 0.91}
    assert keep_warm_wait_words({"keep_warm_waited_calls": 2, "keep_warm_wait_ms": wait}) == (
        "2 of 30 calls at cadence arrived during one of the server's keep-warm runs and waited for it (at most 0.91 ms)")
    assert keep_warm_wait_words({"keep_warm_waited_calls": 0, "keep_warm_wait_ms": dict(wait, max=0.0)}) == (
        "0 of 30 calls at cadence arrived during one of the server's keep-warm runs and waited for it")
    # which calls, by episode (files from session 54 on): an episode without any is left out
    episodes = [{"episode": 0, "keep_warm_waited_at": [0, 3]}, {"episode": 1, "keep_warm_waited_at": []},
                {"episode": 2, "keep_warm_waited_at": [1]}]
    assert keep_warm_wait_words({"keep_warm_waited_calls": 3, "keep_warm_wait_ms": wait, "per_episode": episodes}) == (
        "3 of 30 calls at cadence arrived during one of the server's keep-warm runs and waited for it (at most 0.91 ms)"
        "; which, by episode (its calls counted from 0): 0: 0, 3; 2: 1")
    many = [{"episode": 0, "keep_warm_waited_at": list(range(0, 40, 3))}]  # 14 calls: the first 8 are named
    assert keep_warm_wait_words({"keep_warm_waited_calls": 14, "keep_warm_wait_ms": wait, "per_episode": many}).endswith(
        "0: 0, 3, 6, 9, 12, 15, 18, 21 and 6 more")
    # a server without keep-warm, or a file from before session 53: nothing to say
    assert keep_warm_wait_words({"keep_warm_waited_calls": None, "keep_warm_wait_ms": None}) is None
    assert keep_warm_wait_words({}) is None


def test_located_results_read_as_the_file_and_name_a_missing_key_by_its_path(tiny_results):
    """What report hands its renderers: the same data (==, json, isinstance, .get), but indexing a key the file
    lacks raises MissingField, still a KeyError, whose message is the key's whole path from the top."""
    from vlaperf.report.schema import MissingField, located

    r = json.loads((tiny_results / "bd.json").read_text())
    view = located(r)
    assert view == r and json.dumps(view, sort_keys=True) == json.dumps(r, sort_keys=True)
    assert isinstance(view["breakdown"], dict) and view.get("no such key") is None and "breakdown" in view
    with pytest.raises(KeyError) as e:
        view["breakdown"]["stages"][1]["no_such_field"]
    assert isinstance(e.value, MissingField) and e.value.path == "breakdown.stages[1].no_such_field"
    assert str(e.value) == "missing field 'breakdown.stages[1].no_such_field'"
    with pytest.raises(MissingField, match="missing field 'nope'"):
        view["nope"]


def test_scaling_section_leaves_out_the_r2_of_a_two_point_fit_and_says_why(tmp_path):
    """A line through two T(N) fits them exactly (r2 1 whatever T(N) does): its r2 cell is "-", and a note says why,
    as `vlaperf scaling`'s table does; three or more points keep their r2 and no note."""
    r = json.loads((H200 / "scaling_libero-pi0_best_s5.json").read_text())
    md = render([_write(tmp_path / "five.json", r)], tmp_path / "five.md").read_text()
    assert "r2 left out" not in md
    for s in r["scaling"]["series"]:
        s["points"] = s["points"][:2]
    md = render([_write(tmp_path / "two.json", r)], tmp_path / "two.md").read_text()
    label = r["scaling"]["series"][0]["label"]
    assert re.search(rf"^\| {re.escape(label)} \| [^|]+ \| [^|]+ \| - \| [^|]+ \| [^|]+ \|$", md, re.M), md
    assert "_r2 left out (-): a line fits any two points exactly, so with 2 step counts r2 is 1 whatever T(N) does; " \
           "3 or more --steps test the line_" in md


def test_scaling_section_flags_a_poor_fit_as_the_cli_table_does(tmp_path):
    """A fit `vlaperf scaling` calls poor in its table (r2 below 0.95, or a negative intercept) is said so in the
    report too, by variant: its a and b are no figures to quote; a good fit has no such line."""
    from vlaperf.profile.scaling import describe_fit

    r = json.loads((H200 / "scaling_libero-pi0_best_s5.json").read_text())
    good = render([_write(tmp_path / "good.json", r)], tmp_path / "good.md").read_text()
    assert "poor fit" not in good and all("poor fit" not in describe_fit(s["fit"]) for s in r["scaling"]["series"])
    r["scaling"]["series"][0]["fit"].update(intercept=-151.1, r2=0.9945)
    assert "poor fit" in describe_fit(r["scaling"]["series"][0]["fit"])
    md = render([_write(tmp_path / "poor.json", r)], tmp_path / "poor.md").read_text()
    label = r["scaling"]["series"][0]["label"]
    assert f"poor fit (r2 below 0.95, or a negative intercept or slope: its a and b mean little; more --iters or " \
           f"a quieter machine): {label}\n" in md


def test_a_world_action_matrix_names_each_rows_sparsity_and_shows_its_gain(tmp_path, figures):
    """A world-action matrix has a row per variant and sparsity mode: the table, the heatmap and the CDF name the mode
    (the heatmap's rows read 'reference' and 'exact' three times each), and the table shows the predicted video's
    error and the sparsity gain (the same variant at sparsity none over the row), as the console does."""
    from vlaperf.cli import main

    out = tmp_path / "wm.json"
    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--variants", "exact", "--warmup", "1",
                 "--iters", "2", "--no-progress", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    md = render([out], tmp_path / "r.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| variant | median ms"))
    assert "| rel L2 | video rel L2 | sparsity gain | first call s |" in header
    for v in r["variants"]:
        row = _md_rows(md, f"{v['variant']} \\| {v['sparsity']}")
        assert len(row) == 1, v["key"]
        gain = v["sparsity_gain"]
        said = f"{gain['speedup']:.2f}x ({gain['ratio_p10']:.2f}..{gain['ratio_p90']:.2f})" if gain else "-"
        assert row[0][8] == said + ("" if gain is None or gain["significant"] else " (noise)")
        assert row[0][7] == ("-" if v["equivalence"] is None else cell(v["equivalence"]["video_rel_l2"]))
    # every variant (the reference too) at each sparse mode, against itself at sparsity none
    assert sum(v["sparsity_gain"] is not None for v in r["variants"]) == 2 * (len(r["sparsities"]) - 1) > 0
    heatmap = next(f for alt, f in figures if alt == "matrix speedup heatmap")
    labels = {t.get_text() for t in heatmap.axes[0].get_yticklabels()}
    assert labels == {f"{v['variant']} | {v['sparsity']}" for v in r["variants"]}
    cdf = next(f for alt, f in figures if alt == "matrix latency CDF")
    assert {t.get_text() for t in cdf.axes[0].get_legend().get_texts()} == labels
