"""`vlaperf bench --processes N`: the same bench in N fresh processes, the middle one reported with the spread."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlaperf.profile.processes import combine, headline_index, process_problem


def _result(median: float, first: float = 1.0, rel_l2: float | None = 1e-3) -> dict:
    summary = {k: median for k in ("mean", "median", "p90", "p95", "p99", "min", "max")} | {"count": 3, "std": 0.0}
    return {"schema": "vlaperf.result/1", "command": "bench", "workload": {"id": "tiny", "overrides": {}},
            "variant": {"levers": ["for_loop"], "label": "for_loop", "dtype": "float32"}, "mode": "model",
            "timers": {"wall_ms": summary, "cuda_event_ms": None}, "samples": {"wall_ms": [median] * 3},
            "first_call_s": first, "warmup_s": 0.1, "peak_memory_bytes": None,
            "equivalence": None if rel_l2 is None else {"rel_l2": rel_l2, "passed": True},
            "env": {"git_commit": f"c{median}", "timestamp": f"t{median}"}}


def test_the_middle_process_is_reported_and_the_spread_is_of_every_median():
    results = [_result(5.0, first=9.0), _result(3.0), _result(4.0, rel_l2=2e-3)]
    combined = combine(results)
    p = combined["processes"]
    assert p["headline"] == 2 and combined["timers"] == results[2]["timers"]
    assert combined["samples"] == results[2]["samples"] and combined["env"] == results[2]["env"]
    assert p["count"] == 3 and p["wall_median_ms"] == {"min": 3.0, "median": 4.0, "max": 5.0}
    assert p["spread_pct"] == pytest.approx(50.0)
    assert [r["first_call_s"] for r in p["runs"]] == [9.0, 1.0, 1.0]
    assert [r["rel_l2"] for r in p["runs"]] == [1e-3, 1e-3, 2e-3]
    assert [r["git_commit"] for r in p["runs"]] == ["c5.0", "c3.0", "c4.0"]
    assert "samples" not in p["runs"][0]  # the raw samples stay with the reported process
    assert "processes" not in results[2]  # the inputs are not changed
    assert process_problem(p) is None


def test_an_even_count_reports_a_measured_process_not_an_average():
    assert headline_index([1.0, 4.0, 2.0, 3.0]) == 2  # the lower middle one: 2.0
    p = combine([_result(m) for m in (1.0, 4.0, 2.0, 3.0)])["processes"]
    assert p["headline"] == 2 and p["wall_median_ms"]["median"] == 2.5
    assert headline_index([7.0]) == 0
    with pytest.raises(ValueError, match="combine needs at least one result"):  # not statistics' own error
        combine([])


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(count=5), "processes.count: expected the number of runs (2), got 5"),
    (lambda p: p.update(headline=2), "processes.headline: expected the index of a run (0..1), got 2"),
    (lambda p: p.update(headline=True), "processes.headline: expected the index of a run (0..1), got True"),
    (lambda p: p.update(runs=[]), "processes.runs: expected a non-empty array of objects"),
    (lambda p: p["runs"][1]["timers"].pop("wall_ms"), "processes.runs[1].timers.wall_ms: expected a summary object"),
    (lambda p: p["runs"][0]["timers"]["wall_ms"].update(median="4"), "processes.runs[0].timers.wall_ms.median: expected a number"),
    (lambda p: p["wall_median_ms"].pop("max"), "processes.wall_median_ms: expected an object of numbers"),
    (lambda p: p.update(spread_pct=None), "processes.spread_pct: expected a number, got null"),
])
def test_a_damaged_processes_record_is_named(change, message):
    p = copy.deepcopy(combine([_result(3.0), _result(4.0)])["processes"])
    change(p)
    assert process_problem(p).startswith(message)
    assert process_problem([1]) == "processes: expected an object, got array"
    assert process_problem(None) is None


def test_bench_processes_runs_the_command_in_fresh_processes_and_writes_the_middle_one(tmp_path, capsys):
    from vlaperf.cli import main
    from vlaperf.report.render import field_problem
    from vlaperf.report.schema import read_result

    out = tmp_path / "bench.json"
    code = main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", "for_loop", "--warmup", "0",
                 "--iters", "3", "--no-progress", "--processes", "2", "--json", str(out)])
    assert code == 0
    r = read_result(out)
    p = r["processes"]
    assert p["count"] == 2 and len(p["runs"]) == 2 and field_problem(r) is None
    assert r["timers"] == p["runs"][p["headline"]]["timers"]  # the file's figure is one process's, whole
    assert all(run["rel_l2"] is not None and run["first_call_s"] > 0 for run in p["runs"])  # each checked and timed
    assert r["iters"] == 3 and len(r["samples"]["wall_ms"]) == 3 and "processes" in r
    medians = [run["timers"]["wall_ms"]["median"] for run in p["runs"]]
    assert p["wall_median_ms"]["min"] == min(medians) and p["wall_median_ms"]["max"] == max(medians)
    printed = capsys.readouterr().out
    assert "process 1 of 2" in printed and "2 processes, medians" in printed and "(reported)" in printed

    report = tmp_path / "report.md"
    assert main(["report", str(out), "-o", str(report)]) == 0
    text = report.read_text()
    assert "wall median ms, each" in text and f"{p['spread_pct']:.1f}%" in text
    summary = text.split("## Summary")[1].split("\n## ")[0]
    assert "| processes |" in summary and "| 2: " in summary  # the summary row names its processes

    damaged = json.loads(out.read_text())
    damaged["processes"]["runs"] = "x"
    assert field_problem(damaged) == "bench: processes.runs: expected a non-empty array of objects"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(damaged))
    assert main(["report", str(bad), str(out), "-o", str(tmp_path / "r2.md")]) == 0  # listed, the rest renders
    assert "processes.runs" in (tmp_path / "r2.md").read_text()


def test_a_failing_process_stops_the_run_with_its_exit_code(tmp_path, monkeypatch, capsys):
    from vlaperf.cli import main
    from vlaperf.profile import processes

    calls = []

    def fail(cmd):
        calls.append(cmd)
        return 1  # as a child whose variant failed its equivalence check exits

    monkeypatch.setattr(processes, "run_child", fail)
    out = tmp_path / "bench.json"
    code = main(["bench", "--workload", "tiny", "--levers", "for_loop", "--proc", "3", "--json", str(out)])
    assert code == 1 and len(calls) == 1 and not out.exists()
    assert "process 1 of 3 exited with code 1; stopping" in capsys.readouterr().err
    cmd = calls[0]
    # the command as typed, then the options that win: one process of its own, its own file
    assert cmd[cmd.index("bench"):][:7] == ["bench", "--workload", "tiny", "--levers", "for_loop", "--proc", "3"]
    assert cmd[-4:-1] == ["--processes", "1", "--json"] and cmd[-1] != str(out)


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_processes_must_be_a_count_in_range(value, capsys):
    from vlaperf.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--workload", "tiny", "--processes", value])
    assert e.value.code == 2
    assert "--processes: expected an integer >= 1 and <= 64" in capsys.readouterr().err


def _running(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:  # gone
        return False


def test_a_sigterm_to_the_parent_alone_stops_the_running_process_too(tmp_path):
    """A scheduler that stops the job by the parent's pid must not leave a bench running (on the GPU) behind it."""
    cmd = [sys.executable, "-m", "vlaperf.cli", "bench", "--workload", "tiny", "--device", "cpu", "--levers", "for_loop",
           "--no-check", "--warmup", "0", "--iters", "30000", "--no-progress", "--processes", "2",
           "--json", str(tmp_path / "b.json")]
    parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        assert parent.stdout.readline().startswith("vlaperf bench: process 1 of 2")
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
        if not children.exists():
            pytest.skip("this kernel does not list a process's children in /proc")
        deadline = time.monotonic() + 60
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = (int(x) for x in children.read_text().split())
        time.sleep(3)  # into its timed calls
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        left_running = _running(child)
    finally:
        parent.kill()
        if child is not None and _running(child):  # a failure must not leave the bench running for minutes
            os.kill(child, signal.SIGKILL)
    assert parent.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM in process 1 of 2; nothing written" in err
    assert not left_running
    assert not (tmp_path / "b.json").exists()


def test_stage_rows_follow_the_first_process_and_name_a_missing_stage():
    from vlaperf.profile.processes import stage_rows

    p = {"runs": [{"stages_ms": {"setup": 1.0, "prefill": 4.0}}, {"stages_ms": {"setup": 3.0, "prefill": 4.0}},
                  {"stages_ms": {"setup": 2.0, "extra": 1.0}}]}
    assert stage_rows(p) == [("setup", [1.0, 3.0, 2.0], 100.0), ("prefill", [4.0, 4.0, None], 0.0),
                             ("extra", [None, None, 1.0], 0.0)]


def test_breakdown_processes_keep_each_stage_and_the_report_shows_their_spread(tmp_path, capsys):
    from vlaperf.cli import main
    from vlaperf.report.render import field_problem
    from vlaperf.report.schema import read_result

    out = tmp_path / "bd.json"
    code = main(["breakdown", "--workload", "tiny", "--device", "cpu", "--levers", "for_loop", "--mode", "policy",
                 "--warmup", "0", "--iters", "3", "--no-progress", "--processes", "2", "--json", str(out)])
    assert code == 0
    r = read_result(out)
    p = r["processes"]
    assert r["command"] == "breakdown" and p["count"] == 2 and field_problem(r) is None
    names = [e["name"] for e in r["breakdown"]["stages"]]
    assert "input_transform" in names and all(list(run["stages_ms"]) == names for run in p["runs"])
    headline = p["runs"][p["headline"]]["stages_ms"]
    assert headline == {e["name"]: e["median_ms"] for e in r["breakdown"]["stages"]}  # the file is that process's
    printed = capsys.readouterr().out
    assert "process 2 ms" in printed and "input_transform" in printed and "rel L2" not in printed

    report = tmp_path / "report.md"
    assert main(["report", str(out), "-o", str(report)]) == 0
    assert "each stage's median in every process" in report.read_text()
    r["processes"]["runs"][1]["stages_ms"] = {"setup": "slow"}
    assert field_problem(r) == ("breakdown: processes.runs[1].stages_ms: expected an object of numbers (a stage's "
                                "median ms)")


def test_breakdown_processes_refuse_a_trace(tmp_path, capsys):
    from vlaperf.cli import main

    assert main(["breakdown", "--workload", "tiny", "--processes", "2", "--trace", str(tmp_path / "t.json")]) == 2
    assert "--trace with --processes" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["breakdown", "--workload", "wam-tiny", "--mode", "policy"], "--mode policy: the world-action breakdown times "
     "generate on device tensors (--mode model)"),
    (["bench", "--workload", "wam-tiny", "--mode", "policy"], "--mode policy: the world-action model has no "
     "observation transform"),
    (["bench", "--workload", "wam-tiny", "--rtc"], "--rtc: real-time chunking is the pi0 family's"),
    (["bench", "--workload", "wam-tiny", "--mode", "forward", "--cfg-scale", "3"], "--mode forward"),
    (["bench", "--workload", "tiny", "--sparsity", "drop_middle"], "--sparsity: only for the world-action workloads"),
    (["bench", "--workload", "tiny", "--mode", "forward"], "--mode forward: only for the world-action workloads"),
    (["bench", "--workload", "tiny", "--levers", "none", "--release-reference"], "--release-reference needs an "
     "engine variant"),
])
def test_processes_refuse_what_every_process_would_refuse_before_starting_one(argv, message, monkeypatch, capsys):
    """A setting the command refuses is refused in the parent, not inside the first of --processes' children (which
    costs a process start, and a model build for some)."""
    from vlaperf.cli import main
    from vlaperf.profile import processes

    started = []
    monkeypatch.setattr(processes, "in_processes", lambda *a: started.append(a) or 0)
    assert main([*argv, "--device", "cpu", "--no-progress", "--processes", "2"]) == 2
    assert message in capsys.readouterr().err and started == []


def test_performance_md_lists_a_breakdowns_stages_in_every_process():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_performance_md", root / "benchmarks" / "make_performance_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    results = []
    for median, setup in ((5.0, 0.2), (4.0, 0.1)):
        r = _result(median)
        r.update(command="breakdown", breakdown={"timer": "perf_counter", "iters": 3, "stages": [
            {"name": "setup", "median_ms": setup, "p95_ms": setup, "share": 0.1, "per_call": 1}]})
        r["env"].update(gpu=None, torch="2.13", cuda=None, driver=None)
        results.append(r)
    combined = combine(results)
    lines = gen.breakdown_tables([(root / "benchmarks" / "results" / "bd.json", combined)])
    assert "| stage | process 1 ms | process 2 ms | spread |" in lines
    assert "| setup | 0.20 | 0.10 | 66.7% |" in lines  # (0.2 - 0.1) / 0.15


def test_an_interrupt_kills_the_running_process(monkeypatch):
    """Ctrl-C sent to the parent alone (not its process group) must not leave the child running."""
    from vlaperf.profile import processes

    started = []
    popen = subprocess.Popen

    def record(*a, **k):
        started.append(popen(*a, **k))
        return started[-1]

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", record)
    sigterm = signal.getsignal(signal.SIGTERM)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            processes.run_child([sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    (child,) = started
    assert child.returncode == -signal.SIGKILL  # killed and reaped, not left sleeping
    assert signal.getsignal(signal.SIGTERM) == sigterm  # the forwarding handler is gone again


def test_a_process_ended_by_a_signal_stops_the_run_with_128_plus_its_number(tmp_path, monkeypatch, capsys):
    """A process the kernel's out-of-memory killer ends (SIGKILL): the run stops with 137, as a shell reports it, and
    names the signal; returning Popen's -9 as the code left the program with status 247 and no signal named."""
    from vlaperf.cli import main
    from vlaperf.profile import processes

    monkeypatch.setattr(processes, "run_child", lambda cmd: -signal.SIGKILL)
    out = tmp_path / "bench.json"
    code = main(["bench", "--workload", "tiny", "--levers", "for_loop", "--processes", "3", "--json", str(out)])
    assert code == 137 and not out.exists()
    assert "process 1 of 3 was ended by signal SIGKILL (9); stopping" in capsys.readouterr().err


def test_each_breakdown_process_keeps_its_own_coverage_and_exactness(capsys):
    """The per-stage spread holds every process's stages, so every process's checks of them come along: a process
    whose instrumented call ran far from its untimed one (or whose staged call differed) is named in the file and
    the table, not only when it is the reported one."""
    from vlaperf.profile.processes import print_processes

    results = []
    for median, coverage, exact in ((4.0, 1.01, True), (5.0, 3.72, False), (3.0, 0.99, True)):
        r = _result(median, rel_l2=None)
        r.update(command="breakdown", breakdown={"coverage": coverage, "matches_reference": {"exact": exact},
                                                 "stages": [{"name": "setup", "median_ms": median / 10}]})
        results.append(r)
    p = combine(results)["processes"]
    assert p["headline"] == 0
    assert [r["coverage"] for r in p["runs"]] == [1.01, 3.72, 0.99]
    assert [r["matches_reference"] for r in p["runs"]] == [True, False, True]
    assert process_problem(p) is None
    assert "coverage" not in combine([_result(3.0)])["processes"]["runs"][0]  # a bench has no stages to check
    print_processes(combine(results))
    assert "372.0%, NOT exact" in capsys.readouterr().out


def test_each_process_keeps_its_gpu_state():
    """The GPU's clocks, power and temperature after each process's timed calls: what moves between processes, so
    each is kept, not only the reported process's (whose env the file holds whole)."""
    results = [_result(m) for m in (3.0, 4.0)]
    for r, clock in zip(results, (1980, 1410)):
        r["env"]["gpu_state"] = {"sm_clock_mhz": clock, "temperature_c": 40}
    p = combine(results)["processes"]
    assert [r["gpu_state"]["sm_clock_mhz"] for r in p["runs"]] == [1980, 1410]
    assert combine([_result(3.0)])["processes"]["runs"][0]["gpu_state"] is None  # the CPU has none


SIGTERM_BETWEEN_PROCESSES = """
import os, signal, sys, tempfile
tempfile.tempdir = sys.argv[1]
from vlaperf.profile import processes
calls = []
processes.run_child = lambda cmd: calls.append(cmd) or 0  # a process that succeeded at once


def read_result(path):  # the SIGTERM comes while the first process's result is read, no process running
    os.kill(os.getpid(), signal.SIGTERM)
    return {}


processes.read_result = read_result
import vlaperf.report.schema
vlaperf.report.schema.read_result = read_result
code = processes.in_processes(["bench", "--workload", "tiny"], 3, None)
print("code", code, "processes", len(calls))
"""


def test_a_sigterm_between_processes_stops_the_run_and_leaves_no_folder(tmp_path):
    """A SIGTERM while no process runs ended the parent by the default action: the temporary folder of the
    processes' results stayed behind. It stops the run with 143 as one during a process does, nothing written."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_BETWEEN_PROCESSES, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "code 143 processes 1" in done.stdout
    assert "stopped by SIGTERM after process 1 of 3; nothing written" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_processes_tables_name_a_long_variant_in_short(capsys):
    """best's whole label wrapped the titles of the processes' tables over three lines: they name it in short."""
    from vlaperf.engine.levers import BEST_GPU, TUNED_FOR
    from vlaperf.profile.processes import print_processes

    results = []
    for median in (4.0, 5.0):
        r = _result(median)
        r["variant"]["label"] = "+".join(list(BEST_GPU) + list(TUNED_FOR))
        r.update(command="breakdown", breakdown={"stages": [{"name": "setup", "median_ms": median / 10}]})
        results.append(r)
    print_processes(combine(results))
    out = capsys.readouterr().out
    said = " ".join(line.strip() for line in out.splitlines())  # a 120-column console wraps at a space
    short = "loop+skipimg+trim+kv+sdpa+fuse+graph+c:default+layers+triton+mega"
    assert f"vlaperf breakdown  tiny  {short}  (model mode): stage medians in 2 processes" in said, out
    assert f"vlaperf breakdown  tiny  {short}  (model mode): 2 processes" in said, out


def test_processes_that_disagree_are_said_to(capsys):
    """From a 5% spread between the processes' medians the console says that one process's figure does not stand
    for them (an H100's host-bound reference: 211-335 ms in three processes); below it, nothing more."""
    from vlaperf.profile.processes import print_processes

    print_processes(combine([_result(332.0), _result(335.0), _result(211.0)]))
    said = " ".join(capsys.readouterr().out.split())
    assert "note: the processes disagree by 37.3% (from 5%, beyond what one process's figure stands for)" in said
    print_processes(combine([_result(13.3), _result(13.4), _result(13.35)]))
    assert "disagree" not in capsys.readouterr().out
