"""The profiler's CLI subcommands on the tiny workload (CPU): exit codes and result files."""

from __future__ import annotations

import json

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


def test_breakdown_command_policy_mode_engine(tmp_path):
    out = tmp_path / "bd.json"
    assert main(["breakdown", *COMMON, "--levers", "best", "--mode", "policy", "--warmup", "1", "--iters", "3",
                 "--json", str(out)]) == 0
    assert read_result(out)["breakdown"]["path"] == "engine"


def test_scaling_command(tmp_path):
    out, png = tmp_path / "sc.json", tmp_path / "tn.png"
    assert main(["scaling", *COMMON, "--steps", "1,2,4", "--levers", "reference;for_loop", "--warmup", "1",
                 "--iters", "2", "--json", str(out), "--plot", str(png)]) == 0
    r = read_result(out)
    assert [s["label"] for s in r["scaling"]["series"]] == ["reference", "for_loop"]
    assert "r2" in r["scaling"]["fit"] and png.stat().st_size > 0


def test_syncs_command(tmp_path):
    out = tmp_path / "sy.json"
    assert main(["syncs", *COMMON, "--json", str(out)]) == 0
    r = read_result(out)
    assert r["syncs"]["per_call"] == 5  # tiny: 4 steps -> 5 reads of the while condition
    assert main(["syncs", *COMMON, "--levers", "for_loop", "--mode", "policy", "--json", str(out)]) == 0
    assert read_result(out)["syncs"]["hidden_per_call"] == 0


def test_doctor_command(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    out = tmp_path / "doc.json"
    code = main(["doctor", *COMMON, "--json", str(out)])
    r = read_result(out)
    assert code == exit_code(r["findings"]) == r["exit_code"]
    assert any(f["id"] == "model.host_syncs" for f in r["findings"])
    env_only = tmp_path / "env.json"
    code = main(["doctor", "--device", "cpu", "--json", str(env_only)])
    assert code in (0, 1) and read_result(env_only)["workload"]["id"] is None
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    assert main(["doctor", "--device", "cpu", "--no-measure"]) == 1


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


def test_report_rejects_unknown_format(tmp_path):
    main(["syncs", *COMMON, "--json", str(tmp_path / "sy.json")])
    assert main(["report", str(tmp_path / "sy.json"), "-o", str(tmp_path / "r.pdf")]) == 2


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
