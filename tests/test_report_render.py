"""vlaperf.report.render: HTML and markdown reports from the committed H200 result files and
from freshly generated tiny results (breakdown, scaling, syncs, doctor, bench, matrix)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import torch

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
    assert "| variant [mode] | timer | median ms" in text
    assert "## Environment" in text


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
    if (H200.parent / "h200x2").is_dir():
        assert "Ray Serve, 2 replica(s) on 2 GPU(s)" in md


def test_new_probe_rows_keep_errors_as_findings():
    """A formulation or tiling that failed on the GPU is a row with its error, not a crash."""
    from vlaperf.report.render import geglu_bench_rows, splitk_probe_rows

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
