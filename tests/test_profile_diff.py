"""`vlaperf diff BEFORE.json AFTER.json`: two bench files' change, its sampling interval, and whether it is beyond
the process spread (files of `bench --processes N`)."""

from __future__ import annotations

import json

import pytest

from vlaperf.profile.diff import bootstrap_ratio, diff, mann_whitney_p, mismatches, verdict
from vlaperf.profile.processes import combine
from vlaperf.report.schema import ENV_KEYS


def _result(median: float, workload: str = "tiny", gpu: str | None = None, spread: float = 0.0) -> dict:
    samples = [median - spread, median, median + spread]
    summary = {"count": 3, "mean": median, "median": median, "p90": median + spread, "p95": median + spread,
               "p99": median + spread, "min": median - spread, "max": median + spread, "std": spread}
    return {"schema": "vlaperf.result/1", "command": "bench", "workload": {"id": workload, "overrides": {}},
            "variant": {"levers": [], "label": "reference", "dtype": "float32"}, "mode": "model",
            "timers": {"wall_ms": summary, "cuda_event_ms": None}, "samples": {"wall_ms": samples, "cuda_event_ms": None},
            "first_call_s": 0.1, "warmup_s": 0.1, "warmup": 1, "iters": 3, "peak_memory_bytes": None,
            "equivalence": None, "env": {k: None for k in ENV_KEYS} | {"gpu": gpu, "git_commit": "abc"}}


def _processes(*medians: float, **kw) -> dict:
    return combine([_result(m, **kw) for m in medians])


def _p_by_pairs(before, after):
    """The same test from its definition: U counts the pairs in which after is larger (a tie a half), over every
    split of the pooled values."""
    import itertools

    def u(a, b):
        return sum((y > x) + 0.5 * (y == x) for x in a for y in b)

    pooled, n = before + after, len(before)
    centre = n * len(after) / 2
    observed = abs(u(before, after) - centre)
    splits = [([pooled[i] for i in c], [pooled[i] for i in range(len(pooled)) if i not in c])
              for c in itertools.combinations(range(len(pooled)), n)]
    return sum(abs(u(a, b) - centre) >= observed - 1e-9 for a, b in splits) / len(splits)


@pytest.mark.parametrize("before, after", [([1, 2, 2], [2, 3, 4]), ([1, 1, 2, 3], [1, 2, 2, 5]),
                                           ([3.0, 3.0, 3.0], [3.0, 4.0]), ([5, 6, 6, 7], [1, 6, 2])])
def test_mann_whitney_with_ties_agrees_with_its_definition(before, after):
    assert mann_whitney_p(before, after) == pytest.approx(_p_by_pairs(before, after))


def test_exact_mann_whitney_p_of_small_samples():
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)  # the best 3 against 3 can do
    assert mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert mann_whitney_p([5, 6, 7, 8], [1, 2, 3, 4]) == pytest.approx(2 / 70)  # two-sided
    assert mann_whitney_p([1, 3, 5], [2, 4, 6]) == pytest.approx(0.7)
    assert mann_whitney_p([1.0, 1.0], [1.0, 1.0]) == 1.0  # ties: midranks, every split the same
    # C(30, 15) splits: the normal approximation with continuity correction, z = (112.5 - 0.5) / sqrt(581.25) = 4.646
    # (the exact p would be 2 / C(30, 15) = 1.3e-8)
    big = mann_whitney_p(list(range(15)), list(range(100, 115)))
    assert big == pytest.approx(3.392e-6, rel=1e-3)
    assert big == pytest.approx(mann_whitney_p(list(range(100, 115)), list(range(15))))
    assert mann_whitney_p(list(range(0, 30, 2)), list(range(1, 31, 2))) > 0.5


def test_bootstrap_interval_is_deterministic_and_holds_the_ratio():
    assert bootstrap_ratio([2.0] * 10, [1.0] * 10) == (2.0, 2.0)
    # the median of 1..21 resampled: its 2.5th and 97.5th percentiles, not the extremes of the 2000 resamples (5, 18)
    assert bootstrap_ratio([float(x) for x in range(1, 22)], [1.0] * 21) == (7.0, 15.0)
    a, b = [10.0, 11.0, 12.0, 10.5, 11.5], [5.0, 5.5, 6.0, 5.2, 5.8]
    lo, hi = bootstrap_ratio(a, b)
    assert (lo, hi) == bootstrap_ratio(a, b) and lo <= 11.0 / 5.5 <= hi and 1.5 < lo


def test_one_process_a_side_says_the_spread_is_unknown():
    d = diff(_result(10.0, spread=0.5), _result(8.0, spread=0.5))
    wall = d["timers"]["wall_ms"]
    assert wall["before_ms"] == 10.0 and wall["after_ms"] == 8.0 and wall["speedup"] == pytest.approx(1.25)
    assert wall["change_pct"] == pytest.approx(-20.0) and "cuda_event_ms" not in d["timers"]
    lo, hi = wall["speedup_interval_95"]
    assert lo <= 1.25 <= hi
    assert d["processes"] is None and "process-to-process spread is unknown" in verdict(d)
    assert "-20.0% (1.250x)" in verdict(d)


@pytest.mark.parametrize("before, after, ordering, beyond", [
    ((10, 11, 12, 10.5), (8, 8.5, 9, 8.2), "every after process faster than every before process", True),
    ((8, 8.5, 9, 8.2), (10, 11, 12, 10.5), "every after process slower than every before process", True),
    ((10, 11, 12), (8, 8.5, 9), "every after process faster than every before process", False),  # p = 0.1
    ((10, 11, 12, 9), (8, 10.5, 9.5, 8.5), "the two sides' processes overlap", False),
])
def test_process_medians_decide_whether_a_change_is_beyond_the_spread(before, after, ordering, beyond):
    d = diff(_processes(*before), _processes(*after))
    p = d["processes"]
    assert p["before_ms"] == list(before) and p["after_ms"] == list(after)
    assert p["ordering"] == ordering and p["beyond_spread"] is beyond
    text = verdict(d)
    assert ("beyond the process spread" in text) is beyond
    if ordering.startswith("every") and not beyond:
        assert "by chance too" in text and "p = 0.1" in text


def test_only_the_workload_mode_dtype_and_gpu_must_match():
    a = _result(10.0)
    assert mismatches(a, _result(9.0)) == []
    assert mismatches(a, _result(9.0, workload="libero-pi0")) == ["workload differs: tiny before, libero-pi0 after"]
    b = _result(9.0, gpu="NVIDIA H200")
    b["workload"]["overrides"] = {"batch": 4}
    b["mode"] = "policy"
    assert mismatches(a, b) == ["workload overrides differ: none before, batch=4 after",
                                "mode differs: model before, policy after", "GPU differs: none (cpu) before, NVIDIA H200 after"]
    # a world-action file's effective settings count where both files record them (older files have none)
    c, d = _result(9.0), _result(9.0)
    c["workload"]["settings"] = {"steps": 10, "video_steps": 5}
    assert mismatches(c, d) == []
    d["workload"]["settings"] = {"steps": 10, "video_steps": 10}
    assert mismatches(c, d) == ["workload settings differ: video_steps=5 before, video_steps=10 after"]


def _write(tmp_path, name: str, r: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(r))
    return str(path)


def test_diff_command_prints_the_change_and_gates_a_slowdown(tmp_path, capsys):
    from vlaperf.cli import main

    before = _write(tmp_path, "before.json", _processes(10, 11, 12, 10.5))
    after = _write(tmp_path, "after.json", _processes(12.5, 13, 13.5, 12.8))
    assert main(["diff", before, after]) == 0
    out = capsys.readouterr().out
    assert "vlaperf diff  tiny" in out and "every after process slower" in out and "process medians, ms" in out
    assert main(["diff", before, after, "--max-slowdown", "25"]) == 0  # 10.5 -> 12.8 ms, +21.9%: under the gate
    assert main(["diff", before, after, "--max-slowdown", "5"]) == 1
    assert main(["diff", before, after, "--max-slowdown", "21.8"]) == 1
    assert main(["diff", before, after, "--max-slowdown", "22"]) == 0
    assert "above --max-slowdown 5%" in capsys.readouterr().err
    assert main(["diff", after, before, "--max-slowdown", "0"]) == 0  # faster passes any gate


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(command="matrix"), "BEFORE {before}: a 'matrix' file; diff compares two 'bench' or two 'breakdown' files"),
    (lambda r: r.update(workload={"id": "libero-pi0", "overrides": {}}),
     "the files are not comparable: workload differs: libero-pi0 before, tiny after (--allow-mismatch"),
    (lambda r: r["processes"].update(runs="x"), "BEFORE {before}: bench: processes.runs: expected a non-empty array"),
    (lambda r: r.pop("env"), "BEFORE {before}: invalid vlaperf result: missing key 'env'"),
    # a zero median used to end in a ZeroDivisionError, exit 1, read by a CI gate as a slowdown
    (lambda r: r["timers"]["wall_ms"].update(median=0), "BEFORE {before}: timers.wall_ms.median is 0, expected a "
                                                        "positive number of ms"),
    (lambda r: r.update(rtc={"execution_horizon": 5, "max_guidance_weight": 10.0, "schedule": "exp", "delay": 2,
                             "vs_unguided": {"wall_ms": {"unguided_median": 2.5}}}),
     "real-time chunking (bench --rtc) differs: guided (delay=2, execution_horizon=5, max_guidance_weight=10.0, "
     "schedule=exp) before, not guided after"),
    (lambda r: r["env"].update(gpu_state="x"), "BEFORE {before}: invalid vlaperf result: env.gpu_state: expected an "
                                               "object or null, got string"),
    (lambda r: r["env"].update(git_commit=-1), "BEFORE {before}: invalid vlaperf result: env.git_commit: expected a "
                                               "string or null, got number"),
    (lambda r: r["processes"]["runs"][0].update(timers="x"),
     "BEFORE {before}: bench: processes.runs[0].timers: expected an object, got string"),
])
def test_diff_command_refuses_files_it_cannot_compare(tmp_path, capsys, change, message):
    from vlaperf.cli import main

    r = _processes(10, 11)
    change(r)
    before = _write(tmp_path, "before.json", r)
    after = _write(tmp_path, "after.json", _processes(10, 11))
    assert main(["diff", before, after]) == 2
    assert message.format(before=before) in capsys.readouterr().err


def test_diff_command_compares_mismatched_files_when_told_and_names_missing_ones(tmp_path, capsys):
    from vlaperf.cli import main

    before = _write(tmp_path, "before.json", _result(10.0, workload="libero-pi0"))
    after = _write(tmp_path, "after.json", _result(9.0))
    assert main(["diff", before, after, "--allow-mismatch"]) == 0
    assert "warning: workload differs" in capsys.readouterr().out
    # two GPUs: the title names both (it named the first file's alone)
    h200 = _write(tmp_path, "h200.json", _result(12.0, gpu="NVIDIA H200"))
    h100 = _write(tmp_path, "h100.json", _result(13.0, gpu="NVIDIA H100"))
    assert main(["diff", h200, h100, "--allow-mismatch"]) == 0
    assert "(model mode, NVIDIA H200 -> NVIDIA H100)" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "missing.json"), after]) == 2
    assert "missing.json: No such file or directory" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text("{")
    assert main(["diff", str(tmp_path / "broken.json"), after]) == 2
    assert "BEFORE" in capsys.readouterr().err
    (tmp_path / "empty.json").write_text("{}")  # said in one line, not sixteen "missing key" clauses
    assert main(["diff", str(tmp_path / "empty.json"), after]) == 2
    assert 'empty.json: not a vlaperf result file (no "schema" key;' in capsys.readouterr().err
    (tmp_path / "binary.json").write_bytes(b"\xb8\x00\xff" * 10)  # used to be a UnicodeDecodeError, exit 1
    assert main(["diff", str(tmp_path / "binary.json"), after]) == 2
    assert "not a UTF-8 text file (byte 0: invalid start byte)" in capsys.readouterr().err


def test_a_processes_file_against_a_single_process_one_says_which_side_needs_more():
    d = diff(_processes(10, 11, 12, 10.5), _result(9.0))
    assert d["process_counts"] == [4, 1] and d["processes"] is None
    assert "4 processes before, 1 after, so the spread cannot be compared: run the after side with `bench " \
           "--processes 4` too" in verdict(d)
    assert "one process on a side" in verdict(diff(_result(10.0), _result(9.0)))


def test_diff_max_slowdown_with_no_wall_timer_in_common_is_an_error_not_a_pass(tmp_path, capsys):
    from vlaperf.cli import main

    r = _result(9.0)
    del r["timers"]  # valid (timers are optional in the schema), as the audit of session 57 found such a file
    before, after = _write(tmp_path, "before.json", _result(10.0)), _write(tmp_path, "after.json", r)
    assert main(["diff", before, after]) == 0  # shown, with the verdict saying there is no wall timer
    assert "no wall-clock timer in both files" in capsys.readouterr().out
    assert main(["diff", before, after, "--max-slowdown", "5"]) == 2
    assert "--max-slowdown: the files hold no wall_ms timer in common" in capsys.readouterr().err


def test_files_from_two_machines_say_so_before_any_spread():
    a, b = _processes(10, 11, 12, 10.5), _processes(8, 8.5, 9, 8.2)
    a["env"]["hostname"], b["env"]["hostname"] = "node1", "node1"
    assert diff(a, b)["other_machine"] is None and "beyond the process spread" in verdict(diff(a, b))
    b["env"]["hostname"] = "node2"
    d = diff(a, b)
    assert d["other_machine"] == "the files ran on different hosts (node1 before, node2 after)"
    assert "bench both sides on one machine" in verdict(d) and "beyond" not in verdict(d)
    a["env"]["gpu_state"], b["env"]["gpu_state"] = {"uuid": "GPU-1"}, {"uuid": "GPU-1"}  # the GPU decides first
    assert diff(a, b)["other_machine"] is None
    b["env"]["gpu_state"] = {"uuid": "GPU-2"}
    assert diff(a, b)["other_machine"] == "the files ran on different GPUs (GPU-1 before, GPU-2 after)"


def _breakdown(stages_per_process: list[dict]) -> dict:
    """A breakdown file of len(stages_per_process) processes: each a {stage: median} dict; wall = their sum."""
    results = []
    for stages in stages_per_process:
        r = _result(sum(stages.values()))
        r["command"] = "breakdown"
        r["breakdown"] = {"stages": [{"name": k, "median_ms": v} for k, v in stages.items()]}
        results.append(r)
    return combine(results) if len(results) > 1 else results[0]


def test_two_breakdowns_are_compared_stage_by_stage():
    before = _breakdown([{"transform": 1.0, "upload": 2.0, "step": 10.0}, {"transform": 1.2, "upload": 2.1, "step": 10.1},
                         {"transform": 0.9, "upload": 2.2, "step": 10.2}, {"transform": 1.1, "upload": 2.3, "step": 10.3}])
    after = _breakdown([{"transform": 1.05, "upload": 1.0, "kernel": 9.0}, {"transform": 1.0, "upload": 1.1, "kernel": 9.1},
                        {"transform": 1.15, "upload": 1.2, "kernel": 9.2}, {"transform": 0.95, "upload": 1.3, "kernel": 9.3}])
    d = diff(before, after)
    rows = {row["stage"]: row for row in d["stages"]}
    assert list(rows) == ["transform", "upload", "step", "kernel"]  # before's order, then after's new stages
    assert rows["upload"]["processes"]["beyond_spread"] and rows["upload"]["processes"]["direction"] == "faster"
    assert rows["transform"]["processes"]["direction"] is None and not rows["transform"]["processes"]["beyond_spread"]
    assert rows["step"]["after_ms"] is None and rows["step"]["change_pct"] is None and rows["step"]["processes"] is None
    assert rows["kernel"]["before_ms"] is None
    headline_upload = before["breakdown"]["stages"][1]["median_ms"]
    assert rows["upload"]["before_ms"] == headline_upload  # the file's own (middle process's) stage median
    assert diff(_result(1.0), _result(2.0))["stages"] is None  # bench files have no stages


def test_a_stage_needs_two_processes_a_side_to_be_compared_by_process():
    before = _breakdown([{"setup": 1.0, "rare": 0.5}, {"setup": 1.1}])
    after = _breakdown([{"setup": 2.0, "rare": 0.4}, {"setup": 2.1, "rare": 0.6}])
    rows = {row["stage"]: row for row in diff(before, after)["stages"]}
    assert rows["setup"]["processes"]["direction"] == "slower"
    assert rows["rare"]["processes"] is None  # one before process had it


def test_diff_command_prints_the_stages_and_refuses_mixed_commands(tmp_path, capsys):
    from vlaperf.cli import main

    before = _write(tmp_path, "b.json", _breakdown([{"transform": 1.0, "step": 10.0}, {"transform": 1.1, "step": 10.2}]))
    after = _write(tmp_path, "a.json", _breakdown([{"transform": 1.0, "step": 8.0}, {"transform": 1.2, "step": 8.1}]))
    assert main(["diff", before, after]) == 0
    out = capsys.readouterr().out
    assert "stages: each stage's median" in out and "all faster" in out and "overlap" in out
    bench = _write(tmp_path, "bench.json", _processes(10, 11))
    assert main(["diff", bench, after]) == 2
    assert "BEFORE is a 'bench' file and AFTER a 'breakdown' file" in capsys.readouterr().err


def test_breakdowns_must_share_the_idle_before_each_call(tmp_path, capsys):
    # `breakdown --idle-ms` times every call after the idle, its timers too: the h100 s49 pair of one commit, back to
    # back against 50 ms idle, was a +5.1% "slowdown" that failed `--max-slowdown 5`
    from vlaperf.cli import main

    old, b2b = _breakdown([{"setup": 1.0}]), _breakdown([{"setup": 1.0}])  # `old`: from before --idle-ms, no idle_ms
    b2b["breakdown"].update(idle_ms=0.0, idle_spin=False)
    idle, spin = _breakdown([{"setup": 1.1}]), _breakdown([{"setup": 1.1}])
    idle["breakdown"].update(idle_ms=50.0, idle_spin=False)
    spin["breakdown"].update(idle_ms=50.0, idle_spin=True)
    assert mismatches(old, b2b) == []
    assert mismatches(b2b, idle) == ["idle before each call differs: back to back before, 50 ms idle after"]
    assert mismatches(idle, spin) == ["idle before each call differs: 50 ms idle before, 50 ms spinning after"]
    bench = _result(10.0)
    bench["idle"] = {"idle_ms": 50.0}  # bench's timers are back to back whatever its --idle-ms
    assert mismatches(_result(10.0), bench) == []
    before, after = _write(tmp_path, "b2b.json", b2b), _write(tmp_path, "idle.json", idle)
    assert main(["diff", before, after, "--max-slowdown", "5"]) == 2
    assert "not comparable: idle before each call differs: back to back before, 50 ms idle after" in \
        capsys.readouterr().err
    assert main(["diff", before, after, "--allow-mismatch"]) == 0


def test_one_process_breakdowns_point_at_breakdown_processes():
    d = diff(_breakdown([{"setup": 1.0}]), _breakdown([{"setup": 2.0}]))
    assert "run both with `breakdown --processes 4`" in verdict(d)
    assert d["stages"][0]["change_pct"] == pytest.approx(100.0) and d["stages"][0]["processes"] is None


@pytest.mark.parametrize("change, message", [
    (lambda r: r["samples"].update(wall_ms=["x", 1.0]), "samples.wall_ms: expected an array of numbers (or null)"),
    (lambda r: r["breakdown"]["stages"][0].update(median_ms="1.0"),
     "breakdown.stages[0].median_ms: expected a number of ms, got '1.0'"),
    (lambda r: r["breakdown"]["stages"][0].pop("median_ms"),
     "breakdown.stages[0].median_ms: expected a number of ms, got None"),
    (lambda r: r["breakdown"]["stages"][1].pop("name"), "breakdown.stages[1].name: expected a string, got None"),
])
def test_a_damaged_breakdown_is_named_not_a_traceback(tmp_path, capsys, change, message):
    # the report checks a bench file's samples only: a breakdown's bad sample or stage ended the diff in a TypeError or
    # KeyError (exit 1, which a --max-slowdown gate reads as a slowdown)
    from vlaperf.cli import main

    r = _breakdown([{"transform": 1.0, "step": 10.0}])
    change(r)
    before = _write(tmp_path, "b.json", r)
    after = _write(tmp_path, "a.json", _breakdown([{"transform": 1.0, "step": 8.0}]))
    assert main(["diff", before, after]) == 2
    assert f"BEFORE {before}: {message}" in capsys.readouterr().err


def test_diff_names_a_missing_file_as_before_or_after_and_warns_on_one_file_twice(tmp_path, capsys):
    from vlaperf.cli import main

    before = _write(tmp_path, "before.json", _processes(10, 11))
    missing = str(tmp_path / "gone.json")
    assert main(["diff", before, missing]) == 2
    assert f"AFTER {missing}: No such file or directory" in capsys.readouterr().err
    assert main(["diff", before, before]) == 0
    assert "warning: BEFORE and AFTER are the same file: no change can show" in capsys.readouterr().out
