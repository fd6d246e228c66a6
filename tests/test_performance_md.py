"""docs/performance.md and the README's table of figures are generated from the committed result files, never
typed: regenerating them from benchmarks/results/ must give the committed text byte for byte."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
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
    assert "| libero-pi0 " in readme.split(gen.README_BEGIN)[1].split(gen.README_END)[0]  # "(GPU)" with several


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
    nor the newer one of a guided call (`bench --rtc`) or of another dtype, and a workload without a best file gets no
    row."""
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
               released_reference_bytes=1), bench("guided", best, 12.5, 4, rtc={"executed": 3, "delay": 2}),
               bench("graph", list(GRAPH_GPU), 40.0, 1), bench("ref", [], 200.0, 2),
               bench("other", best[:-1], 11.0, 3), bench("shallow_graph", list(GRAPH_GPU), 9.0, 2, workload="libero-shallow6")]
    # the newest best of all, but in float32 (`bench --dtype float32` on the GPU): not bf16's best
    fp32 = bench("fp32_best", best, 30.0, 5)
    fp32[1]["variant"]["dtype"] = "float32"
    results.append(fp32)

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
    assert "### matrix `grid` on libero-pi0, model mode (" in text  # a file without a mode reads as model mode
    policy = "\n".join(gen.matrix_tables([(gen.ROOT / "m.json", dict(r, mode="policy"))]))
    assert "### matrix `grid` on libero-pi0, policy mode (" in policy
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


# ---- audited by mutation: what each column, row choice and refusal of the generator must keep ----

H200 = "NVIDIA H200"


def _best_levers():
    from vlaperf.engine.levers import BEST_GPU, TUNED_FOR

    return list(BEST_GPU) + list(TUNED_FOR)  # today's best on a Hopper GPU


def _bench(gen, name, levers, median, day=1, gpu=H200, **extra):
    """A `vlaperf bench` result (vlaperf/report/schema.py) of libero-pi0 with the fields the generator reads."""
    r = {"command": "bench", "workload": {"id": "libero-pi0", "overrides": {}}, "mode": "model",
         "variant": {"levers": list(levers), "label": ",".join(levers) or "reference"}, "first_call_s": 2.0,
         "first_call_timing": "before equivalence check", "peak_memory_bytes": 2**30,
         "timers": {"wall_ms": {"median": median, "p95": median}, "cuda_event_ms": None}, "roofline": {"floor_ms": 5.0},
         "env": {"gpu": gpu, "git_commit": "abc1234def", "timestamp": f"2026-12-{day:02d}T10:00:00+00:00"}, **extra}
    return gen.ROOT / "benchmarks" / "results" / f"{name}.json", r


def _compare(gen, name, median, stamp, overrides=None):
    """A full-size `vlaperf compare` file: LeRobot's median on the H200."""
    return gen.ROOT / "benchmarks" / "results" / f"{name}.json", {
        "command": "compare", "workload": {"id": "libero-pi0", "overrides": overrides or {}}, "compare": {"reduced": False},
        "env": {"gpu": H200, "timestamp": stamp}, "timing": {"summary": {"lerobot": {"wall_ms_median": median}}}}


def _cells(row):
    return [c.strip() for c in row.strip("|").split("|")]


def test_headline_cells_say_what_a_best_file_lacks_and_files_without_a_gpu_have_no_row():
    """best without an equivalence check shows rel L2 `-`; a file from before first-call timing moved ahead of the
    check shows its first call as n/a; LeRobot's figure from best's own day carries no date. A CPU file has no
    place among the GPU figures (no row, and no x floor in Single runs: the floor is at a GPU's ceilings)."""
    gen = _generator()
    path, best = _bench(gen, "best", _best_levers(), 10.0, day=2)
    del best["first_call_timing"], best["peak_memory_bytes"]
    cpu = _bench(gen, "cpu_best", _best_levers(), 500.0, day=3, gpu=None)
    results = [(path, best), cpu, _compare(gen, "c", 250.0, "2026-12-02T08:00:00+00:00")]
    rows = gen.headline_rows(results)
    assert len(rows) == 3, rows  # header, separator, the H200's row
    cells = _cells(rows[2])
    assert cells[0] == H200 and cells[5] == "**10.00**" and cells[7] == "2.00x"  # 10 ms over the 5 ms floor
    assert cells[9:12] == ["n/a (ran in check)", "-", "-"]  # first call, peak GiB, rel L2
    assert cells[12:15] == ["2026-12-02", "250.00", "25.00x"]  # the compare of best's day: no date beside it
    fp32 = _bench(gen, "best_fp32", _best_levers(), 90.0, day=3)
    fp32[1]["variant"]["dtype"] = "float32"
    single = {_cells(row)[-1]: _cells(row) for row in gen.bench_rows(results + [fp32])[2:]}
    assert single["`benchmarks/results/best.json`"][9] == "2.0x"
    assert single["`benchmarks/results/cpu_best.json`"][9] == "-"
    # the page is bfloat16's: a run in another dtype says so where its workload is named
    assert single["`benchmarks/results/best.json`"][0] == "libero-pi0"
    assert single["`benchmarks/results/best_fp32.json`"][0] == "libero-pi0 (float32)"


def test_lerobot_figure_is_the_one_of_the_same_workload_and_overrides():
    """A compare run with overrides (horizon 50) is another workload: the plain row keeps the plain file's figure
    even where the overridden one is newer."""
    gen = _generator()
    results = [_bench(gen, "best", _best_levers(), 10.0), _compare(gen, "c", 250.0, "2026-11-01T10:00:00+00:00"),
               _compare(gen, "c_h50", 400.0, "2026-11-03T10:00:00+00:00", overrides={"horizon": 50})]
    [rec] = gen.headline(results)
    assert (rec["workload"], rec["lerobot_ms"], rec["lerobot_day"]) == ("libero-pi0", 250.0, "2026-11-01")


def test_readme_rows_name_each_gpu_and_every_tolerance():
    """The README's sentence names the GPUs (`GPU` with none) and the tolerances of best's checks (`-` with none);
    with more than one GPU each row says its GPU, in GPU order."""
    gen = _generator()
    empty = gen.readme_rows([])
    assert empty[0].startswith("`vlaperf bench`, model mode, on the GPU: ") and "(tolerance -)" in empty[0]
    assert len(empty) == 4  # sentence, blank, header, separator
    assert "(tolerance -)" in gen.readme_rows([_bench(gen, "b", _best_levers(), 10.0)])[0]
    h200 = _bench(gen, "h200", _best_levers(), 10.0, equivalence={"rel_l2": 6e-3, "tolerance": 0.03, "passed": True})
    h100 = _bench(gen, "h100", _best_levers(), 20.0, gpu="NVIDIA H100",
                  equivalence={"rel_l2": 1e-3, "tolerance": 0.01, "passed": True})
    rows = gen.readme_rows([h200, h100])
    assert "on the NVIDIA H100 and NVIDIA H200: " in rows[0] and "(tolerance 0.01, 0.03)" in rows[0]
    # as many workloads on each: the H200's first (the card), whatever the names' order
    assert [_cells(row)[0] for row in rows[4:]] == ["libero-pi0 (NVIDIA H200)", "libero-pi0 (NVIDIA H100)"]
    a100 = _bench(gen, "a100", _best_levers(), 30.0, gpu="NVIDIA A100")
    assert [_cells(row)[0] for row in gen.readme_rows([h100, a100])[4:]] == ["libero-pi0 (NVIDIA A100)",
                                                                             "libero-pi0 (NVIDIA H100)"]
    # the GPU with the most workloads first, whatever its name
    pi05 = _bench(gen, "h200b", _best_levers(), 11.0, equivalence={"rel_l2": 6e-3, "tolerance": 0.03, "passed": True})
    pi05[1]["workload"] = {"id": "libero-pi05", "overrides": {}}
    rows = gen.readme_rows([h200, h100, pi05])
    assert [_cells(row)[0] for row in rows[4:]] == ["libero-pi0 (NVIDIA H200)", "libero-pi05 (NVIDIA H200)",
                                                    "libero-pi0 (NVIDIA H100)"]


def test_readme_ceilings_lines_take_each_gpus_newest_measuring_bench_only():
    """Per GPU (in GPU order) the newest `vlaperf bench` file whose ceilings were measured, whatever the order the
    files are listed in; a matrix or a file without a GPU is not a bench of that device's ceilings."""
    gen = _generator()

    def measured(tflops, tbps):
        return {"roofline": {"floor_ms": 5.0, "ceilings": {"matmul_flops": tflops * 1e12, "bandwidth": tbps * 1e12,
                                                           "source": "measured on this device"}}}

    matrix = (gen.ROOT / "benchmarks" / "results" / "m.json",
              {"command": "matrix", "env": {"gpu": H200, "timestamp": "2026-12-09T10:00:00+00:00"}, **measured(999, 9.0)})
    rows = gen.readme_rows([_bench(gen, "new", [], 100.0, day=3, **measured(790, 4.22)),
                            _bench(gen, "old", [], 100.0, day=2, **measured(787, 4.20)),
                            _bench(gen, "h100", [], 100.0, day=1, gpu="NVIDIA H100", **measured(700, 3.0)),
                            _bench(gen, "cpu", [], 100.0, day=8, gpu=None, **measured(1, 0.1)), matrix])
    assert [r for r in rows if r.startswith("Ceilings")] == [
        "Ceilings measured on the NVIDIA H100 by `vlaperf bench --ceilings measure`: 700 TFLOP/s bf16 matmul, "
        "3.00 TB/s copy (2026-12-01, `benchmarks/results/h100.json`).",
        "Ceilings measured on the NVIDIA H200 by `vlaperf bench --ceilings measure`: 790 TFLOP/s bf16 matmul, "
        "4.22 TB/s copy (2026-12-03, `benchmarks/results/new.json`)."]


def test_readme_block_refuses_a_lone_or_misplaced_marker_and_keeps_what_follows(tmp_path):
    """Either marker alone, or the end marker before the begin marker, is refused naming the file (the swapped
    markers were an IndexError); the block ends at the first end marker after the begin marker; an unchanged block
    is not rewritten (the file's time stays)."""
    gen = _generator()
    readme = tmp_path / "README.md"
    for text in (f"{gen.README_BEGIN}\nold\n", f"old\n{gen.README_END}\n", f"{gen.README_END}\nold\n{gen.README_BEGIN}\n"):
        readme.write_text(text)
        with pytest.raises(SystemExit) as e:
            gen.write_readme_block(readme, ["| a |"])
        assert str(e.value).startswith(f"{readme}: the markers ") and readme.read_text() == text
    readme.write_text(f"{gen.README_BEGIN}\nold\n{gen.README_END}\nmiddle\n{gen.README_END}\n")
    assert gen.write_readme_block(readme, ["| a |"]) is True
    assert readme.read_text() == f"{gen.README_BEGIN}\n| a |\n{gen.README_END}\nmiddle\n{gen.README_END}\n"
    os.utime(readme, ns=(0, 0))
    assert gen.write_readme_block(readme, ["| a |"]) is False and readme.stat().st_mtime_ns == 0


def test_gpu_state_cell():
    """SM clock / max clock and the reasons holding it, idle left out; `-` without a clock reading."""
    gen = _generator()
    assert gen._gpu_state(None) == "-" and gen._gpu_state({"sm_clock_mhz": None, "max_sm_clock_mhz": 1980}) == "-"
    assert gen._gpu_state({"sm_clock_mhz": 1500}) == "1500/? MHz"
    # 0x5 = idle (0x1) + software power cap (0x4)
    assert gen._gpu_state({"sm_clock_mhz": 1500, "max_sm_clock_mhz": 1980, "clock_event_reasons": "0x5"}) == \
        "1500/1980 MHz (software power cap)"


def test_short_labels_and_empty_cells():
    gen = _generator()
    assert gen._short("") == "reference" and gen._short("for_loop+cuda_graph,compile=default") == "loop+graph+compile:default"
    assert gen._ms(0.0) == "0.00" and gen._ms(None) == "-"  # a zero is a figure, not a missing one


def test_an_old_interrupted_matrix_shows_the_references_first_call_only():
    """A file without `first_call_timing` ran each variant's first call inside its check: only the reference's
    (which has no check of its own) is a first call."""
    gen = _generator()
    r = {"command": "matrix", "variant": {"label": "grid"}, "workload": {"id": "libero-pi0"}, "iters": 3, "warmup": 2,
         "interrupted": True, "env": {"gpu": H200, "torch": "2.11", "cuda": "13.0", "driver": "580"},
         "variants": [{"variant": "reference", "first_call_s": 3.0, "skipped": "not timed"},
                      {"variant": "for_loop", "first_call_s": 60.0, "skipped": "not timed"}]}
    text = "\n".join(gen.matrix_tables([(gen.ROOT / "m.json", r)]))
    assert "| reference | not timed | | | | - | 3.00 |" in text and "| loop | not timed | | | | - | n/a (ran in check) |" in text


def test_sections_without_files_have_no_table_and_failures_say_no():
    """A section with no file of its command has no header row either; a failed check or compare says NO; a loadgen
    phase's lost requests count the misrouted ones; an equivalence heading of a CPU run says cpu."""
    gen = _generator()
    bench = [_bench(gen, "b", [], 100.0)]
    for tables in (gen.sync_tables, gen.compare_tables, gen.ab_tables, gen.first_call_tables, gen.matrix_tables,
                   gen.check_tables, gen.loadgen_tables, gen.kernel_tables):
        assert tables(bench) == [], tables.__name__
    env = {"gpu": None, "torch": "2.11", "cuda": None, "driver": None}
    check = {"command": "check", "workload": {"id": "libero-pi0", "overrides": {}}, "variant": {"dtype": "float32"},
             "env": env, "checks": [{"variant": "for_loop", "max_abs": 0.0012, "rel_l2": 3e-4, "tolerance": 1e-2,
                                     "passed": False}]}
    text = "\n".join(gen.check_tables([(gen.ROOT / "k.json", check)]))
    assert "### equivalence on libero-pi0 (float32, cpu, torch 2.11, CUDA None, driver None)" in text
    assert "| loop | 0.0012 | 0.0003 | 1e-02 | NO |" in text
    compare = {"command": "compare", "workload": {"id": "libero-pi0"}, "env": env, "compare": {
        "reduced": False, "lerobot_version": "0.4", "dtype": "bfloat16", "passed": False,
        "equivalence": {"reference": {"rel_l2": 0.2}}}}
    assert "| libero-pi0 | 0.4 | bfloat16 | 2.00e-01 | NO | - | - | - | - | - | - |" in "\n".join(
        gen.compare_tables([(gen.ROOT / "c.json", compare)]))
    compare["compare"]["passed"] = True
    compare["timing"] = {"summary": {name: {"wall_ms_median": ms, "speedup_vs_lerobot_wall": 1.0} for name, ms in (
        ("lerobot", 250.0), ("vlaperf_best", 12.5), ("lerobot_predict", 251.0), ("vlaperf_in_lerobot_predict", 13.25))}}
    assert "| 250.00 | - | 12.50 | 1.00x | 251.00 -> 13.25 | - | `c.json` |" in "\n".join(
        gen.compare_tables([(gen.ROOT / "c.json", compare)]))  # LeRobot's policy as shipped -> accelerated
    compare["timing"]["summary"].update({name: {"wall_ms_median": ms} for name, ms in (
        ("lerobot_predict_rtc", 260.0), ("vlaperf_in_lerobot_predict_rtc", 13.5))})
    assert "| 251.00 -> 13.25 | 260.00 -> 13.50* | `c.json` |" in "\n".join(
        gen.compare_tables([(gen.ROOT / "c.json", compare)]))  # and with LeRobot's RTC on, timed as it came (*)
    compare["timing"]["settled"] = ["vlaperf_best", "vlaperf_in_lerobot_predict", "vlaperf_in_lerobot_predict_rtc"]
    assert "| 251.00 -> 13.25 | 260.00 -> 13.50 | `c.json` |" in "\n".join(
        gen.compare_tables([(gen.ROOT / "c.json", compare)]))  # settled: no mark
    ms = {"median": 10.0, "p95": 12.0, "p99": 13.0}
    phase = {"clients": 2, "ok": 7, "expected": 10, "lost": 2, "misrouted": 1, "requests_per_s": 5.0,
             "round_trip_ms": ms, "server_infer_ms": ms, "overhead_ms": ms, "batch_size": {"mean": 1.5}}
    loadgen = {"command": "loadgen", "workload": {"id": "libero-pi0"}, "env": env, "server": {"max_batch": 4},
               "loadgen": {"observations": "random", "phases": [phase]}}
    assert "| 2 | 7 / 10 | 3 | 5.0 |" in "\n".join(gen.loadgen_tables([(gen.ROOT / "l.json", loadgen)]))


def test_step_kernel_rows_are_labelled_against_the_runs_first_row_even_when_it_is_left_out():
    """The first row is the run's defaults even when it is wrong (and so not shown); rel L2 of exactly 2e-2 is wrong;
    a fitted field shows what it resolved to; one modulation table is singular."""
    gen = _generator()
    row = lambda us, rel, **cfg: {"config": {"splits": 5, "num_warps": 8, **cfg}, "us": us, "rel_l2_vs_fp32": rel}  # noqa: E731
    r = {"workload": {"id": "libero-pi05", "overrides": {"modulation_tables": 1}},
         "configs": [row(900.0, 0.5), row(700.0, 2e-2, num_warps=4), row(650.0, 1.9e-2, num_warps=4),
                     {**row(600.0, 1e-2, splits=0), "fitted": {"splits": 10, "num_warps": 8}}]}
    assert [(label, x["us"]) for label, x in gen.step_kernel_rows(r)] == [("num_warps=4", 650.0),
                                                                          ("splits=fitted (10)", 600.0)]
    assert gen.step_kernel_shape(r) == "18 layers, 51 rows, libero-pi05, 1 modulation table cycled"


def test_prefix_tiles_ab_without_a_difference_says_unchanged_and_probe_tables_keep_plain_floats():
    gen = _generator()
    ab = {"command": "prefix-tiles-ab", "today_tiles": {"BM": 64}, "pick_tiles": {"BM": 64}, "workload": {"id": "libero-pi0"},
          "env": {"git_commit": "abc1234def"}, "median_ms": {"today": 10.0, "pick": 9.0}, "speedup_median": 1.111,
          "speedup_p10_p90": [1.1, 1.2], "equivalence_pick": {"rel_l2": 0.0}}
    assert "| prefix attention tiles: unchanged | libero-pi0 | abc1234 | 10.00 | 9.00 | 1.111x | 1.100..1.200 | 0.0e+00 |" \
        in "\n".join(gen.ab_tables([(gen.ROOT / "a.json", ab)]))
    probe = [(gen.ROOT / "p.json", {"command": "gemm-probe", "env": {"git_commit": "abc1234"}})]
    rows_fn = lambda r: [["q", 0.05, 3]]  # noqa: E731
    assert gen._probe_tables(probe, "gemm-probe", ["a", "b", "c"], rows_fn)[-2] == "| q | 0.05 | 3 |"
    assert gen._probe_tables(probe, "gemm-probe", ["a", "b", "c"], rows_fn, small_floats=True)[-2] == "| q | 5.0e-02 | 3 |"


def _write(path: Path, r) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(r if isinstance(r, str) else json.dumps(r))


def test_main_reads_every_result_file_but_profiles_and_names_a_damaged_one(tmp_path):
    """Files at any depth under benchmarks/results/ are figures except those under profiles/; world-action workloads
    (wam-761, wam-tiny) go to their own section; a file that is not JSON (binary included), or not an object, stops
    the script with its path before anything is written."""
    gen = _generator()
    gen.ROOT, gen.RESULTS = tmp_path, tmp_path / "benchmarks" / "results"
    gen.OUT, gen.README = tmp_path / "docs" / "performance.md", tmp_path / "README.md"
    gen.OUT.parent.mkdir()
    gen.README.write_text(f"# x\n{gen.README_BEGIN}\n{gen.README_END}\n")
    _write(gen.RESULTS / "h200" / "best.json", _bench(gen, "best", _best_levers(), 10.0)[1])
    _write(gen.RESULTS / "h200" / "deeper" / "graph.json", _bench(gen, "graph", ["for_loop"], 40.0)[1])
    _write(gen.RESULTS / "h200" / "profiles" / "probe.json", _bench(gen, "probe", _best_levers(), 1.0, day=9)[1])
    wam = _bench(gen, "wam", [], 600.0)[1]
    wam["workload"] = {"id": "wam-tiny", "overrides": {}, "settings": {"batch": 1}}
    _write(gen.RESULTS / "h200" / "wam_tiny.json", wam)
    gen.main()
    text = gen.OUT.read_text()
    pi0, world = text.split("## World-action model")
    assert "`benchmarks/results/h200/deeper/graph.json`" in pi0 and "**10.00**" in pi0
    # the profiles/ file is newer and faster: had it been read, it would be best's figure
    assert "profiles" not in text and "| **10.00** |" in gen.README.read_text()
    assert "wam_tiny" not in pi0 and "`benchmarks/results/h200/wam_tiny.json`" in world
    for damaged, why in (("{", "not valid JSON"), ("[1]", "expected a result object, got array"),
                         (b"\x1f\x8b\x08\x00", "not valid JSON (not UTF-8 text: byte 1: invalid start byte)")):
        if isinstance(damaged, bytes):
            (gen.RESULTS / "h200" / "damaged.json").write_bytes(damaged)
        else:
            _write(gen.RESULTS / "h200" / "damaged.json", damaged)
        gen.OUT.unlink(missing_ok=True)
        with pytest.raises(SystemExit) as e:
            gen.main()
        assert str(e.value).startswith(f"{gen.RESULTS / 'h200' / 'damaged.json'}: {why}") and not gen.OUT.exists()


def test_the_script_refuses_any_argument_before_it_writes(tmp_path):
    """No options: anything on the command line exits 2 (argparse) before the docs are rewritten. A copy of the
    script under tmp_path writes there, should it write at all."""
    script = tmp_path / "benchmarks" / "make_performance_md.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "benchmarks" / "make_performance_md.py", script)
    (tmp_path / "docs").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, str(script), "--results", "x"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "unrecognized arguments: --results x" in p.stderr, p.stderr
    assert not (tmp_path / "docs" / "performance.md").exists()


def test_files_of_one_timestamp_give_the_later_path_in_any_order():
    """Two bench files of one preset that record the same second (parallel lanes): the headline and the ceilings
    line take the later path, as the report's summary does, whichever order the files come in."""
    gen = _generator()
    stamp = "2026-12-01T10:00:00+00:00"
    ceilings = {"matmul_flops": 7.8e14, "bandwidth": 4.2e12, "source": "measured on this device"}

    def tied(name, median):
        path, r = _bench(gen, name, _best_levers(), median, roofline={"floor_ms": 5.0, "ceilings": ceilings})
        r["env"]["timestamp"] = stamp
        return path, r

    a, b = tied("bench_a", 14.0), tied("bench_b", 13.0)
    for order in ([a, b], [b, a]):
        (record,) = gen.headline(order)
        assert record["path"].name == "bench_b.json" and record["median"]["best"] == 13.0, order
        line = [row for row in gen.readme_rows(order) if row.startswith("Ceilings measured")]
        assert len(line) == 1 and "bench_b.json" in line[0], line


def test_rtc_cost_rows_show_the_guided_call_against_the_unguided_one():
    spec = importlib.util.spec_from_file_location("make_performance_md", ROOT / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    cost = {"wall_ms": {"unguided_median": 13.5, "guided_median": 13.7, "guided_over_unguided": 1.0148,
                        "per_round_p10": 1.007, "per_round_p90": 1.018}, "cuda_event_ms": None, "iters": 50}
    r = {"command": "bench", "workload": {"id": "libero-pi0"}, "mode": "model", "variant": {"label": "for_loop"},
         "env": {"gpu": "NVIDIA H100 80GB HBM3", "git_commit": "abcdef123"}, "equivalence": {"rel_l2": 6.4e-3},
         "rtc": {"executed": 3, "delay": 2, "vs_unguided": cost}}
    plain = dict(r, rtc=None)
    rows = gen.rtc_cost_rows([(gen.ROOT / "benchmarks" / "results" / "g.json", r),
                              (gen.ROOT / "benchmarks" / "results" / "p.json", plain)])
    assert len(rows) == 3  # header, separator, the guided file alone
    assert _cells(rows[0])[4:6] == ["unguided median ms", "guided median ms"]  # the statistic named, as elsewhere
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells[:9] == ["NVIDIA H100 80GB HBM3", "libero-pi0", "model", "loop", "13.50", "13.70", "**1.015x**",
                         "1.007..1.018", "50"]
    assert cells[9:] == ["6.4e-03", "abcdef1", "`benchmarks/results/g.json`"]
    assert gen.rtc_cost_rows([(gen.ROOT / "p.json", plain)]) == []  # no guided file: no table


def test_idle_cost_rows_show_the_call_after_an_idle_against_back_to_back():
    gen = _generator()
    pair = lambda a, b: {"back_to_back_median": a, "after_idle_median": b, "after_idle_over_back_to_back": b / a,  # noqa: E731
                         "per_round_p10": 1.018, "per_round_p90": 1.05}
    r = {"command": "bench", "workload": {"id": "libero-pi0"}, "mode": "policy", "variant": {"label": "for_loop"},
         "env": {"gpu": "NVIDIA H100 80GB HBM3", "git_commit": "abcdef123"},
         "idle": {"idle_ms": 50.0, "wall_ms": pair(14.27, 14.76), "cuda_event_ms": pair(14.2, 14.66), "iters": 50}}
    plain = dict(r, idle=None)
    rows = gen.idle_cost_rows([(gen.ROOT / "benchmarks" / "results" / "i.json", r),
                               (gen.ROOT / "benchmarks" / "results" / "p.json", plain)])
    assert len(rows) == 3  # header, separator, the idle file alone
    assert _cells(rows[0])[5:7] == ["back to back median ms", "after idle median ms"]  # the statistic named
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells == ["NVIDIA H100 80GB HBM3", "libero-pi0", "policy", "loop", "50", "14.27", "14.76", "**1.034x**",
                     "1.018..1.050", "1.032x", "50", "abcdef1", "`benchmarks/results/i.json`"]
    assert gen.idle_cost_rows([(gen.ROOT / "p.json", plain)]) == []  # no idle file: no table
    spun = dict(r, idle={**r["idle"], "spin": True})
    assert _cells(gen.idle_cost_rows([(gen.ROOT / "s.json", spun)])[2])[4] == "50 spinning"


def test_matrix_headings_say_when_every_call_came_after_an_idle():
    gen = _generator()
    r = {"command": "matrix", "workload": {"id": "libero-pi0"}, "mode": "model", "variant": {"label": "graph;best"},
         "env": {"gpu": "NVIDIA H200"}, "iters": 50, "warmup": 10, "variants": []}
    assert gen._idle_note(r) == "" and gen._idle_note(dict(r, idle_ms=0.0)) == ""  # back to back
    text = "\n".join(gen.matrix_tables([(gen.ROOT / "m.json", dict(r, idle_ms=50.0, idle_spin=True))]))
    assert "warm-up calls per variant, each timed call after 50 ms spinning (`--idle-ms`); speedup = " in text


def test_matrix_headings_name_a_dtype_other_than_bfloat16():
    """The page's models are bfloat16: a `matrix --dtype float32` says so in its heading (session 67's float32 matrix
    of `best` against the kernels was the first), and a bfloat16 one, or one from before the field, does not."""
    gen = _generator()
    r = {"command": "matrix", "workload": {"id": "libero-pi0"}, "mode": "model",
         "variant": {"label": "best;graph", "dtype": "float32"}, "env": {"gpu": "NVIDIA H100"}, "iters": 50,
         "warmup": 10, "variants": []}
    heading = gen.matrix_tables([(gen.ROOT / "m.json", r)])[0]
    assert heading.startswith("### matrix `best;graph` on libero-pi0, float32, model mode ("), heading
    for variant in ({"label": "best;graph", "dtype": "bfloat16"}, {"label": "best;graph"}):
        assert gen.matrix_tables([(gen.ROOT / "m.json", dict(r, variant=variant))])[0].startswith(
            "### matrix `best;graph` on libero-pi0, model mode (")


def test_rollout_cadence_rows_show_the_loop_against_its_own_closed_loop_and_the_servers_keep_warm():
    gen = _generator()
    summary = lambda median, count: {"median": median, "count": count}  # noqa: E731
    ro = {"control_hz": 10.0, "replan_every": 5, "policy_call_ms": dict(summary(15.14, 30), p95=16.9),
          "server_infer_ms": summary(13.78, 30),
          "back_to_back": {"calls_per_episode": 10, "policy_call_ms": dict(summary(14.42, 20), p95=14.8),
                           "server_infer_ms": summary(13.65, 20)},
          "at_cadence_over_back_to_back": {"policy_call_ms": 15.14 / 14.42, "server_infer_ms": 13.78 / 13.65},
          "at_cadence_extra_ms": {"policy_call_ms": 0.72, "server_infer_ms": 0.13, "server_queue_ms": 0.05,
                                  "front_end_ms": 0.5, "server_handoff_ms": 0.1, "client_side_ms": 0.35}}
    ways = dict(ro["at_cadence_extra_ms"], uplink_ms=0.3, downlink_ms=0.05, client_pack_ms=0.02, client_unpack_ms=0.0)
    r = {"command": "rollout", "workload": {"id": "libero-pi0"}, "rollout": ro,
         "env": {"gpu": "NVIDIA H100 80GB HBM3", "git_commit": "6f40a25f1a"},
         "server": {"levers_label": "for_loop+cuda_graph", "keep_warm_ms": 5.0}}
    older = dict(r, server={"levers_label": "for_loop"})  # a server from before keep-warm: it had none
    no_baseline = dict(r, rollout={k: v for k, v in ro.items() if k != "back_to_back"})  # before session 50
    rows = gen.rollout_cadence_rows([(gen.ROOT / "k.json", r), (gen.ROOT / "o.json", older),
                                     (gen.ROOT / "n.json", no_baseline)])
    table = [row for row in rows if row.startswith("| NVIDIA")]
    assert len(table) == 2  # the file without its own closed-loop calls has no row
    assert _cells(table[0]) == ["NVIDIA H100 80GB HBM3", "libero-pi0", "loop+graph", "5 ms", "10 / 5", "30 / 20", "15.14",
                                "14.42", "**1.050x**", "16.90 / 14.80", "13.78", "13.65", "1.010x", "+0.13 / +0.05 / +0.50", "+0.10 / +0.35",
                                "6f40a25",
                                "`k.json`"]
    assert _cells(table[1])[3] == "off"
    guided = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "r.json", dict(r, rollout=dict(ro, rtc=True)))])
              if row.startswith("| NVIDIA")]
    assert _cells(guided[0])[4] == "10 / 5, RTC"  # a loop that asked for real-time chunking says so
    pinged = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "c.json", dict(r, rollout=dict(
        ro, client_keep_warm_ms=5.0)))]) if row.startswith("| NVIDIA")]
    assert _cells(pinged[0])[3] == "5 ms; client 5 ms"  # the rollout's own keep-warm beside the server's
    quiet = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "q.json", dict(r, server=dict(
        r["server"], keep_warm_quiet=True)))]) if row.startswith("| NVIDIA")]
    assert _cells(quiet[0])[3] == "5 ms, quiet"  # a server whose runs stood aside for a due request (session 53 on)
    waits = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "w.json", dict(r, rollout=dict(
        ro, keep_warm_waited_calls=2)))]) if row.startswith("| NVIDIA")]
    assert _cells(waits[0])[3] == "5 ms (2 waited)"  # the calls at cadence that met a keep-warm run
    split = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "w.json", dict(r, rollout=dict(
        ro, at_cadence_extra_ms=ways)))]) if row.startswith("| NVIDIA")]
    assert _cells(split[0])[14] == "+0.10 / +0.35 (+0.30 / +0.05; +0.02 / +0.00)"  # session 52's: there and back
    older = [row for row in gen.rollout_cadence_rows([(gen.ROOT / "s50.json", dict(r, rollout={
        k: v for k, v in ro.items() if k != "at_cadence_extra_ms"}))]) if row.startswith("| NVIDIA")]
    assert _cells(older[0])[13] == _cells(older[0])[14] == "-"  # a file from before the split
    assert gen.rollout_cadence_rows([(gen.ROOT / "n.json", no_baseline)]) == []  # nothing to show: no heading


def test_scaling_tables_say_each_point_is_a_median_and_show_the_fit():
    gen = _generator()
    fit = {"intercept": 3.5, "slope": 0.925, "r2": 0.99991}
    r = {"command": "scaling", "workload": {"id": "libero-pi0"}, "mode": "model",
         "env": {"gpu": "NVIDIA H200", "git_commit": "abcdef123"},
         "scaling": {"timer": "wall clock", "steps": [1, 10],
                     "series": [{"label": "for_loop", "fit": fit,
                                 "points": [{"steps": 1, "median_ms": 4.5}, {"steps": 10, "median_ms": 12.75}]}]}}
    out = gen.scaling_tables([(gen.ROOT / "benchmarks" / "results" / "s.json", r)])
    assert out[2] == "`benchmarks/results/s.json`; wall clock; each T(N) is its point's median"
    assert _cells(out[4]) == ["variant", "T(1) ms", "T(10) ms", "fit"]
    assert _cells(out[6]) == ["loop", "4.50", "12.75", "3.50 + 0.925*N ms (r^2 0.9999)"]


def test_a_figure_whose_processes_disagree_carries_their_range():
    """`bench --processes N` files report the middle process: in the standing tables a figure whose processes'
    medians differ by 5% or more carries their range (an H100's host-bound reference: 211-335 ms, shown as 332
    alone), one whose processes agree stays a plain figure."""
    gen = _generator()

    def processes(lo, mid, hi):
        return {"count": 3, "headline": 0, "wall_median_ms": {"min": lo, "median": mid, "max": hi},
                "spread_pct": 100 * (hi - lo) / mid}

    ref = _bench(gen, "ref", [], 332.07, processes=processes(211.29, 332.07, 335.04))
    best = _bench(gen, "best", _best_levers(), 13.35, processes=processes(13.33, 13.35, 13.40))
    cells = _cells(gen.headline_rows([ref, best])[2])
    assert cells[3] == "332.07 (3 processes: 211.29-335.04)" and cells[5] == "**13.35**"
    wide = _bench(gen, "best", _best_levers(), 13.35, day=2, processes=processes(12.0, 13.35, 13.5))
    cells = _cells(gen.headline_rows([ref, wide])[2])
    assert cells[3] == "332.07 (3 processes: 211.29-335.04; 2026-12-01)"  # and its day, not best's
    assert cells[5] == "**13.35** (3 processes: 12.00-13.50)"
    readme = _cells(gen.readme_rows([ref, wide])[4])
    assert readme[1] == cells[3] and readme[3] == cells[5]


def test_one_gpus_rows_share_the_floor_of_its_measured_ceilings():
    """Where a file measured a GPU's own ceilings, every row of that GPU in the standing tables is read against the
    floor at those ceilings, not the H200's its own file records (an H100's libero-pi0 at its measured 3.03 TB/s beside
    its libero-pi05 at the H200's 4.23); another GPU's rows keep their files' floors."""
    from vlaperf.models.pi0 import get_config
    from vlaperf.roofline import roofline
    from vlaperf.workloads import get_workload

    gen = _generator()
    own = {"matmul_flops": 700e12, "bandwidth": 3.0e12, "source": "measured on this device"}

    def floor(preset, workload, **ceilings):
        return roofline(get_config(preset), get_workload(workload), images=2, prompt_len=20, **ceilings)

    pi0 = _bench(gen, "pi0", _best_levers(), 14.0, day=2, gpu="NVIDIA H100",
                 roofline={**floor("pi0", "libero-pi0", matmul_flops=700e12, bandwidth=3.0e12), "ceilings": own})
    pi05 = _bench(gen, "pi05", _best_levers(), 13.0, day=1, gpu="NVIDIA H100", roofline=floor("pi05", "libero-pi05"))
    pi05[1]["workload"] = {"id": "libero-pi05", "overrides": {}}
    h200 = _bench(gen, "h200", _best_levers(), 12.0, roofline={"floor_ms": 4.0})
    rows = {(_cells(r)[0], _cells(r)[1]): _cells(r) for r in gen.headline_rows([pi0, pi05, h200])[2:]}
    at_own = floor("pi05", "libero-pi05", matmul_flops=700e12, bandwidth=3.0e12)["floor_ms"]
    assert rows[("NVIDIA H100", "libero-pi05")][7] == f"{13.0 / at_own:.2f}x"
    assert f"{13.0 / at_own:.2f}x" != f"{13.0 / floor('pi05', 'libero-pi05')['floor_ms']:.2f}x"  # the test can tell
    assert rows[("NVIDIA H100", "libero-pi0")][7] == f"{14.0 / pi0[1]['roofline']['floor_ms']:.2f}x"
    assert rows[("NVIDIA H200", "libero-pi0")][7] == "3.00x"  # no H200 file measured: its file's floor
