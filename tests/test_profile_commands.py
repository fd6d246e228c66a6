"""The profiler's CLI subcommands on the tiny workload (CPU): exit codes and result files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlaperf.cli import main
from vlaperf.profile.doctor import exit_code
from vlaperf.report.schema import read_result


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


COMMON = ["--workload", "tiny", "--device", "cpu", "--no-progress"]


def test_breakdown_command(tmp_path):
    out, tr = tmp_path / "bd.json", tmp_path / "trace.json"
    assert main(["breakdown", *COMMON, "--warmup", "1", "--iters", "4", "--json", str(out), "--trace", str(tr)]) == 0
    r = read_result(out)
    assert r["command"] == "breakdown" and r["breakdown"]["stages"][0]["name"] == "image_0_embed"
    events = json.loads(tr.read_text())["traceEvents"]
    assert any(e.get("name") == "prefix_prefill" for e in events)
    # one file for both: the result would have replaced the trace it announced; refused before anything runs
    before = tr.read_bytes()
    assert main(["breakdown", *COMMON, "--trace", str(tr), "--json", str(tmp_path / "." / "trace.json")]) == 2
    assert tr.read_bytes() == before


def test_breakdown_command_policy_mode_engine(tmp_path, capsys):
    out = tmp_path / "bd.json"
    assert main(["breakdown", *COMMON, "--levers", "best", "--mode", "policy", "--warmup", "1", "--iters", "3",
                 "--json", str(out)]) == 0
    assert read_result(out)["breakdown"]["path"] == "engine"
    # the title a line of its own in short names (a table's title wrapped best's label at the table's width)
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "vlaperf breakdown  tiny  loop+skipimg+trim+kv+sdpa+fuse  (policy mode, float32, cpu, ")
    assert read_result(out)["breakdown"]["idle_ms"] == 0.0


def test_breakdown_command_idle_ms(tmp_path, capsys):
    out = tmp_path / "bd.json"
    assert main(["breakdown", *COMMON, "--mode", "policy", "--warmup", "1", "--iters", "2", "--idle-ms", "5",
                 "--json", str(out)]) == 0
    assert read_result(out)["breakdown"]["idle_ms"] == 5.0 and read_result(out)["breakdown"]["idle_spin"] is False
    assert "each call after 5 ms idle" in " ".join(capsys.readouterr().out.split())
    assert main(["breakdown", *COMMON, "--warmup", "1", "--iters", "2", "--idle-ms", "5", "--idle-spin",
                 "--json", str(out)]) == 0
    assert read_result(out)["breakdown"]["idle_spin"] is True
    assert "each call after 5 ms spinning" in " ".join(capsys.readouterr().out.split())
    assert main(["breakdown", *COMMON, "--idle-spin"]) == 2
    assert "--idle-spin: spins through the idle that --idle-ms gives" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's exit
        main(["breakdown", *COMMON, "--idle-ms", "-1"])
    assert exited.value.code == 2
    assert "argument --idle-ms: expected a number > 0 and <= 10000, got -1" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["scaling", "matrix", "compare"])
def test_interleaved_commands_refuse_a_warmup_of_0_and_say_why(command, capsys):
    """matrix, compare and scaling time their variants in rounds: a first call (compile, capture) inside a round
    would spoil that round's ratio, so --warmup 0 is refused at parsing (scaling took it as 1 without a word)
    and the help says the count includes the first call, timed on its own."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--workload", "tiny", "--device", "cpu", "--warmup", "0"])
    assert exited.value.code == 2
    assert "argument --warmup: expected an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([command, "--help"])
    # a matrix row's first call is made when the row is prepared, before its check: its help says so instead
    expected = ("after its first call (compile, capture), which is timed on its own when its row is prepared"
                if command == "matrix" else "so that no round holds a first call")
    assert expected in " ".join(capsys.readouterr().out.split())


def test_scaling_command(tmp_path):
    out, png = tmp_path / "sc.json", tmp_path / "tn.png"
    assert main(["scaling", *COMMON, "--steps", "1,2,4", "--levers", "reference;for_loop", "--warmup", "1",
                 "--iters", "2", "--json", str(out), "--plot", str(png)]) == 0
    r = read_result(out)
    assert [s["label"] for s in r["scaling"]["series"]] == ["reference", "for_loop"]
    assert "r2" in r["scaling"]["fit"] and png.stat().st_size > 0
    assert r["mode"] == "model" and r["variant"]["levers"] == []  # several variants: their label names them
    # one variant: its levers as resolved, as a bench file records them (they read as the reference's before)
    assert main(["scaling", *COMMON, "--steps", "1,2", "--levers", "exact", "--warmup", "1", "--iters", "1",
                 "--json", str(out)]) == 0
    from vlaperf.engine.levers import Levers

    assert read_result(out)["variant"]["levers"] == Levers.parse("exact", "cpu").names() != []


def test_scaling_resolves_best_for_the_models_dtype_when_it_refuses_a_variant_given_twice(monkeypatch, capsys):
    """On a Hopper GPU `best` of a float32 model is compile + graph without the kernels (the engine's parse): scaling
    resolved it without the dtype, so `best` and its float32 lever list were two series of one engine (the second
    overwrote the first), and `best` beside its bfloat16 list (kernels included) was refused as the same variant."""
    import vlaperf.engine.levers as levers_mod
    import vlaperf.profile.commands as commands
    from vlaperf.engine.levers import Levers
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    cuda = torch.device("cuda")
    fp32, bf16 = (",".join(Levers.parse("best", cuda, dt).names()) for dt in (torch.float32, torch.bfloat16))
    assert "megakernel" in bf16 and "megakernel" not in fp32

    class Built(Exception):  # past the refusal: the variants would be built and timed
        pass

    monkeypatch.setattr(commands, "_levers_or_error", lambda model, spec: (_ for _ in ()).throw(Built(spec)))
    for dtype, same, other in ((torch.float32, fp32, bf16), (torch.bfloat16, bf16, fp32)):
        model = build_model("tiny", "cpu", dtype)
        monkeypatch.setattr(commands, "setup", lambda args: (get_workload("tiny"), get_workload("tiny"), model, cuda))
        assert main(["scaling", "--workload", "tiny", "--steps", "1,2", "--levers", f"best;{same}"]) == 2
        assert f"--levers: 'best' and '{same}' are the same variant on cuda" in capsys.readouterr().err, dtype
        with pytest.raises(Built):
            main(["scaling", "--workload", "tiny", "--steps", "1,2", "--levers", f"best;{other}"])


def test_scaling_command_in_policy_mode(tmp_path, capsys):
    out = tmp_path / "sc.json"
    assert main(["scaling", *COMMON, "--steps", "1,3", "--levers", "for_loop", "--mode", "policy", "--warmup", "1",
                 "--iters", "2", "--json", str(out)]) == 0
    r = read_result(out)
    assert r["mode"] == r["scaling"]["mode"] == "policy" and [p["steps"] for p in r["scaling"]["series"][0]["points"]] == [1, 3]
    printed = capsys.readouterr().out
    assert "(policy mode, cpu;" in printed
    assert "(2 points: a line fits any two" in printed and "r^2" not in printed.replace("no r^2", "")  # 1, always


def test_syncs_command(tmp_path):
    out = tmp_path / "sy.json"
    assert main(["syncs", *COMMON, "--json", str(out)]) == 0
    r = read_result(out)
    assert r["syncs"]["per_call"] == 5  # tiny: 4 steps -> 5 reads of the while condition
    assert main(["syncs", *COMMON, "--levers", "for_loop", "--mode", "policy", "--json", str(out)]) == 0
    assert read_result(out)["syncs"]["hidden_per_call"] == 0


def test_doctor_command(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    out = tmp_path / "doc.json"
    code = main(["doctor", *COMMON, "--json", str(out)])
    r = read_result(out)
    assert code == exit_code(r["findings"]) == r["exit_code"]
    assert any(f["id"] == "model.host_syncs" for f in r["findings"])
    # the console says how each cost was measured (or why it was not resolved), as the file does
    console = " ".join(capsys.readouterr().out.split())
    noted = [f for f in r["findings"] if f.get("cost_note")]
    assert noted and all(" ".join(f["cost_note"].split())[:40] in console for f in noted)
    env_only = tmp_path / "env.json"
    code = main(["doctor", "--device", "cpu", "--json", str(env_only)])
    assert code in (0, 1) and read_result(env_only)["workload"]["id"] is None
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    assert main(["doctor", "--device", "cpu", "--no-measure"]) == 1


def test_a_spaced_levers_none_is_the_reference_on_the_world_action_model_too(tmp_path, capsys):
    """--levers ' none' (a leading space) is the reference for syncs, doctor and bench on wam-tiny, as on the pi0
    path (which strips it); it was refused as an unknown world-action-model lever 'none'. doctor with no workload
    and ' none' is the environment alone, as with 'none'."""
    wam = ["--workload", "wam-tiny", "--device", "cpu", "--levers", " none"]
    assert main(["syncs", *wam, "--calls", "1", "--warmup", "0", "--json", str(tmp_path / "s.json")]) == 0
    assert read_result(tmp_path / "s.json")["variant"]["label"] == "reference"
    assert main(["doctor", *wam, "--no-measure", "--json", str(tmp_path / "d.json")]) in (0, 1)
    assert read_result(tmp_path / "d.json")["variant"]["levers"] == []
    assert main(["bench", *wam, "--iters", "1", "--warmup", "0", "--no-progress", "--json", str(tmp_path / "b.json")]) \
        == 0
    assert read_result(tmp_path / "b.json")["variant"]["label"] == "reference"
    assert "unknown" not in capsys.readouterr().err
    env_only = ["doctor", "--device", "cpu", "--levers", " none", "--no-measure", "--json", str(tmp_path / "e.json")]
    assert main(env_only) in (0, 1)
    assert read_result(tmp_path / "e.json")["workload"]["id"] is None


def test_doctor_table_wraps_a_cited_file_instead_of_cutting_it(capsys):
    """A finding's detail cites a result file by its path, one word wider than its column: it was cut to
    'benchmarks/results/h200/matrix_wam-761_levers…', so the file could not be found. It now wraps."""
    main(["doctor", "--workload", "wam-tiny", "--device", "cpu", "--sparsity", "drop_middle", "--no-measure"])
    out = capsys.readouterr().out
    assert "…" not in out
    joined = "".join(line.strip("│ ") for line in out.splitlines())  # the cells' pieces, borders dropped
    assert "benchmarks/results/h200/matrix_wam-761_levers_s18.json" in joined


def test_report_command(tmp_path):
    main(["syncs", *COMMON, "--json", str(tmp_path / "sy.json")])
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("argv", [
    ["breakdown", "--levers", "no_such_lever", *COMMON],
    ["scaling", "--steps", "5", *COMMON],
    ["scaling", "--steps", "a,b", *COMMON],
    ["report", "/no/such/file.json", "-o", "x.html"],
    ["breakdown", "--workload", "no-such-workload", "--device", "cpu"],
])
def test_bad_arguments_exit_2(argv, tmp_path, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    assert code == 2


def test_report_rejects_unknown_format(tmp_path, capsys):
    main(["syncs", *COMMON, "--json", str(tmp_path / "sy.json")])
    assert main(["report", str(tmp_path / "sy.json"), "-o", str(tmp_path / "r.pdf")]) == 2
    # the CLI names the command once (render's own message starts 'report: ' for callers from Python)
    assert "vlaperf report: error: output must end in .html or .md (any case), got 'r.pdf'" in capsys.readouterr().err


def test_report_of_a_folder_without_json_files_says_so(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a result")
    assert main(["report", str(empty), "-o", str(tmp_path / "r.md")]) == 2
    assert f"vlaperf report: error: no *.json result files in {empty}" in capsys.readouterr().err
    (empty / "bad.json").write_text("{")  # a file was tried: the message says why it failed instead
    assert main(["report", str(empty), "-o", str(tmp_path / "r.md")]) == 2
    assert "no valid vlaperf result files: " in capsys.readouterr().err


def _with_profiler_commands(cli):
    """vlaperf.cli.build_parser plus register(), as cli.py does once it is wired in."""
    import argparse

    from vlaperf.profile.commands import register

    original = cli.build_parser

    def build():
        parser = original()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if "breakdown" not in sub.choices:
            register(sub)
        return parser

    return build


def test_register_into_the_vlaperf_cli(monkeypatch, tmp_path):
    from vlaperf import cli

    monkeypatch.setattr(cli, "build_parser", _with_profiler_commands(cli))
    assert cli.main(["syncs", *COMMON, "--json", str(tmp_path / "sy.json")]) == 0
    assert cli.main(["breakdown", "--levers", "nope", *COMMON]) == 2  # CliError -> 2 via cli.main
    assert cli.main(["levers"]) == 0  # the existing commands still work


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse errors
        return e.code


@pytest.mark.parametrize("steps,message", [
    ("0,1", "expected at least two different step counts in 1..1000, got '0,1'"),
    ("2,2", "expected at least two different step counts in 1..1000, got '2,2'"),
    ("1,1001", "expected at least two different step counts in 1..1000, got '1,1001'"),
])
def test_scaling_step_lists_are_checked(steps, message, capsys):
    from vlaperf.profile.commands import _step_list

    assert _step_list(" 1000, 1,2,1") == [1, 2, 1000]
    assert run(["scaling", *COMMON, "--steps", steps]) == 2
    assert message in capsys.readouterr().err


def test_syncs_expected_and_treat_as_device(tmp_path):
    """Model mode expects no sync, policy mode one (reading the actions); --treat-as-device no does not count the
    CPU's host reads, yes does."""
    out = tmp_path / "sy.json"
    assert main(["syncs", *COMMON, "--treat-as-device", "yes", "--json", str(out)]) == 0
    rep = read_result(out)["syncs"]
    assert rep["expected_per_call"] == 0 and rep["treat_as_device"] is True and rep["per_call"] == 5
    assert main(["syncs", *COMMON, "--treat-as-device", "no", "--mode", "policy", "--json", str(out)]) == 0
    rep = read_result(out)["syncs"]
    assert rep["expected_per_call"] == 1 and rep["treat_as_device"] is False and rep["per_call"] == 0


@pytest.mark.parametrize("argv,message", [
    (["breakdown", "--workload", "wam-tiny", "--mode", "policy"], "vlaperf breakdown: error: --mode policy: the "
     "world-action breakdown times generate on device tensors (--mode model)"),
    (["syncs", "--workload", "wam-tiny", "--mode", "policy"], "vlaperf syncs: error: --mode policy: the world-action "
     "model has no observation transform in vlaperf; use --mode model"),
    (["scaling", "--workload", "wam-tiny", "--mode", "policy"], "vlaperf scaling: error: --mode policy: the "
     "world-action model has no observation transform"),
    (["doctor", "--batch", "2"], "--batch: settings of a policy check; give --workload"),
    (["doctor", "--action-horizon", "5", "--cfg-scale", "1"], "--action-horizon, --cfg-scale: settings of a policy "
     "check"),
])
def test_profiler_commands_refuse_settings_they_would_ignore(argv, message, capsys):
    assert run([*argv, "--device", "cpu", "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("warmup", "made"), [(0, 1), (2, 2)])
def test_breakdown_warmup_0_is_1_as_its_help_says(tmp_path, monkeypatch, warmup, made):
    """--warmup 0 makes one warm-up call of the instrumented call (its first call is never a stage sample) and the
    file says 1: the help said "at least 1", which read as 0 being refused, as matrix, compare and scaling do."""
    import argparse

    from vlaperf.cli import build_parser
    from vlaperf.profile import breakdown as bd_mod
    from vlaperf.profile.markers import NULL_RECORDER

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    help_text = next(a.help for a in sub.choices["breakdown"]._actions if "--warmup" in a.option_strings)
    assert "0 is 1" in help_text and "at least 1" not in help_text
    instrumented = []
    inner = bd_mod.breakdown_fn

    def counting(call, **kw):
        def counted(rec):
            if rec is not NULL_RECORDER:
                instrumented.append(1)
            return call(rec)
        return inner(counted, **kw)

    monkeypatch.setattr(bd_mod, "breakdown_fn", counting)
    out = tmp_path / "bd.json"
    assert main(["breakdown", *COMMON, "--warmup", str(warmup), "--iters", "2", "--json", str(out)]) == 0
    r = read_result(out)
    assert len(instrumented) == made + 2 and r["warmup"] == made and r["breakdown"]["warmup"] == made


def test_breakdown_of_none_is_the_reference_and_the_trace_is_recorded(tmp_path, capsys):
    out, tr = tmp_path / "bd.json", tmp_path / "trace.json"
    assert main(["breakdown", *COMMON, "--levers", "none", "--warmup", "0", "--iters", "1", "--json", str(out),
                 "--trace", str(tr)]) == 0
    bd = read_result(out)["breakdown"]
    assert bd["path"] == "reference" and bd["trace"] == str(tr)
    printed = capsys.readouterr().out
    assert f"wrote trace {tr}" in printed and "CUDA graph replay" not in printed


def test_wam_breakdown_of_the_reference_names_no_levers(tmp_path):
    out = tmp_path / "bd.json"
    assert main(["breakdown", "--workload", "wam-tiny", "--device", "cpu", "--no-progress", "--warmup", "0", "--iters",
                 "1", "--json", str(out)]) == 0
    r = read_result(out)
    assert r["variant"]["levers"] == [] and r["breakdown"]["levers_timed"] == []


def test_doctor_scope_follows_workload_checkpoint_and_levers(tmp_path):
    """--levers none is the environment alone; --checkpoint alone checks that policy on the default workload;
    --no-measure leaves the model checks' costs unmeasured."""
    from vlaperf.checkpoints import save_checkpoint
    from vlaperf.models.pi0 import build_model

    out = tmp_path / "d.json"
    main(["doctor", "--device", "cpu", "--levers", "none", "--no-measure", "--json", str(out)])
    assert read_result(out)["workload"]["id"] is None
    checkpoint = save_checkpoint(build_model("tiny", seed=3), tmp_path / "ckpt")
    main(["doctor", "--device", "cpu", "--checkpoint", str(checkpoint), "--no-measure", "--json", str(out)])
    r = read_result(out)
    assert r["workload"]["id"] == "tiny" and r["variant"]["checkpoint"]
    masked = [f for f in r["findings"] if f["id"] == "model.masked_images_embedded"]
    assert masked and masked[0]["cost"] is None


def test_report_lists_skipped_files_and_needs_matplotlib(monkeypatch, tmp_path, capsys):
    import vlaperf.report.render as render_mod

    (tmp_path / "a.json").write_text("{}")
    long = "a.json: " + "y" * 400

    def render(paths, out, on_skip=None, jobs=None):
        on_skip(long)
        return out

    monkeypatch.setattr(render_mod, "render", render)
    assert main(["report", str(tmp_path / "a.json"), "-o", str(tmp_path / "r.html")]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"skipped {long[:299]}…\n"
    assert f"wrote {tmp_path / 'r.html'} (1 file(s) skipped, listed above and in the report)" in captured.out


# committed GPU result files of every plotting section but the step kernel's (bench, matrix, breakdown, scaling,
# loadgen, compare)
_PLOTTED = ["bench_libero-pi0_best-s68-4proc_model.json", "matrix_libero-pi0_grid_s29.json",
            "breakdown_libero-pi0_best-s30.json", "scaling_libero-pi0_reference_best-s25.json",
            "loadgen_libero-pi0_best.json", "compare_libero-pi0_lerobot.json"]


def _without_matplotlib(args: list[str], cwd) -> subprocess.CompletedProcess:
    """`vlaperf ARGS` in a fresh interpreter where `import matplotlib` fails, as on a plain `pip install vlaperf`."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from vlaperf.cli import main\n"
            f"sys.exit(main({args!r}))")
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_report_without_matplotlib_keeps_every_table_and_says_the_plots_are_out(tmp_path):
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200"
    paths = [str(results / name) for name in _PLOTTED]
    assert all(Path(p).exists() for p in paths), "a committed result file the test reads is gone"
    out = tmp_path / "r.md"
    proc = _without_matplotlib(["report", *paths, "-o", str(out), "--jobs", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'no plots: matplotlib is not installed (pip install "vlaperf[plots]")' in proc.stderr
    assert "skipped" not in proc.stderr  # no section lost to the missing plots
    text = out.read_text()
    assert "No plots: matplotlib is not installed here." in text
    assert "![" not in text and not (tmp_path / "r_files").exists()
    # the same files with matplotlib: the same sections, each table the same, and the plots besides
    from vlaperf.report.render import render

    with_plots = tmp_path / "p.md"
    render(paths, with_plots, jobs=1)
    plotted = with_plots.read_text()
    assert plotted.count("![") >= len(_PLOTTED)

    def tables(md: str) -> list[str]:
        return [line for line in md.splitlines() if line.startswith("|") and "generated" not in line]

    assert tables(text) == tables(plotted)
    headings = [line for line in plotted.splitlines() if line.startswith("#")]
    assert headings == [line for line in text.splitlines() if line.startswith("#")]


def test_scaling_plot_without_matplotlib_is_refused_before_the_run(tmp_path):
    proc = _without_matplotlib(["scaling", "--workload", "tiny", "--steps", "1,2", "--plot", str(tmp_path / "t.png"),
                                "--json", str(tmp_path / "s.json"), "--no-progress"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert '--plot needs matplotlib, which is not installed: pip install "vlaperf[plots]"' in proc.stderr
    assert "Traceback" not in proc.stderr and "T(1)" not in proc.stdout  # refused, not measured and lost
    assert not (tmp_path / "s.json").exists()


def test_scaling_writes_its_result_before_the_plot(monkeypatch, tmp_path):
    """A plot that fails (a full disk, a broken matplotlib) leaves the measurement written."""
    import vlaperf.profile.scaling as scaling_mod

    def broken_plot(*args, **kwargs):
        raise RuntimeError("the plot failed")

    monkeypatch.setattr(scaling_mod, "plot_scaling", broken_plot)
    with pytest.raises(RuntimeError, match="the plot failed"):
        main(["scaling", "--workload", "tiny", "--steps", "1,2", "--warmup", "1", "--iters", "2", "--no-progress",
              "--plot", str(tmp_path / "t.png"), "--json", str(tmp_path / "s.json")])
    assert read_result(str(tmp_path / "s.json"))["scaling"]["steps"] == [1, 2]
