"""docs/performance.md and the README's table of figures are generated from the committed result files, never
typed: regenerating them from benchmarks/results/ must give the committed text byte for byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_performance_md_and_the_readme_figures_are_what_the_results_generate(tmp_path):
    gen = _generator()
    gen.OUT = tmp_path / "performance.md"
    gen.README = tmp_path / "README.md"
    gen.README.write_text((ROOT / "README.md").read_text())
    gen.main()
    fresh = gen.OUT.read_text()
    committed = (ROOT / "docs" / "performance.md").read_text()
    assert fresh == committed, "docs/performance.md is stale: run python benchmarks/make_performance_md.py"
    assert "## Single runs (`vlaperf bench`)" in fresh and "benchmarks/results/h200/" in fresh
    readme = gen.README.read_text()
    assert readme == (ROOT / "README.md").read_text(), "README's figures are stale: run python benchmarks/make_performance_md.py"
    assert "| libero-pi0 |" in readme.split(gen.README_BEGIN)[1].split(gen.README_END)[0]


def test_step_kernel_sweeps_list_their_rows_by_what_differs_from_the_first():
    """A sweep's rows keep their run order, each named by the fields where it differs from the run's
    first row (its defaults); wrong rows (rel L2 >= 2e-2) are left out; pi0.5's rows say how many
    modulation tables the timed launches cycled."""
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    row = lambda us, rel, **cfg: {"config": {"a": 1, "b": 2, **cfg}, "us": us, "rel_l2_vs_fp32": rel}  # noqa: E731
    r = {"workload": {"id": "libero-pi05", "overrides": {"layers": 18, "rows": 50, "modulation_tables": 10}},
         "configs": [row(900.0, 1e-2), row(700.0, 1e-2, b=3), row(600.0, 0.5, a=5), row(800.0, 1e-2, a=2, b=4)]}
    assert [(label, x["us"]) for label, x in gen.step_kernel_rows(r)] == [
        ("the run's defaults", 900.0), ("b=3", 700.0), ("a=2, b=4", 800.0)]
    assert gen.step_kernel_shape(r) == "18 layers, 50 rows, libero-pi05, 10 modulation tables cycled"
    r["workload"] = {"id": "libero-pi0", "overrides": {"layers": 18, "rows": 51}}
    assert gen.step_kernel_shape(r) == "18 layers, 51 rows, libero-pi0"
    r["workload"]["overrides"]["from_engine"] = "for_loop,...,megakernel"  # expert_step_bench.py --from-engine
    assert gen.step_kernel_shape(r).endswith(", the arguments its engine call launched")


def test_step_kernel_fitted_fields_show_what_they_resolved_to():
    """qkv_pairs=-1 and splits=0 mean "fitted to the launch" (expert_step.fit_config): tables show them as
    `fitted`, with the resolved value where the sweep row records it, and A/B rows name both sides so."""
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    base = {"splits": 0, "qkv_pairs": -1, "num_warps": 8}
    r = {"configs": [{"config": base, "fitted": {**base, "splits": 10, "qkv_pairs": 10}, "us": 600.0, "rel_l2_vs_fp32": 1e-2},
                     {"config": {**base, "splits": 5}, "us": 650.0, "rel_l2_vs_fp32": 1e-2},
                     {"config": {**base, "num_warps": 4}, "fitted": {**base, "splits": 10, "qkv_pairs": 10, "num_warps": 4},
                      "us": 640.0, "rel_l2_vs_fp32": 1e-2}]}
    assert [label for label, _ in gen.step_kernel_rows(r)] == ["the run's defaults", "splits=5", "num_warps=4"]
    assert gen.step_config_value("splits", 0, r["configs"][0]["fitted"]) == "fitted (10)"
    assert gen.step_config_value("qkv_pairs", -1) == "fitted" and gen.step_config_value("qkv_pairs", 0) == "0"
    ab = {"command": "step-config-ab", "base_config": {**base, "splits": 5}, "default_config": base,
          "workload": {"id": "libero-pi05"}, "env": {"git_commit": "abc1234"}, "median_ms": {"base": 12.7, "defaults": 12.3},
          "speedup_median": 1.03, "speedup_p10_p90": [1.02, 1.04], "equivalence_defaults": {"rel_l2": 3e-3}}
    table = "\n".join(gen.ab_tables([(gen.ROOT / "benchmarks" / "results" / "step_config_ab_x.json", ab)]))
    assert "step kernel: splits 5->fitted |" in table
    ab["default_launch"] = {"config": {**base, "splits": 10, "qkv_pairs": 10}, "rows": 10}  # files from session 14 on
    table = "\n".join(gen.ab_tables([(gen.ROOT / "benchmarks" / "results" / "step_config_ab_x.json", ab)]))
    assert "step kernel: splits 5->fitted (10) |" in table


def test_headline_takes_each_presets_newest_file_and_skips_served_ones():
    """Where each workload stands: per GPU, workload and mode the newest file (by its environment's timestamp) of
    reference, graph and today's best; a best file of a served process (reference weights released) is not taken,
    and a workload without a best file gets no row."""
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    from vlaperf.engine.levers import BEST_GPU, GRAPH_GPU

    best = list(BEST_GPU) + ["triton_kernels", "megakernel"]

    def bench(name, levers, median, day, workload="libero-pi0", **extra):
        r = {"command": "bench", "workload": {"id": workload, "overrides": {}}, "mode": "model",
             "variant": {"levers": levers, "label": "+".join(levers)}, "first_call_s": 2.0,
             "first_call_timing": "before equivalence check", "peak_memory_bytes": 2**30,
             "timers": {"wall_ms": {"median": median}}, "roofline": {"floor_ms": 5.0},
             "env": {"gpu": "NVIDIA H200", "timestamp": f"2026-12-{day:02d}T10:00:00+00:00"}, **extra}
        return gen.ROOT / "benchmarks" / "results" / f"{name}.json", r

    results = [bench("old_best", best, 14.0, 1), bench("new_best", best, 13.0, 2,
               equivalence={"rel_l2": 6e-3, "tolerance": 0.03, "passed": True}), bench("served", best, 12.0, 3,
               released_reference_bytes=1), bench("graph", list(GRAPH_GPU), 40.0, 1), bench("ref", [], 200.0, 2),
               bench("other", best[:-1], 11.0, 3), bench("shallow_graph", list(GRAPH_GPU), 9.0, 2, workload="libero-shallow6")]

    def compare(median, day, reduced=False, hour=10):  # a `vlaperf compare` file: LeRobot's median beside vlaperf's
        return gen.ROOT / "c.json", {"command": "compare", "workload": {"id": "libero-pi0", "overrides": {}},
                                     "compare": {"reduced": reduced}, "env": {"gpu": "NVIDIA H200",
                                     "timestamp": f"2026-11-{day:02d}T{hour:02d}:00:00+00:00"},
                                     "timing": {"summary": {"lerobot": {"wall_ms_median": median}}}}

    # Two full-size files of the 29th, the earlier one (09:00) listed first: the later one (15:00) is taken, not the
    # first listed of that day.
    results += [compare(250.0, 28), compare(255.0, 29, hour=9), compare(260.0, 29, hour=15),
                compare(99.0, 30, reduced=True)]
    rows = gen.headline_rows(results)
    assert len(rows) == 3, rows  # header, separator, one row: libero-shallow6 has no best file
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells[1:6] == ["libero-pi0", "model", "200.00", "40.00 (2026-12-01)", "**13.00**"]
    assert cells[6:9] == ["15.38x", "2.60x", "76.9"] and cells[11:13] == ["6.0e-03", "2026-12-02"]
    assert cells[13:15] == ["260.00 (2026-11-29)", "20.00x"]  # the newest full-size compare, not the reduced one
    assert cells[15] == "`benchmarks/results/new_best.json`"

    # the README's short form: the same choice, model mode only, fewer columns
    short = gen.readme_rows(results)
    assert "on the NVIDIA H200" in short[0] and "tolerance 0.03" in short[0]
    assert len(short) == 5, short
    cells = [c.strip() for c in short[4].strip("|").split("|")]
    assert cells == ["libero-pi0", "200.00", "40.00 (2026-12-01)", "**13.00**", "2.60x", "76.9", "2.00", "6.0e-03",
                     "260.00 (2026-11-29)", "2026-12-02"]


def test_headline_takes_the_world_action_presets_and_names_non_default_settings():
    """wam-761's files match the world-action presets (not pi0's); a run with frame sparsity or guidance (which the
    file records as overrides) is its own row, named by them; batch comes from the run's settings."""
    gen = _generator()
    from vlaperf.engine.wam import WAM_PRESETS

    def bench(name, preset, median, sparsity="none", cfg=0.0, batch=1):
        overrides = {**({"sparsity": sparsity} if sparsity != "none" else {}), **({"cfg_scale": cfg} if cfg else {})}
        r = {"command": "bench", "workload": {"id": "wam-761", "overrides": overrides,
                                              "settings": {"batch": batch, "sparsity": sparsity, "cfg_scale": cfg}},
             "mode": "model", "variant": {"levers": list(WAM_PRESETS[preset]), "label": preset}, "first_call_s": 3.0,
             "first_call_timing": "before equivalence check", "timers": {"wall_ms": {"median": median}},
             "roofline": {"floor_ms": 20.0}, "equivalence": {"rel_l2": 5e-3, "tolerance": 0.03, "passed": False},
             "env": {"gpu": "NVIDIA H200", "timestamp": "2026-12-01T10:00:00+00:00"}}
        return gen.ROOT / f"{name}.json", r

    wam = [bench("ref", "reference", 600.0), bench("best", "best", 50.0), bench("drop", "best", 45.0, "drop_middle"),
           bench("cfg", "best", 80.0, cfg=3.0), bench("exact", "exact", 300.0)]
    records = gen.headline(results=[], wam=wam)
    assert [r["workload"] for r in records] == ["wam-761", "wam-761 (cfg_scale 3.0)",
                                                "wam-761 (sparsity drop_middle)"]
    assert records[0]["median"] == {"reference": 600.0, "graph": None, "best": 50.0}
    rows = gen.readme_rows([], wam)
    assert "| wam-761 | 600.00 | - | **50.00** | 2.50x | 20.0 | 3.00 | 5.0e-03 (FAILED) | - | 2026-12-01 |" in rows
    # the same levers as pi0 files are not a pi0 preset when they are the world-action model's, and the reverse
    assert gen.headline(results=wam, wam=[]) == []


def test_readme_block_is_replaced_between_its_markers_and_missing_markers_are_an_error(tmp_path):
    gen = _generator()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{gen.README_BEGIN}\nold figures\n{gen.README_END}\n\nmore\n")
    assert gen.write_readme_block(readme, ["| a |", "| b |"]) is True
    assert readme.read_text() == f"# x\n\n{gen.README_BEGIN}\n| a |\n| b |\n{gen.README_END}\n\nmore\n"
    assert gen.write_readme_block(readme, ["| a |", "| b |"]) is False  # unchanged: not rewritten
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        gen.write_readme_block(readme, ["| a |"])


def test_an_interrupted_matrix_keeps_its_prepared_rows_first_call_and_check():
    gen = _generator()
    r = {"command": "matrix", "variant": {"label": "grid"}, "workload": {"id": "libero-pi0"}, "iters": 3, "warmup": 2,
         "interrupted": True, "first_call_timing": "before equivalence check",
         "env": {"gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0", "driver": "580"},
         "variants": [{"variant": "reference", "skipped": "not timed: the matrix was interrupted"},
                      {"variant": "for_loop,compile=default", "first_call_s": 66.4, "skipped": "not timed: the matrix was "
                       "interrupted", "equivalence": {"rel_l2": 5.6e-3, "passed": True}},
                      {"variant": "for_loop,cuda_graph", "skipped": "not prepared: the matrix was interrupted"}]}
    text = "\n".join(gen.matrix_tables([(gen.ROOT / "m.json", r)]))
    assert "**Interrupted**" in text
    assert "| loop+compile:default | not timed: the matrix was interrupted | | | | 5.6e-03 | 66.40 |" in text
    assert "| loop+graph | not prepared: the matrix was interrupted | | | | - |  |" in text


def test_readme_names_the_ceilings_a_bench_measured_on_its_gpu():
    gen = _generator()
    from vlaperf.engine.levers import BEST_GPU

    def bench(ts, ceilings):
        return gen.ROOT / f"b{ts}.json", {
            "command": "bench", "workload": {"id": "libero-pi0", "overrides": {}}, "mode": "model",
            "variant": {"levers": list(BEST_GPU) + ["triton_kernels", "megakernel"], "label": "best"},
            "first_call_s": 2.0, "first_call_timing": "before equivalence check", "timers": {"wall_ms": {"median": 13.0}},
            "roofline": {"floor_ms": 4.9, "ceilings": ceilings},
            "env": {"gpu": "NVIDIA H200", "timestamp": f"2026-12-0{ts}T10:00:00+00:00"}}

    measured = {"matmul_flops": 787e12, "bandwidth": 4.22e12, "source": "measured on this device"}
    rows = gen.readme_rows([bench(1, measured), bench(2, {**measured, "matmul_flops": 790e12}),
                            bench(3, {"matmul_flops": 780e12, "bandwidth": 4.23e12, "source": "H200 (perf-facts)"})])
    lines = [r for r in rows if r.startswith("Ceilings measured")]
    assert lines == ["Ceilings measured on the NVIDIA H200 by `vlaperf bench --ceilings measure`: 790 TFLOP/s bf16 "
                     "matmul, 4.22 TB/s copy (2026-12-02, `b2.json`)."]
