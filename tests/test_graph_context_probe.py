"""benchmarks/graph_context_probe.py: graph engines timed before and after the cumulative matrix's other rows. On the
CPU there is no capture (the last exact row stands in for graph) and no compiled rows, but every phase runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "graph_context_probe.py"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_diff_puts_the_largest_difference_first_and_counts_a_missing_kernel_as_zero():
    probe = _module("graph_context_probe", SCRIPT)
    a = [{"name": "gemm_a", "count": 2.0, "us": 100.0}, {"name": "attn", "count": 1.0, "us": 50.0}]
    b = [{"name": "gemm_b", "count": 2.0, "us": 80.0}, {"name": "attn", "count": 1.0, "us": 49.0}]
    rows = probe.kernel_diff(a, b)
    assert [r["name"] for r in rows] == ["gemm_a", "gemm_b", "attn"]
    assert rows[0] == {"name": "gemm_a", "us_a": 100.0, "us_b": 0.0, "count_a": 2.0, "count_b": 0.0}
    assert probe.kernel_diff(a, b, top=1)[0]["name"] == "gemm_a"
    assert probe.kernels(lambda: None, __import__("torch").device("cpu")) == []  # no profiler run on the CPU
    switches = probe.switches()
    assert {"preferred_blas_library", "sdp_cudnn", "matmul_allow_tf32", "cudnn_benchmark"} <= set(switches)


def test_the_probe_runs_its_phases_in_the_matrix_order_and_its_file_renders(tmp_path):
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--workload", "tiny", "--device", "cpu", "--warmup", "1",
                           "--iters", "3", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    r = read_result(out)
    assert r["command"] == "graph-context-probe" and r["compiled_rows"] == []
    assert r["eager_rows"][0] == "reference" and r["graph_spec"] not in r["eager_rows"]
    points = [(p["phase"], p.get("engine")) for p in r["phases"]]
    assert points == [("capture g1", "g1"), ("A: before any eager row", "g1"), ("B: the eager rows prepared", None),
                      ("C: after the eager rows", "g1"), ("capture g2", "g2"), ("C: after the eager rows", "g2"),
                      ("C: after the eager rows", "g1"), ("C: after the eager rows", "g2")]
    assert r["phases"][2]["prepared"] == r["eager_rows"]
    assert all(p["timers"]["wall_ms"]["count"] == 3 for p in r["phases"] if "timers" in p)

    report = tmp_path / "report.md"
    assert main(["report", str(out), "-o", str(report)]) == 0
    text = report.read_text()
    assert "graph in the matrix's context" in text and "C: after the eager rows" in text
    assert "could not render" not in text

    gen = _module("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    lines = gen.graph_context_tables([(ROOT / "benchmarks" / "results" / "probe.json", r)])
    assert lines[2].startswith("| point | engine | wall median ms")
    assert len([x for x in lines if x.startswith("| C: after the eager rows")]) == 4
