"""docs/performance.md is generated from the committed result files, never typed: regenerating
it from benchmarks/results/ must give the committed page byte for byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_performance_md_is_what_the_results_generate(tmp_path):
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.OUT = tmp_path / "performance.md"
    gen.main()
    fresh = gen.OUT.read_text()
    committed = (ROOT / "docs" / "performance.md").read_text()
    assert fresh == committed, "docs/performance.md is stale: run python benchmarks/make_performance_md.py"
    assert "## Single runs (`vlaperf bench`)" in fresh and "benchmarks/results/h200/" in fresh
