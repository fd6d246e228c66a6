"""The command line: exit codes, messages and result files."""

import json
import os
import subprocess
import sys

import pytest
import torch

from vlaperf.cli import main
from vlaperf.report.schema import SchemaError, read_result, validate_result


def test_bench_tiny_writes_valid_result(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "2", "--iters", "5", "--json", str(out), "--no-progress"]) == 0
    r = read_result(out)
    assert r["command"] == "bench" and r["workload"] == {"id": "tiny", "overrides": {}}
    assert r["timers"]["wall_ms"]["count"] == 5 and r["timers"]["cuda_event_ms"] is None
    assert r["variant"] == {"levers": [], "label": "reference", "dtype": "float32", "checkpoint": None}  # random weights
    assert r["env"]["torch"] and isinstance(r["env"]["env_vars"], dict) and "c_compiler" in r["env"]
    assert r["first_call_s"] > 0 and len(r["samples"]["wall_ms"]) == 5
    assert "median" in capsys.readouterr().out


def test_bench_floor_on_this_devices_measured_ceilings(tmp_path, capsys):
    """--ceilings measure: the floor from this device's own matmul rate and copy bandwidth (recorded with how they
    were taken), in the model's bytes per weight; the default keeps the H200's, and says so in the file."""
    from vlaperf.models.pi0 import get_config
    from vlaperf.roofline import H200_CEILINGS, roofline
    from vlaperf.workloads import get_workload

    common = ["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "1", "--iters", "3", "--no-progress", "--json"]
    assert main(common + [str(tmp_path / "m.json"), "--ceilings", "measure"]) == 0
    floor = read_result(tmp_path / "m.json")["roofline"]
    c = floor["ceilings"]
    assert c["source"] == "measured on this device" and c["matmul"].startswith("2048 x 2048 x 2048 float32")
    assert 1e8 < c["matmul_flops"] < 1e15 and 1e8 < c["bandwidth"] < 1e13
    w = get_workload("tiny")  # the reference embeds every slot
    again = roofline(get_config("tiny"), w, w.image_slots, w.prompt_slots, bytes_per_param=4,
                     matmul_flops=c["matmul_flops"], bandwidth=c["bandwidth"])
    assert again["floor_ms"] == pytest.approx(floor["floor_ms"])
    out = capsys.readouterr().out
    assert "this device's ceilings: " in out and "TB/s, measured) ->" in out
    assert main(common + [str(tmp_path / "h.json")]) == 0
    assert read_result(tmp_path / "h.json")["roofline"]["ceilings"] == H200_CEILINGS
    assert "x the floor" not in capsys.readouterr().out  # the H200's floor is not this CPU's: not printed
    with pytest.raises(SystemExit) as e:
        main(common + [str(tmp_path / "x.json"), "--ceilings", "a100"])
    assert e.value.code == 2


def test_bench_prints_its_title_on_one_line_and_the_levers_in_full(capsys):
    """best's whole label in the table's title wrapped over three lines at the table's width: the title is a line of
    its own with the short names, and the levers follow the table in full."""
    from vlaperf.cli import print_bench
    from vlaperf.engine.levers import BEST_GPU, TUNED_FOR

    levers = list(BEST_GPU) + list(TUNED_FOR)
    stats = {k: 13.0 for k in ("median", "mean", "p90", "p95", "p99", "min", "max")}
    from vlaperf.roofline import H200_CEILINGS

    result = {"workload": {"id": "libero-pi0"}, "mode": "model", "iters": 50, "warmup": 10, "first_call_s": 2.0,
              "variant": {"label": "+".join(levers), "dtype": "bfloat16"}, "env": {"gpu": "NVIDIA H100 80GB HBM3"},
              "timers": {"wall_ms": stats, "cuda_event_ms": stats},
              "roofline": {"floor_ms": 5.0, "matmul_flops": 780e12, "bandwidth": 4.23e12, "ceilings": H200_CEILINGS}}
    print_bench(result)
    lines = capsys.readouterr().out.splitlines()
    said = " ".join(line.strip() for line in lines)  # a 120-column console wraps the longer lines at a space
    # the variant whole on the first line, the table right after the title
    assert lines[0].startswith("vlaperf bench  libero-pi0  loop+skipimg+trim+kv+sdpa+fuse+graph+c:default+layers+"
                               "triton+mega  (model mode, bfloat16,")
    assert lines[2].startswith("\u250f") and "(model mode, bfloat16, NVIDIA H100 80GB HBM3)" in said
    assert "levers: " + ", ".join(levers) in said
    # on another GPU than the H200 the floor's ceilings say how to get this GPU's own
    assert "(H200 ceilings; --ceilings measure gives this GPU's own) -> 2.60x the floor" in said
    result["env"]["gpu"] = "NVIDIA H200"
    print_bench(result)
    out = " ".join(capsys.readouterr().out.split())
    assert "(H200 ceilings) -> 2.60x the floor" in out and "spread widely" not in out  # a quiet run says nothing
    # samples spread as a 2-core machine's with a second process beside the bench: said below the table
    result["timers"]["wall_ms"] = {**stats, "median": 77.393, "p90": 2101.675, "max": 2147.552}
    result["env"].update(load_avg=3.91, cpus=2)
    print_bench(result)
    out = " ".join(capsys.readouterr().out.split())
    assert ("the timed calls spread widely: p90 2101.675 ms is 27.2x the median, max 2147.552 ms. Something else "
            "may be using this machine (1-minute load average 3.91 on 2 CPUs, this process included)") in out


def test_the_spread_note_starts_at_its_threshold_and_names_the_load_where_known():
    from vlaperf.timing import WIDE_P90_OVER_MEDIAN, spread_note

    wall = {"median": 10.0, "p90": 10.0 * WIDE_P90_OVER_MEDIAN - 0.01, "max": 40.0}
    assert spread_note(wall, {"load_avg": 5.0, "cpus": 2}) is None
    wide = {**wall, "p90": 10.0 * WIDE_P90_OVER_MEDIAN}
    assert spread_note(wide, {}).startswith("the timed calls spread widely: p90 15.000 ms is 1.5x the median")
    assert "load average" not in spread_note(wide, {"load_avg": None, "cpus": 2})
    assert "(1-minute load average 0.5 on 16 CPUs" in spread_note(wide, {"load_avg": 0.5, "cpus": 16})
    assert spread_note(None, {}) is None and spread_note({"median": 0.0, "p90": 1.0, "max": 1.0}, {}) is None


def test_bench_best_policy_mode_with_overrides(tmp_path):
    out = tmp_path / "p.json"
    args = ["bench", "--workload", "tiny", "--device", "cpu", "--mode", "policy", "--levers", "best", "--batch", "2",
            "--steps", "3", "--warmup", "1", "--iters", "3", "--json", str(out), "--no-progress"]
    assert main(args) == 0
    r = read_result(out)
    assert r["mode"] == "policy" and r["workload"]["overrides"] == {"batch": 2, "steps": 3}  # prompt lengths follow
    assert r["equivalence"]["passed"] and "for_loop" in r["variant"]["levers"]


@pytest.mark.parametrize("mode", ["model", "policy"])
def test_bench_rtc_times_the_guided_call(mode, tmp_path, monkeypatch, capsys):
    """--rtc: every call timed is the guided one (per-row weights, as a server batches), its check covers the guided
    call, and the file says so; reports give it a workload label of its own."""
    from vlaperf.engine import Engine
    from vlaperf.report.document import workload_label

    guided = []
    original = Engine.sample_actions

    def spy(self, obs, noise=None, num_steps=10, guidance=None):
        guided.append(None if guidance is None else tuple(guidance.weights.shape))
        return original(self, obs, noise, num_steps, guidance)

    monkeypatch.setattr(Engine, "sample_actions", spy)
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", "for_loop,static_kv_cache", "--mode",
                 mode, "--batch", "2", "--rtc", "--warmup", "1", "--iters", "3", "--json", str(out), "--no-progress"]) == 0
    r = read_result(out)
    cost = r["rtc"].pop("vs_unguided")
    assert r["rtc"] == {"execution_horizon": 10, "max_guidance_weight": 10.0, "schedule": "linear", "executed": 3,
                        "delay": 2}
    assert r["equivalence"]["guided"] and r["equivalence"]["passed"]
    assert workload_label(r) == "tiny (batch 2, RTC guided)"
    # first call (--warmup 1's one), 2 seeds x (plain + guided) in the check and the timed calls; then the cost: one
    # warm-up call of each and 3 interleaved rounds
    assert guided.count((2, 10)) == 1 + 2 + 3 + 1 + 3 and guided.count(None) == 2 + 1 + 3
    w = cost["wall_ms"]
    assert cost["iters"] == 3 and cost["cuda_event_ms"] is None  # the CPU: no events
    assert w["guided_median"] > 0 and w["unguided_median"] > 0 and w["per_round_p10"] <= w["per_round_p90"]
    assert w["guided_over_unguided"] == pytest.approx(w["guided_median"] / w["unguided_median"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "guided calls included" in printed and "real-time chunking's cost, interleaved with the unguided call" in printed
    assert main(["bench", "--workload", "wam-tiny", "--rtc"]) == 2
    assert "--rtc: real-time chunking is the pi0 family's" in capsys.readouterr().err


def test_pair_cost_spread_is_the_percentiles_of_the_other_over_base_ratios():
    """bench's --idle-ms and --rtc costs: p10..p90 of the per-round ratios other / base, as numpy's (linear)
    percentiles give them. They were 1 / p90 and 1 / p10 of base / other, which differ wherever a percentile falls
    between two rounds (on these 7 rounds: p10 0.6039 against 0.6072)."""
    import numpy as np
    from vlaperf.cli import pair_cost
    from vlaperf.timing import summarize

    base = [10.0, 11.0, 9.5, 10.2, 10.8, 9.9, 10.1]
    other = [6.0, 7.5, 5.9, 8.8, 6.1, 6.4, 9.9]
    timing = {"iters": 7, "ratios": {"other": {"wall_ms": {}, "cuda_event_ms": None}},
              "variants": {n: {"timers": {"wall_ms": summarize(x)}, "samples": {"wall_ms": x, "cuda_event_ms": None}}
                           for n, x in (("base", base), ("other", other))}}
    w = pair_cost(timing, "base", "other")["wall_ms"]
    per_round = np.array(other) / np.array(base)
    assert w["per_round_p10"] == pytest.approx(np.percentile(per_round, 10), rel=1e-12)
    assert w["per_round_p90"] == pytest.approx(np.percentile(per_round, 90), rel=1e-12)
    assert w["other_over_base"] == pytest.approx(np.median(other) / np.median(base), rel=1e-12)
    assert pair_cost(timing, "base", "other")["cuda_event_ms"] is None


@pytest.mark.parametrize("workload", ["tiny", "wam-tiny"])
def test_bench_idle_ms_times_the_call_after_an_idle_against_back_to_back(workload, tmp_path, monkeypatch, capsys):
    """--idle-ms: after the main timing (back to back), the same call again after that idle, interleaved with back-to-
    back calls; the sleeps come before the idle calls only and stay outside their timers; the file and the printout
    carry both medians and their ratio."""
    import vlaperf.timing as timing

    # the sleeps are recorded (that the idle stays outside each timer is interleaved's, tested in test_timing.py)
    slept, sleep = [], timing.time.sleep
    monkeypatch.setattr(timing.time, "sleep", lambda s: (slept.append(s), sleep(s)))
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", workload, "--device", "cpu", "--levers", "reference", "--warmup", "1",
                 "--iters", "4", "--idle-ms", "30", "--json", str(out), "--no-progress"]) == 0
    r = read_result(out)
    idle = r["idle"]
    assert slept.count(0.03) == 4  # one idle before each of the 4 timed idle calls, none in the warm-up or main timing
    assert idle["idle_ms"] == 30 and idle["iters"] == 4 and idle["cuda_event_ms"] is None and idle["spin"] is False
    w = idle["wall_ms"]
    assert set(w) == {"back_to_back_median", "after_idle_median", "after_idle_over_back_to_back", "per_round_p10",
                      "per_round_p90"}
    assert w["after_idle_over_back_to_back"] == pytest.approx(w["after_idle_median"] / w["back_to_back_median"])
    assert w["per_round_p10"] <= w["per_round_p90"]
    assert w["after_idle_median"] < 1000  # the idle itself is not timed
    assert r["timers"]["wall_ms"]["count"] == 4  # the main timing keeps its own calls
    printed = " ".join(capsys.readouterr().out.split())
    assert f"after 30 ms idle, interleaved with back-to-back calls (4 rounds): {w['after_idle_median']:.3f} ms" in printed
    # --idle-spin: the same idle spent busy on the clock, never asleep; without --idle-ms it is refused
    slept.clear()
    assert main(["bench", "--workload", workload, "--device", "cpu", "--levers", "reference", "--warmup", "1",
                 "--iters", "2", "--idle-ms", "10", "--idle-spin", "--json", str(out), "--no-progress"]) == 0
    assert read_result(out)["idle"]["spin"] is True and 0.01 not in slept
    assert "after 10 ms spinning, interleaved with back-to-back calls (2 rounds)" in " ".join(capsys.readouterr().out.split())
    assert main(["bench", "--workload", workload, "--device", "cpu", "--idle-spin"]) == 2
    assert "--idle-spin: spins through the idle that --idle-ms gives; add --idle-ms MS" in capsys.readouterr().err


def test_bench_release_reference_records_the_freed_bytes(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["bench", "--workload", "tiny", "--device", "cpu", "--levers", "best", "--warmup", "1", "--iters", "2",
            "--release-reference", "--json", str(out), "--no-progress"]
    assert main(args) == 0
    r = read_result(out)
    assert r["equivalence"]["passed"] and r["released_reference_bytes"] > 0  # best fuses q/k/v and gate/up
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert "of reference weights released (as served)" in printed
    # the check that ran before the timing is printed, not only written to the file
    assert (f"equivalence vs the reference (2 seeds): actions rel L2 {r['equivalence']['rel_l2']:.1e}, max abs "
            f"{r['equivalence']['max_abs']:.2e}, tolerance 1e-04: passed") in printed
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "0", "--iters", "1",
                 "--release-reference", "--no-progress"]) == 2
    assert "--release-reference needs an engine variant" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--steps", "0"], "argument --steps: expected an integer >= 1 and <= 1000, got 0"),
        (["--batch", "-2"], "argument --batch: expected an integer >= 1 and <= 1024, got -2"),
        (["--iters", "x"], "expected an integer >= 1, got 'x'"),
        (["--levers", "warp_drive"], "unknown lever 'warp_drive'"),
        (["--levers", "for_loop,cuda_graph", "--device", "cpu"], "cuda_graph needs a CUDA device"),
        (["--mode", "train"], "invalid choice: 'train'"),
        (["--device", "gpu"], "argument --device: expected cpu, cuda or cuda:N, got 'gpu'"),
        (["--device", "cuda:x"], "expected cpu, cuda or cuda:N, got 'cuda:x'"),
        (["--seed", "99999999999999999999999"], "argument --seed: expected an integer >= 0 and <= 9223372036854775807"),
        (["--json", "."], "argument --json: expected a file path, got the folder '.'"),  # refused before the run
        (["--workload", ""], "argument --workload: expected a workload id, got an empty string"),
        (["--levers", ""], "argument --levers: expected 'reference', a preset or a comma list of levers, got an empty "
                           "string"),  # it ran the reference without a word
        (["--steps", "1000000"], "argument --steps: expected an integer >= 1 and <= 1000, got 1000000"),
        (["--idle-ms", "0"], "argument --idle-ms: expected a number > 0 and <= 10000, got 0"),
        (["--idle-ms", "nan"], "argument --idle-ms: expected a number > 0 and <= 10000, got nan"),
    ],
)
def test_bad_arguments_exit_2_with_message(args, message, capsys):
    assert run_cli(["bench", "--device", "cpu", "--iters", "1", "--warmup", "0", "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["serve", "--port", "70000"], "argument --port: expected an integer >= 0 and <= 65535, got 70000"),
        # an unset shell variable ran (and served) random weights without a word
        (["bench", "--device", "cpu", "--checkpoint", ""], "argument --checkpoint: expected a path, got an empty string"),
        (["serve", "--checkpoint", ""], "argument --checkpoint: expected a path, got an empty string"),
        (["serve", "--norm-stats", " "], "argument --norm-stats: expected a path, got an empty string"),
        (["serve", "--max-queue", "8"], "argument --max-queue: expected an integer >= 64 (one list request holds up "
         "to 64 observations), got 8"),
        (["serve", "--max-queue", "lots"], "argument --max-queue: expected an integer >= 64 (one list request holds "
         "up to 64 observations), got 'lots'"),
        (["matrix", "--device", "cpu", "--variants", "for_loop;nope"], "--variants: unknown lever 'nope' in 'nope'"),
        # a value no lever takes, or two compile modes, was a skipped row beside the others and the matrix passed
        (["matrix", "--device", "cpu", "--workload", "tiny", "--variants", "for_loop;compile=foo"],
         "--variants: variant 'compile=foo': compile mode 'foo' is not one of: default"),
        # a preset in a list, or a whole matrix among variants, was called an unknown lever, by an error that listed
        # it as expected
        (["matrix", "--device", "cpu", "--variants", "for_loop;best,sdpa"],
         "--variants: variant 'best,sdpa': 'best' is a preset: give it alone"),
        (["matrix", "--device", "cpu", "--variants", "cumulative;for_loop"],
         "--variants: 'cumulative' is a whole matrix: give it alone, not among ';'-separated variants"),
        (["matrix", "--device", "cpu", "--workload", "tiny", "--variants", "for_loop;sdpa=1"],
         "--variants: variant 'sdpa=1': lever 'sdpa' takes no value, got 'sdpa=1'"),
        (["matrix", "--device", "cpu", "--workload", "tiny", "--variants", "for_loop;compile=default,compile=max-autotune"],
         "--variants: variant 'compile=default,compile=max-autotune': compile given twice with different values"),
        # the reference alone was timed, the rows said "skipped", and the matrix passed
        (["matrix", "--device", "cpu", "--workload", "tiny", "--variants", "graph;for_loop,cuda_graph"],
         "--variants: no variant asked for can run on cpu: 'graph': cuda_graph needs a CUDA device"),
        (["bench", "--device", "cpu", "--workload", "Tiny"], "unknown workload 'Tiny' (did you mean 'tiny'?)"),
        (["bench", "--device", "cpu", "--workload", "tiny,wam-tiny"], "is a list: only `vlaperf matrix --ray` runs"),
        (["bench", "--device", "cpu", "--levers", "bestt"], "unknown lever 'bestt' (did you mean 'best'?)"),
        (["check", "--device", "cpu", "--levers", "for_loop;sdpaa"], "--levers: variant 'sdpaa': unknown lever 'sdpaa' "
                                                                     "(did you mean 'sdpa'?)"),
        (["matrix", "--device", "cpu", "--variants", "for_loop,,sdpa"], "--variants: empty lever name in 'for_loop,,sdpa'"),
        (["matrix", "--device", "cpu", "--variants", ""], "--variants '': no variant; expected 'cumulative', 'grid'"),
        (["matrix", "--device", "cpu", "--levers", " ; "], "--variants ';': no variant"),
        (["matrix", "--workload", "wam-tiny", "--device", "cpu", "--variants", ";"], "--variants ';': no variant"),
        (["check", "--device", "cpu", "--levers", "for_loop,"], "empty lever name in 'for_loop,'"),
        # commas alone ran the reference as if no lever had been asked for
        (["bench", "--device", "cpu", "--levers", ","], "empty lever name in ','"),
        (["bench", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact,"], "empty lever name in 'exact,'"),
        (["check", "--device", "cpu", "--levers", ";;"], "--levers ';;': no variant to check"),
        # an empty entry among named variants was dropped without a word (a comma list's empty lever name is refused)
        (["matrix", "--device", "cpu", "--variants", "reference;;for_loop"], "argument --variants: empty variant in "
         "'reference;;for_loop' (two ';' in a row, or one at an end)"),
        (["check", "--device", "cpu", "--levers", ";for_loop"], "argument --levers: empty variant in ';for_loop'"),
        (["scaling", "--device", "cpu", "--levers", "reference; ;best"], "argument --levers: empty variant in"),
        (["scaling", "--device", "cpu", "--steps", "1,100000000"], "expected at least two different step counts in 1..1000"),
        (["scaling", "--device", "cpu", "--steps", "1,,2"], "expected comma-separated integers"),
        # loadgen's list took '1,,2' as 1,2 and went on to connect
        (["loadgen", "--url", "ws://127.0.0.1:9", "--clients", "1,,2"], "argument --clients: expected comma-separated integers"),
        (["scaling", "--device", "cpu", "--plot", "."], "argument --plot: expected a file path, got the folder '.'"),
        # the plot was written, then the result over it
        (["scaling", "--device", "cpu", "--plot", "same.png", "--json", "./same.png"],
         "--plot and --json name the same file ./same.png: the result would overwrite the plot"),
        (["breakdown", "--device", "cpu", "--trace", "."], "argument --trace: expected a file path, got the folder"),
        (["report", ".", "-o", "."], "argument -o/--output: expected a file path, got the folder '.'"),
        (["compare", "--device", "mps"], "argument --device: expected cpu, cuda or cuda:N, got 'mps'"),
        # a variant given twice was timed once and shown as two rows (matrix) or one (scaling)
        (["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "sdpa;sdpa"],
         "--variants (--levers): 'sdpa' and 'sdpa' are the same spec twice on cpu (sdpa): give each variant once"),
        (["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "exact;sdpa;" + ",".join(
            ["for_loop", "skip_masked_images", "trim_prompt_padding", "static_kv_cache", "sdpa", "fuse_projections"])],
         "--variants (--levers): 'exact' and 'for_loop,skip_masked_images,"),
        (["matrix", "--workload", "wam-tiny", "--device", "cpu", "--variants", "exact;best"],
         "--variants (--levers): 'exact' and 'best' are the same variant on cpu"),
        (["check", "--workload", "tiny", "--device", "cpu", "--levers", "sdpa;for_loop;sdpa"],
         "--levers: 'sdpa' and 'sdpa' are the same spec twice"),
        (["check", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact;best"],
         "--levers: 'exact' and 'best' are the same variant on cpu"),
        (["scaling", "--workload", "tiny", "--device", "cpu", "--steps", "1,2", "--levers", "reference;none"],
         "--levers: 'reference' and 'none' are the same variant on cpu (reference)"),
        (["scaling", "--workload", "wam-tiny", "--device", "cpu", "--steps", "1,2", "--levers", "exact;exact"],
         "--levers: 'exact' and 'exact' are the same spec twice"),
        # ';' alone named no variant and timed the reference without a word
        (["scaling", "--workload", "tiny", "--device", "cpu", "--steps", "1,2", "--levers", ";"],
         "--levers ';': no variant to time"),
        # options that did nothing without their switch, and were accepted without a word
        (["matrix", "--workload", "tiny", "--device", "cpu", "--ray-address", "auto"],
         "--ray-address: configure the matrix's Ray tasks and need --ray"),
        (["matrix", "--workload", "tiny", "--device", "cpu", "--ray-cpus-per-task", "2"],
         "--ray-cpus-per-task: configure the matrix's Ray tasks and need --ray"),
        (["serve", "--workload", "tiny", "--device", "cpu", "--port", "0", "--ray-address", "auto",
          "--replica-timeout-s", "5"],
         "--ray-address, --replica-timeout-s: configure Ray Serve replicas and need --replicas N"),
        (["doctor", "--steps", "3"], "--steps: settings of a policy check; give --workload"),
        (["bench", "--workload", "tiny", "--device", "cpu", "--levers", "best;graph"],
         "'best;graph' holds several variants (';'); this command runs one: give one, or compare them with "
         "`vlaperf matrix --variants 'best;graph'`"),
        (["bench", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact;best"], "holds several variants"),
        (["doctor", "--sparsity", "drop_middle", "--dtype", "float32"], "--dtype, --sparsity: settings of a policy check"),
        # an empty key (an unset shell variable) served without auth
        (["serve", "--workload", "tiny", "--device", "cpu", "--port", "0", "--api-key", ""],
         "--api-key: empty (an unset shell variable?)"),
    ],
)
def test_other_commands_refuse_bad_arguments_before_running(args, message, capsys):
    """Each of these once ran (or built a model) and then ended in a traceback with exit code 1."""
    assert run_cli(args) == 2
    assert message in capsys.readouterr().err


def test_checkpoint_that_is_no_safetensors_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "model.safetensors"
    bad.write_text("not a checkpoint")
    assert run_cli(["bench", "--device", "cpu", "--checkpoint", str(bad), "--iters", "1", "--no-progress"]) == 2
    assert f"error: --checkpoint: {bad}: not a readable safetensors file" in capsys.readouterr().err


def test_a_checkpoint_of_another_shape_is_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    """A checkpoint that does not fit the preset (a tiny file given for libero-pi0, say) was found out only after the
    whole model was built (84 s on a 2-core CPU for libero-pi0); its names and shapes are matched first now."""
    from vlaperf.checkpoints import save_checkpoint
    from vlaperf.models.pi0 import build_model

    path = save_checkpoint(build_model("tiny", seed=0), tmp_path / "tiny")
    monkeypatch.setattr("vlaperf.models.pi0.build_model", lambda *a, **kw: pytest.fail("the model was built"))
    assert run_cli(["bench", "--workload", "libero-shallow6", "--device", "cpu", "--checkpoint", str(path),
                    "--iters", "1", "--no-progress"]) == 2
    assert "error: --checkpoint: checkpoint does not match model preset 'shallow6'" in capsys.readouterr().err


def test_serve_refuses_an_unreadable_checkpoint_before_warning_or_building(tmp_path, capsys, monkeypatch):
    """serve read the checkpoint only once its model was built, after warning that the checkpoint was served
    without --norm-stats: the warning came first and then the error. The header is now read first."""
    pytest.importorskip("websockets")
    monkeypatch.setattr("vlaperf.cli.setup", lambda *a: pytest.fail("the model was built"))
    bad = tmp_path / "model.safetensors"
    bad.write_text("not a checkpoint")
    assert run_cli(["serve", "--device", "cpu", "--port", "0", "--checkpoint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: --checkpoint: {bad}: not a readable safetensors file" in err and "warning" not in err
    assert run_cli(["serve", "--device", "cpu", "--port", "0", "--checkpoint", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "error: --checkpoint: checkpoint not found" in err and "warning" not in err


def test_syncs_source_cuda_needs_a_cuda_device(capsys):
    assert run_cli(["syncs", "--device", "cpu", "--source", "cuda", "--calls", "1", "--no-progress"]) == 2
    assert "--source cuda: counts the CUDA runtime's syncs, so it needs a CUDA device" in capsys.readouterr().err


def run_cli(argv) -> int:
    """Exit code of `vlaperf argv` (argparse exits with SystemExit, our own errors return 2)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_cuda_unavailable_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_check_and_matrix_on_tiny(tmp_path, capsys):
    assert main(["check", "--workload", "tiny", "--device", "cpu", "--seeds", "1", "--json", str(tmp_path / "c.json")]) == 0
    checks = read_result(tmp_path / "c.json")["checks"]
    assert all(c["passed"] for c in checks) and len(checks) >= 7
    # the printed table names the exact levers together as the matrix does, on one line, not folded over two
    names = [line.split("\u2502")[1].strip() for line in capsys.readouterr().out.splitlines()
             if line.startswith("\u2502")]
    assert names[-1] == "loop+skipimg+trim+kv+sdpa+fuse" and names[0] == "for_loop", names
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--warmup", "1", "--iters", "3", "--no-progress",
                 "--json", str(tmp_path / "m.json")]) == 0
    rows = read_result(tmp_path / "m.json")["variants"]
    assert [r["variant"] for r in rows][0] == "reference" and len(rows) == 7
    assert all("timers" in r for r in rows) and rows[-1]["ratio"]["wall_ms"]["speedup"] > 0


@pytest.mark.parametrize("workload", ["tiny", "wam-tiny"])
def test_matrix_idle_ms_times_every_call_after_the_idle(workload, tmp_path, monkeypatch, capsys):
    """--idle-ms: every timed call of every row follows the idle (none in the warm-up), the file records it and the
    title says so; with --ray it is refused (its tasks time back to back), --idle-spin alone too."""
    import vlaperf.timing as timing

    # the sleeps are recorded (that the idle stays outside each timer is interleaved's, tested in test_timing.py)
    slept, sleep = [], timing.time.sleep
    monkeypatch.setattr(timing.time, "sleep", lambda s: (slept.append(s), sleep(s)))
    variants = "reference;for_loop" if workload == "tiny" else "reference;exact"
    out = tmp_path / "m.json"
    assert main(["matrix", "--workload", workload, "--device", "cpu", "--variants", variants, "--warmup", "1",
                 "--iters", "3", "--idle-ms", "7", "--no-progress", "--json", str(out)]) == 0
    r = read_result(out)
    timed = [v for v in r["variants"] if "timers" in v]
    assert slept.count(0.007) == 3 * len(timed) and len(timed) >= 2
    assert r["idle_ms"] == 7.0 and r["idle_spin"] is False
    assert "each call after 7 ms idle" in " ".join(capsys.readouterr().out.split())
    from vlaperf.report.render import render

    md = render([out], tmp_path / "r.md").read_text()  # the report's matrix note says it too
    assert "warm-up calls per variant, each timed call after 7 ms idle (`--idle-ms`)" in md
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--ray", "--idle-ms", "7"]) == 2
    assert "--idle-ms with --ray: the Ray tasks time their variants back to back" in capsys.readouterr().err
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--idle-spin"]) == 2
    assert "--idle-spin: spins through the idle that --idle-ms gives" in capsys.readouterr().err


def test_matrix_in_policy_mode_times_each_variants_served_path(tmp_path, monkeypatch, capsys):
    """--mode policy: every row, the reference's too, is Policy.infer of one openpi request around that variant's
    sample (bench --mode policy's call), as many calls of each; the file and the table say the mode. --mode model
    (the default) never goes through a Policy."""
    from vlaperf.policy import Policy

    owners, verifies = [], set()
    infer = Policy.infer

    def recording(self, example):
        owner = self.sample.__self__
        owners.append(type(owner).__name__)
        # the engine's calls check its step kernel after each call, as a server's do; the reference has none to check
        verifies.add((type(owner).__name__, None if self.verify is None else self.verify == owner.raise_on_kernel_fault))
        return infer(self, example)

    monkeypatch.setattr(Policy, "infer", recording)
    argv = ["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "exact", "--warmup", "1", "--iters", "3",
            "--no-progress", "--json", str(tmp_path / "m.json")]
    assert main(argv + ["--mode", "policy"]) == 0
    r = read_result(tmp_path / "m.json")
    assert r["mode"] == "policy" and [v["variant"] for v in r["variants"]] == ["reference", "exact"]
    assert all(v["timers"]["wall_ms"]["count"] == 3 for v in r["variants"]) and r["variants"][1]["equivalence"]["passed"]
    assert set(owners) == {"Pi0Model", "Engine"} and owners.count("Pi0Model") == owners.count("Engine") >= 1 + 3
    assert verifies == {("Pi0Model", None), ("Engine", True)}
    assert "(policy mode, cpu;" in capsys.readouterr().out
    owners.clear()
    assert main(argv) == 0
    assert owners == [] and read_result(tmp_path / "m.json")["mode"] == "model"


def test_a_matrix_row_times_the_call_its_mode_names():
    """timed_call: the model call returns the device actions; the policy call the served reply, whose actions are
    the same call's on the host; any other mode is refused by name."""
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.profile.matrix import timed_call
    from vlaperf.workloads import get_workload

    w = get_workload("tiny").with_overrides(batch=2)
    model = build_model("tiny", seed=0)
    obs, noise = random_observation(w, model.config, seed=1), random_noise(w, model.config, seed=1)
    actions = timed_call(model, None, w, obs, noise, 2, "model", seed=1)()
    assert isinstance(actions, torch.Tensor) and actions.shape == noise.shape
    reply = timed_call(model, None, w, obs, noise, w.steps, "policy", seed=1)()
    assert reply["actions"].shape == (2, w.horizon, w.robot_action_dim) and "policy_timing" in reply
    # the request of `seed`: examples seed, seed + 1 (one per sample), answered with the fixed noise
    from vlaperf.inputs import make_example
    from vlaperf.policy import Policy, example_request

    request = example_request(w, seed=1)
    assert [ex["prompt"] for ex in request] == [make_example(w, seed=1)["prompt"], make_example(w, seed=2)["prompt"]]
    assert all((a == b).all() for ex, ref in zip(request, (make_example(w, seed=1), make_example(w, seed=2)))
               for a, b in zip(ex.values(), ref.values()) if not isinstance(a, str))
    expected = Policy(model, model.sample_actions, w, noise=noise).infer(request)["actions"]
    torch.testing.assert_close(torch.from_numpy(reply["actions"]), torch.from_numpy(expected), rtol=0, atol=0)
    assert example_request(get_workload("tiny"), seed=4).keys() == make_example(w, seed=4).keys()  # batch 1: one dict
    with pytest.raises(ValueError, match="mode: expected 'model' or 'policy', got 'forward'"):
        timed_call(model, None, w, obs, noise, 2, "forward", seed=1)


def test_an_interrupted_matrix_writes_what_it_has(tmp_path, monkeypatch, capsys):
    """A matrix stopped by SIGTERM (a time limit) or Ctrl-C keeps the rows it prepared (first call, equivalence) in
    its file, marked interrupted and untimed, and exits 143 / 130; SIGTERM's previous handler comes back. A SIGTERM
    whose exception something else caught still stops the matrix after the row it came in."""
    import os
    import signal

    from vlaperf.profile import matrix

    prepare, prepared = matrix.prepare_variant, []

    def prepare_then_terminate(model, spec, *a, **kw):
        if len(prepared) == 2:  # two rows prepared: the signal lands as the third begins
            os.kill(os.getpid(), signal.SIGTERM)
        prepared.append(spec)
        return prepare(model, spec, *a, **kw)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(matrix, "prepare_variant", prepare_then_terminate)
    args = ["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "for_loop;exact;for_loop,sdpa", "--warmup", "1",
            "--iters", "2", "--no-progress", "--json", str(tmp_path / "t.json")]
    assert main(args) == 143
    assert signal.getsignal(signal.SIGTERM) is before
    r = read_result(tmp_path / "t.json")
    assert r["interrupted"] is True and [v["variant"] for v in r["variants"]] == ["reference", "for_loop", "exact",
                                                                                  "for_loop,sdpa"]
    assert r["variants"][1]["equivalence"]["passed"] and r["variants"][1]["first_call_s"] > 0
    assert r["variants"][1]["skipped"] == "not timed: the matrix was interrupted"
    assert [v["skipped"] for v in r["variants"][2:]] == ["not prepared: the matrix was interrupted"] * 2
    assert not any("timers" in v for v in r["variants"])
    assert "interrupted: wrote the 4 rows so far" in capsys.readouterr().out
    # the report says so, instead of "2 interleaved rounds", and keeps the prepared rows' check, first call and levers
    from vlaperf.report.document import cell
    from vlaperf.report.render import render

    render([tmp_path / "t.json"], tmp_path / "t.md")
    md = (tmp_path / "t.md").read_text()
    assert "interrupted (Ctrl-C or SIGTERM) before its 2 interleaved rounds finished, so no variant was timed" in md
    assert "2 interleaved rounds after" not in md
    row = r["variants"][1]
    rel_l2, first = cell(row["equivalence"]["rel_l2"]), cell(row["first_call_s"])
    assert f"| for_loop | not timed: the matrix was interrupted | - | - | - | - | {rel_l2} | {first} | - | for_loop |" in md

    def prepare_swallowing_the_signal(model, spec, *a, **kw):  # as a library that catches it would
        if spec == "for_loop":
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except KeyboardInterrupt:
                pass
        return prepare(model, spec, *a, **kw)

    monkeypatch.setattr(matrix, "prepare_variant", prepare_swallowing_the_signal)
    assert main(args[:-1] + [str(tmp_path / "s.json")]) == 143  # stops after the row it was preparing
    r = read_result(tmp_path / "s.json")
    assert r["variants"][1]["equivalence"]["passed"] and r["variants"][1]["skipped"].startswith("not timed")
    assert [v["skipped"] for v in r["variants"][2:]] == ["not prepared: the matrix was interrupted"] * 2

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "prepare_variant", prepare)
    monkeypatch.setattr("vlaperf.timing.interleaved", ctrl_c)
    assert main(args[:-1] + [str(tmp_path / "c.json")]) == 130
    r = read_result(tmp_path / "c.json")
    assert r["interrupted"] is True and all(v["skipped"] == "not timed: the matrix was interrupted" for v in r["variants"])
    assert all(v["equivalence"]["passed"] for v in r["variants"][1:])


def test_the_matrix_never_times_a_variant_that_fails_equivalence(tmp_path, monkeypatch, capsys):
    """A variant whose actions differ from the reference's is listed with its equivalence and the reason, and is
    never timed: no speed in the file or the table. The timed rows carry their own variant's timings and ratio, and
    keep the first call measured before the equivalence check. An interrupt keeps that reason too."""
    import vlaperf.check
    from vlaperf.engine.levers import Levers
    from vlaperf.profile import matrix
    from vlaperf.timing import summarize

    check = vlaperf.check.check_equivalence

    def sdpa_fails(model, engine, workload):  # one seed of one step: the real check, made cheap
        eq = check(model, engine, workload, seeds=(0,), num_steps=1)
        return {**eq, "passed": eq["passed"] and "sdpa" not in engine.levers.names()}

    seen = {}

    def fake_interleaved(fns, *, device, warmup, iters, baseline, progress, idle_ms, idle_spin):  # no rounds run
        seen.update(names=list(fns), warmup=warmup, iters=iters, baseline=baseline, idle_ms=idle_ms)
        samples = {"reference": [4.0, 4.1, 4.2, 4.3], "for_loop": [1.5, 1.6, 1.7, 5.0]}
        ratios = {"reference": (1.0, 1.0, 0.9, 1.1, False), "for_loop": (2.5, 2.4, 2.1, 2.9, False)}
        keys = ("speedup", "ratio_median", "ratio_p10", "ratio_p90", "significant")
        return {"variants": {n: {"timers": {"wall_ms": summarize(samples[n]), "cuda_event_ms": None},
                                 "first_call_s": 1234.0, "warmup_s": 0.25, "peak_memory_bytes": 250} for n in fns},
                "ratios": {n: {"wall_ms": dict(zip(keys, ratios[n])), "cuda_event_ms": None} for n in fns}}

    monkeypatch.setattr(vlaperf.check, "check_equivalence", sdpa_fails)
    monkeypatch.setattr(matrix, "first_call_seconds", lambda *a: 0.5)
    monkeypatch.setattr("vlaperf.timing.interleaved", fake_interleaved)
    # the allocator's peak over each row's first call: reference, for_loop, sdpa (then the interrupted run's two)
    first_call_peaks = iter([100, 400, 300, 100, 300])
    monkeypatch.setattr("vlaperf.timing._reset_peak_memory", lambda device: None)
    monkeypatch.setattr("vlaperf.timing._peak_memory", lambda device: next(first_call_peaks))
    args = ["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "for_loop;sdpa", "--warmup", "1", "--iters",
            "2", "--no-progress", "--json", str(tmp_path / "m.json")]
    assert main(args) == 1  # a variant failed its check: the file and the table are written, and the exit says so
    assert seen == {"names": ["reference", "for_loop"], "warmup": 1, "iters": 2, "baseline": "reference",
                    "idle_ms": {"reference": 0.0, "for_loop": 0.0}}  # back to back
    r = read_result(tmp_path / "m.json")
    assert (r["baseline"], r["warmup"], r["iters"]) == ("reference", 1, 2)
    assert r["first_call_timing"] == "before equivalence check"
    ref, loop, sdpa = r["variants"]
    assert [ref["variant"], loop["variant"], sdpa["variant"]] == ["reference", "for_loop", "sdpa"]
    assert sdpa["skipped"] == "fails equivalence: speed not reported" and sdpa["equivalence"]["passed"] is False
    assert not {"timers", "ratio", "warmup_s"} & set(sdpa) and sdpa["levers"] == Levers.parse("sdpa").names()
    assert loop["levers"] == Levers.parse("for_loop").names() and loop["equivalence"]["passed"]
    assert loop["ratio"]["wall_ms"]["speedup"] == 2.5 and loop["timers"]["wall_ms"]["median"] == pytest.approx(1.65)
    assert loop["warmup_s"] == 0.25
    # a row's peak covers its first call (compile, capture), which the rounds' warm-up (250 here) comes after
    assert r["peak_memory_over"] == "first call and warm-up"
    assert [ref["peak_memory_bytes"], loop["peak_memory_bytes"], sdpa["peak_memory_bytes"]] == [250, 400, 300]
    # the reference's first call is its own, made before the variants' checks call it (not the rounds' warm call)
    assert loop["first_call_s"] == 0.5 and 0 < ref["first_call_s"] < 1234.0
    out = capsys.readouterr().out
    # median, p95 (not p90 or mean), speedup marked as noise (not significant), p10..p90, the variant's rel L2
    for text in ("for_loop", "1.650", "4.505", "2.50x (noise)", "2.10..2.90", f"{loop['equivalence']['rel_l2']:.1e}",
                 "1.00x", "[1] sdpa: fails equivalence: speed not reported"):
        assert text in out, text
    assert "1.00x (noise)" not in out  # the reference against itself is no finding
    # the failing row's own error and first call are in its row (they were blank: only the JSON had them)
    (sdpa_line,) = [line for line in out.splitlines() if "skipped [1]" in line]
    assert f"{sdpa['equivalence']['rel_l2']:.1e}" in sdpa_line and "0.50" in sdpa_line

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("vlaperf.timing.interleaved", ctrl_c)
    args[6] = "sdpa"
    assert main(args[:-1] + [str(tmp_path / "c.json"), "--idle-ms", "3"]) == 130
    interrupted = read_result(tmp_path / "c.json")
    # the idle each call was to come after is recorded as in a finished file (it was missing, so the file read as
    # back to back); nothing of sdpa's list needs a GPU, so nothing is said left out
    assert (interrupted["idle_ms"], interrupted["idle_spin"]) == (3.0, False) and "left_out" not in interrupted
    rows = interrupted["variants"]
    assert rows[0]["skipped"] == "not timed: the matrix was interrupted"
    assert rows[1]["skipped"] == "fails equivalence: speed not reported"  # its reason is kept, not overwritten
    assert [row["peak_memory_bytes"] for row in rows] == [100, 300]  # and the peak of the first call each made


def test_the_matrix_reference_first_call_is_the_reference_model_s_first_call(tmp_path, monkeypatch):
    """The reference row's first_call_s was the rounds' warm-up call, made after every variant's equivalence check
    had called the reference model twice: no first call at all, while the first variant's first call paid for the
    process's first use of the device. It is now timed first, and it is the model's first call."""
    from vlaperf.models.pi0 import Pi0Model
    from vlaperf.profile import matrix

    log = []
    sample, first_call = Pi0Model.sample_actions, matrix.first_call_seconds
    monkeypatch.setattr(Pi0Model, "sample_actions", lambda self, *a, **kw: log.append("reference model") or
                        sample(self, *a, **kw))
    monkeypatch.setattr(matrix, "first_call_seconds", lambda *a: log.append("variant first call") or first_call(*a))
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "for_loop", "--warmup", "1",
                 "--iters", "1", "--no-progress", "--json", str(tmp_path / "m.json")]) == 0
    assert log[:2] == ["reference model", "variant first call"]
    ref = read_result(tmp_path / "m.json")["variants"][0]
    assert ref["variant"] == "reference" and ref["first_call_s"] > 0


def test_a_second_sigterm_ends_the_matrix_at_once(monkeypatch):
    """The first SIGTERM is raised as Terminated; a second (the first could not stop the process) exits 143 now."""
    import os
    import signal

    from vlaperf.profile.matrix import Terminated, sigterm_as_interrupt

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    with sigterm_as_interrupt() as state:
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(Terminated):
            handler(signal.SIGTERM, None)
        assert state.received
        with pytest.raises(SystemExit) as exited:
            try:
                handler(signal.SIGTERM, None)
            except Terminated:  # a KeyboardInterrupt: left alone, it would stop pytest itself
                pytest.fail("a second SIGTERM raised again instead of exiting")
        assert exited.value.code == 143


def test_the_program_stopped_by_sigterm_leaves_without_waiting_for_its_threads(tmp_path):
    """`vlaperf matrix` as a program, told by SIGTERM to stop, writes its file and exits 143 at once, even with a
    thread still at work that a normal exit would wait for (an engine's kernel compile pool)."""
    import subprocess
    import sys
    import time

    script = f"""
import os, signal, sys, threading, time
threading.Thread(target=time.sleep, args=(120,)).start()  # not a daemon: a normal exit waits for it
from vlaperf.profile import matrix
prepare = matrix.prepare_variant
def prepare_then_terminate(model, spec, *a, **kw):
    if spec == "for_loop":
        os.kill(os.getpid(), signal.SIGTERM)
    return prepare(model, spec, *a, **kw)
matrix.prepare_variant = prepare_then_terminate
sys.argv = ["vlaperf", "matrix", "--workload", "tiny", "--device", "cpu", "--variants", "for_loop;exact", "--warmup", "1",
            "--iters", "2", "--no-progress", "--json", {str(tmp_path / "p.json")!r}]
from vlaperf.cli import main
sys.exit(main())
"""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert done.returncode == 143, done.stderr[-2000:]
    assert time.monotonic() - start < 60  # not the thread's 120 s
    r = read_result(tmp_path / "p.json")
    assert r["interrupted"] is True and [v["variant"] for v in r["variants"]] == ["reference", "for_loop", "exact"]
    assert "interrupted: wrote the 3 rows so far" in done.stdout


def test_matrix_takes_levers_as_its_variants_and_check_refuses_before_running(tmp_path, capsys):
    """`matrix --levers` (the issue's spelling, and bench's and check's name) is --variants, never
    ignored; the two together must agree. `check` refuses a variant that cannot run on this device
    before it checks any, naming the variant."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "m.json"
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--levers", "exact;graph", "--warmup", "1",
                 "--iters", "2", "--no-progress", "--json", str(out)]) == 0
    rows = read_result(out)["variants"]
    assert [r["variant"] for r in rows] == ["reference", "exact", "graph"]
    assert "timers" in rows[1] and "cuda_graph needs a CUDA device" in rows[2]["skipped"]
    out = capsys.readouterr().out  # the reason below the table, its row marked
    assert "skipped [1]" in out and "[1] graph: cuda_graph needs a CUDA device" in out
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--levers", "exact", "--variants", "grid"]) == 2
    assert "--levers 'exact' and --variants 'grid': give one of them" in capsys.readouterr().err
    assert main(["check", "--workload", "tiny", "--device", "cpu", "--levers", "exact;graph;best"]) == 2
    captured = capsys.readouterr()
    assert "variant 'graph' cannot run here: cuda_graph needs a CUDA device" in captured.err
    assert "vlaperf check" not in captured.out  # refused before the first variant's check printed anything


def test_levers_lists_every_lever(capsys):
    from vlaperf.engine import LEVERS

    assert main(["levers"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in LEVERS)
    # where best takes the kernels: on Hopper, for a bfloat16 model (a float32 model's best is compile + graph)
    said = " ".join(out.replace("\u2502", " ").split())  # the presets' cells wrap over rows
    assert "; + triton_kernels, megakernel on Hopper, compute capability 9.x, for a bfloat16 model" in said


def test_levers_are_one_line_each_and_a_name_gives_the_details(capsys):
    """The issue asks for a one-line description per lever: each fits one row of the 120-column table (some had
    grown to eight rows of measurements), and `vlaperf levers NAME` gives the rest, what the lever needs and the
    presets that hold it; a misspelt name is exit 2 with the nearest."""
    from vlaperf.engine.levers import LEVER_NOTES, LEVERS
    from vlaperf.engine.wam import WAM_LEVER_NOTES, WAM_LEVERS

    for table in (LEVERS, WAM_LEVERS):
        assert all(len(desc) <= 92 and "\n" not in desc for desc in table.values()), table
    assert set(LEVER_NOTES) <= set(LEVERS) and set(WAM_LEVER_NOTES) <= set(WAM_LEVERS)
    assert main(["levers"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("\u2502")]
    firsts = [r.split("\u2502")[1].strip() for r in rows]
    for name in [*LEVERS, *WAM_LEVERS]:  # a lever's row is one line: the next row starts with a name
        i = firsts.index(name)
        assert i + 1 == len(firsts) or firsts[i + 1] != "", (name, rows[i:i + 2])
    assert main(["levers", "megakernel", "sdpa"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "megakernel (pi0 family): " + LEVERS["megakernel"] in out and "1.28x over compile" in out
    assert "needs: fuse_projections, static_kv_cache; in presets: best (best: on Hopper GPUs" in out
    assert "sdpa (pi0 family)" in out and "sdpa (world-action model)" in out  # a name both models have
    assert "in presets: exact, graph, best" in out
    assert main(["levers", "megakernal"]) == 2
    err = capsys.readouterr().err
    assert "vlaperf levers: error: unknown lever 'megakernal' (did you mean 'megakernel'?)" in err
    assert "host_schedule" in err
    # a preset names the levers it holds, in both families; a lever with its value is the lever
    assert main(["levers", "best", "compile=max-autotune"]) == 0
    out = capsys.readouterr().out
    assert "best (pi0-family preset): for_loop, skip_masked_images," in out and "group_modulation" in out
    assert "; + triton_kernels, megakernel on Hopper GPUs for a bfloat16 model" in out
    assert "compile (pi0 family): " in out
    assert main(["levers", "bset"]) == 2 and "(did you mean 'best'?)" in capsys.readouterr().err
    # `serve`, the preset the table lists for `vlaperf serve`, is described, not refused as an unknown lever
    assert main(["levers", "serve"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "serve (`vlaperf serve`'s default --levers, taken by no other command): graph on a GPU (for_loop," in out
    assert main(["levers"]) == 0 and "serve (`vlaperf serve` only)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["serve", "--batch", "2"], "vlaperf serve: error: unrecognized arguments: --batch 2 (--batch: did you mean "
                                "--max-batch?)"),
    (["bench", "--warmpu", "3"], "vlaperf bench: error: unrecognized arguments: --warmpu 3 (--warmpu: did you mean "
                                 "--warmup?)"),
    (["bench", "extra"], "vlaperf bench: error: unrecognized arguments: extra\n"),
    (["report", "a.json", "-o", "r.md", "--bogus"], "vlaperf report: error: unrecognized arguments: --bogus\n"),
])
def test_an_option_the_command_does_not_take_is_named_with_the_command_and_the_nearest(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"usage: vlaperf {argv[0]} ")  # the command's usage, not vlaperf's


def test_schema_rejects_incomplete_results():
    with pytest.raises(SchemaError, match="missing key 'env'"):
        validate_result({"schema": "vlaperf.result/1", "command": "bench", "workload": {"id": "tiny", "overrides": {}}})
    with pytest.raises(SchemaError, match="timers.wall_ms: missing 'p99'"):
        validate_result({"schema": "vlaperf.result/1", "command": "bench", "workload": {"id": "t", "overrides": {}},
                         "env": {k: None for k in ("gpu", "driver", "cuda", "torch", "triton", "python", "vlaperf",
                                                   "git_commit", "env_vars", "c_compiler")},
                         "timers": {"wall_ms": {"count": 1, "median": 1.0}}})


def test_console_script_end_to_end(tmp_path):
    """The installed entry point, as the README runs it."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "vlaperf.cli", "bench", "--workload", "tiny", "--device", "cpu",
                           "--iters", "3", "--warmup", "1", "--json", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["timers"]["wall_ms"]["count"] == 3


def test_module_entry_reports_subcommand_errors_without_traceback():
    """`python -m vlaperf.cli` (a second copy of the module as __main__) still turns a
    subcommand's CliError into one line and exit code 2."""
    # scaling lives in vlaperf.profile.commands, which raises vlaperf.cli.CliError
    proc = subprocess.run([sys.executable, "-m", "vlaperf.cli", "scaling", "--workload", "tiny", "--device", "cpu",
                           "--levers", "cuda_graph", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "vlaperf scaling: error: cuda_graph needs a CUDA device" in proc.stderr


def test_python_dash_m_vlaperf_is_the_vlaperf_command():
    """`python -m vlaperf` runs the same parser as the `vlaperf` script: its name in the usage and the version, a
    subcommand's CliError as one line and exit code 2."""
    proc = subprocess.run([sys.executable, "-m", "vlaperf", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("vlaperf ")
    proc = subprocess.run([sys.executable, "-m", "vlaperf", "bench", "--workload", "tiny", "--device", "cpu",
                           "--levers", "cuda_graph", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "vlaperf bench: error: cuda_graph needs a CUDA device" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "vlaperf", "nonsense"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: vlaperf ")


def test_an_empty_inductor_cache_is_refused_in_a_fresh_process(tmp_path):
    """TORCHINDUCTOR_CACHE_DIR="" (a script's `=$UNSET`): the compile lever refuses it and the doctor warns, as
    docs/profiling.md says, also after a model was built. Building one imports torch._dynamo, whose inductor writes
    the current folder back into the variable; the check then saw a folder, and `bench --levers for_loop,compile`
    compiled and left inductor's cache in the current folder. A fresh process, since this one imported torch._dynamo
    long ago."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR="",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    run = tmp_path / "cwd"
    run.mkdir()
    proc = subprocess.run([sys.executable, "-m", "vlaperf.cli", "bench", "--workload", "tiny", "--device", "cpu",
                           "--levers", "for_loop,compile", "--no-check", "--warmup", "1", "--iters", "1",
                           "--no-progress"], capture_output=True, text=True, timeout=300, cwd=run, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "TORCHINDUCTOR_CACHE_DIR is set but empty" in proc.stderr, proc.stderr
    assert not list(run.iterdir())  # nothing compiled into the current folder
    out = tmp_path / "doctor.json"
    proc = subprocess.run([sys.executable, "-m", "vlaperf.cli", "doctor", "--workload", "tiny", "--device", "cpu",
                           "--no-measure", "--no-progress", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=run, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cache = next(f for f in read_result(out)["findings"] if f["id"] == "env.compile_cache")
    assert (cache["severity"], cache["title"]) == ("warning", "TORCHINDUCTOR_CACHE_DIR set but empty")


def test_compile_cache_dir_is_used_and_recorded(tmp_path, monkeypatch, capsys):
    """--compile-cache DIR points Triton's and inductor's caches into DIR (created), the result file
    records where, and a path that is a file is refused with the option named."""
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):  # restored after the test
        monkeypatch.setenv(var, "unset-by-test")
    cache, out = tmp_path / "cache", tmp_path / "r.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "0", "--iters", "1", "--no-progress",
                 "--compile-cache", str(cache), "--json", str(out)]) == 0
    env = read_result(out)["env"]["env_vars"]
    assert env["TRITON_CACHE_DIR"] == str(cache / "triton") and env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert (cache / "triton").is_dir() and (cache / "inductor").is_dir()
    (tmp_path / "file").write_text("x")
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "0", "--iters", "1", "--no-progress",
                 "--compile-cache", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "--compile-cache: " in err and "is a file; expected a directory" in err, err
    # an empty one (an unset shell variable) was taken as none given
    with pytest.raises(SystemExit):
        main(["bench", "--workload", "tiny", "--device", "cpu", "--compile-cache", ""])
    assert "argument --compile-cache: expected a path, got an empty string" in capsys.readouterr().err
    # the environment-only doctor ignored it and advised the flag just given; its finding now names the caches
    other, out = tmp_path / "other", tmp_path / "doctor.json"
    assert main(["doctor", "--no-measure", "--compile-cache", str(other), "--json", str(out)]) in (0, 1)
    (finding,) = [f for f in read_result(out)["findings"] if f["id"] == "env.compile_cache"]
    assert str(other / "triton") in finding["detail"] and str(other / "inductor") in finding["detail"]


def test_inductor_writes_into_the_compile_cache_set_at_run_time(tmp_path):
    """The variables are set after torch is imported (by the CLI); inductor must still read them
    when it first caches a graph. Checked in a fresh process that compiles a small function."""
    from vlaperf.engine.compile import compile_blockers

    if compile_blockers():
        pytest.skip("inductor cannot compile here: " + "; ".join(compile_blockers()))
    script = (
        "import torch\n"
        "from vlaperf.engine.compile import use_compile_cache\n"
        f"use_compile_cache({str(tmp_path / 'c')!r})\n"
        "f = torch.compile(lambda x: (x * 2 + 1).sum(), fullgraph=True)\n"
        "print(float(f(torch.ones(8))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("24.0"), proc.stderr[-2000:]
    written = [p for p in (tmp_path / "c" / "inductor").rglob("*") if p.is_file()]
    assert written, "inductor wrote nothing under the compile cache"


@pytest.mark.parametrize("where,message", [
    ("afile/x.json", "is a file, not a folder"),
    ("/proc/vlaperf-test/x.json", "cannot write in '/proc'"),
    ("newdir/", "argument --json: expected a file path, got 'newdir/' (a trailing separator names a folder)"),
])
def test_an_unwritable_output_is_refused_before_the_run(tmp_path, capsys, monkeypatch, where, message):
    """--json (and every output option) is checked before the run: under a file, where nothing can be written, or
    a name ending in a separator (a folder, not a file), is one line and exit 2, with nothing measured first."""
    import vlaperf.cli as cli

    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "cmd_bench", lambda args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--workload", "tiny", "--device", "cpu", "--json", where])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "newdir").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--json", "new/deeper/x.json", "--iters", "1",
                 "--warmup", "0", "--no-progress"]) == 0
    assert (tmp_path / "new" / "deeper" / "x.json").is_file()  # a missing folder is created at the write
    with pytest.raises(SystemExit):
        main(["scaling", "--workload", "tiny", "--device", "cpu", "--plot", "t.txt"])
    assert "expected a .png file name" in capsys.readouterr().err


def test_main_turns_interrupts_file_errors_and_out_of_memory_into_one_line(monkeypatch, capsys):
    import vlaperf.cli as cli

    def raising(exc):
        def cmd(args):
            raise exc
        return cmd

    cases = [(KeyboardInterrupt(), 130, "vlaperf bench: interrupted"),
             (FileNotFoundError(2, "No such file or directory", "/x/y.json"), 2, "error: /x/y.json: No such file"),
             (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1310720000 bytes"), 2,
              "error: out of memory (DefaultCPUAllocator"),
             (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB"), 2, "out of memory (CUDA out")]
    for exc, code, message in cases:
        monkeypatch.setattr(cli, "cmd_bench", raising(exc))
        assert main(["bench", "--device", "cpu"]) == code
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    monkeypatch.setattr(cli, "cmd_bench", raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # anything else stays a traceback: a bug to see whole
        main(["bench", "--device", "cpu"])
    monkeypatch.setattr(cli, "cmd_bench", raising(ValueError("another bug")))
    with pytest.raises(ValueError, match="another bug"):
        main(["bench", "--device", "cpu"])


def test_a_lever_that_fails_when_it_runs_is_one_line_in_any_command(monkeypatch, capsys):
    """A LeverError raised by a call (the megakernel's float32 tiles on a Hopper GPU, session 65) inside a command
    that does not catch it, such as check, is the lever's message and exit 2, not a traceback."""
    import vlaperf.check
    from vlaperf.engine.levers import LeverError

    def does_not_fit(*a, **kw):
        raise LeverError("megakernel: the expert_step kernel does not fit NVIDIA H100 in float32; Run in bfloat16")

    monkeypatch.setattr(vlaperf.check, "check_equivalence", does_not_fit)
    monkeypatch.setattr(vlaperf.check, "check_wam_equivalence", does_not_fit)
    assert main(["check", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact"]) == 2
    err = capsys.readouterr().err
    assert "vlaperf check: error: megakernel: the expert_step kernel does not fit" in err and "Traceback" not in err
    # bench's first call and the world-action breakdown's set-up go the same way (they had wrappers of their own)
    import vlaperf.cli as cli
    from vlaperf.profile import wam

    monkeypatch.setattr(cli, "_timed_once", does_not_fit)
    monkeypatch.setattr(wam, "breakdown_call", does_not_fit)
    for argv in (["bench", "--workload", "tiny", "--levers", "for_loop"], ["breakdown", "--workload", "wam-tiny"]):
        assert main([*argv, "--device", "cpu", "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert f"vlaperf {argv[0]}: error: megakernel: the expert_step kernel" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["bench", "--batch", "5000"])
    assert "expected an integer >= 1 and <= 1024" in capsys.readouterr().err


def test_doctor_with_levers_and_no_workload_checks_them_on_the_default(tmp_path):
    out = tmp_path / "d.json"
    main(["doctor", "--device", "cpu", "--levers", "exact", "--no-measure", "--json", str(out)])
    r = read_result(out)
    assert r["workload"]["id"] == "tiny"  # not dropped: the default workload's doctor ran
    # the levers resolved, as bench records them (an empty list before), and the preset's name as the label
    from vlaperf.engine.levers import EXACT
    assert r["variant"]["levers"] == list(EXACT) and r["variant"]["label"] == "exact"


def test_workloads_lists_every_workload_and_what_serves_it(tmp_path, capsys):
    from vlaperf.workloads import WAM_WORKLOADS, WORKLOADS

    out = tmp_path / "w.json"
    assert main(["workloads", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(w in printed for w in list(WORKLOADS) + list(WAM_WORKLOADS))
    assert f"wrote {out}" in printed  # as every other command that writes a file says
    doc = json.loads(out.read_text())
    by_id = {r["id"]: r for r in doc["pi0"]}
    assert by_id["droid-pi05"]["actions"] == "15 x 8 (32)" and by_id["droid-pi05"]["layout"] == "droid"
    assert by_id["libero-pi0-b4"]["prompt"] == "12..28 of 48"
    serves = {c["name"]: c["workloads"] for c in doc["conventions"]}
    assert serves["openpi:pi05_droid"] == ["droid-pi05"] and serves["openpi:pi0_droid"] == ["droid-pi0"]
    assert serves["lerobot:pi05"] == ["libero-pi05", "droid-pi05", "aloha-pi05"]
    assert [w["id"] for w in doc["world_action"]] == list(WAM_WORKLOADS)


def test_a_negative_list_value_gets_the_option_s_own_message(capsys):
    """argparse read "-1,2" as an option ("expected one argument"); it now reaches the option's type, whose message
    names the range."""
    from vlaperf.cli import join_negative_values

    assert join_negative_values(["scaling", "--steps", "-1,2", "--seed", "-3", "--no-progress"]) == \
        ["scaling", "--steps=-1,2", "--seed=-3", "--no-progress"]
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "--device", "cpu", "--steps", "-1,2"])
    assert exit_info.value.code == 2
    assert "--steps: expected at least two different step counts in 1..1000, got '-1,2'" in capsys.readouterr().err


def test_an_empty_api_key_variable_is_an_error_not_no_auth(monkeypatch, capsys):
    monkeypatch.setenv("VLAPERF_API_KEY", "")
    assert run_cli(["serve", "--workload", "tiny", "--device", "cpu", "--port", "0"]) == 2
    assert "$VLAPERF_API_KEY is set but empty" in capsys.readouterr().err


def test_presets_say_what_they_leave_out_on_the_cpu():
    """The grid and the cumulative table are shorter on a CPU: said before the matrix runs, for both model families."""
    from vlaperf.profile.matrix import grid_variants, left_out_on
    from vlaperf.profile.wam import grid_variants as wam_grid

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert left_out_on("grid", cpu) == "grid on cpu: the compile=reduce-overhead and cuda_graph rows need a CUDA device " \
                                      "and are left out"
    assert not any("cuda_graph" in v or "reduce-overhead" in v for v in grid_variants(cpu))
    assert "exact + compile=reduce-overhead, graph and best rows" in left_out_on("grid", cpu, wam=True)
    assert "best" not in wam_grid(cpu) and "best" in wam_grid(gpu)
    assert left_out_on("cumulative", cpu).startswith("cumulative on cpu: the table ends at the exact levers")
    assert left_out_on("grid", gpu) is None and left_out_on("for_loop;sdpa", cpu) is None


@pytest.mark.parametrize("workload", ["tiny", "wam-tiny"])
def test_a_matrix_file_says_what_its_preset_left_out_and_the_report_shows_it(workload, tmp_path, monkeypatch, capsys):
    """`--variants grid` on a CPU printed which rows it left out, but its file did not say, so a report of it read
    as the whole grid. The file now has `left_out` (here: interrupted before the first row, to keep it cheap; a
    finished file gets the same field) and the report's matrix section says it."""
    from vlaperf.profile import matrix, wam
    from vlaperf.profile.matrix import left_out_on
    from vlaperf.report.render import render
    from vlaperf.report.schema import read_result

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "prepare_variant", ctrl_c)  # the pi0 family's first row
    monkeypatch.setattr(wam, "call_fn", ctrl_c)  # the world-action model's
    m = tmp_path / "m.json"
    assert main(["matrix", "--workload", workload, "--device", "cpu", "--variants", "grid", "--no-progress",
                 "--json", str(m)]) == 130
    note = left_out_on("grid", torch.device("cpu"), wam=workload == "wam-tiny")
    assert note in capsys.readouterr().out
    r = read_result(m)
    assert r["left_out"] == note and r["interrupted"] is True
    out = render([m], tmp_path / "r.md", jobs=1)
    assert f"{note}." in out.read_text()


def test_check_all_says_where_compile_was_checked_and_that_best_skipped_it_without_a_compiler(monkeypatch):
    """On a GPU, `check --levers all` said "best checks them" of compile and compile_layers even where best falls back
    to the graph preset (no C compiler for Triton): nothing had checked compile. It now says why nothing did."""
    import vlaperf.engine.levers as levers_mod
    from vlaperf.cli import not_checked_alone

    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    gpu = torch.device("cuda")
    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    assert not_checked_alone(gpu).endswith("(compile and compile_layers take minutes alone; best checks them)")
    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: ["no C compiler (gcc/clang) on PATH"])
    line = not_checked_alone(gpu)
    assert "best checks them" not in line and "no C compiler (gcc/clang) on PATH): nothing checked compile" in line
    assert line.startswith("not checked alone: compile, compile_layers")
    assert "need a GPU" in not_checked_alone(torch.device("cpu"))


def test_a_non_finite_check_writes_strict_json_and_blames_the_reference(tmp_path, capsys):
    """A checkpoint whose values overflow made the reference's own actions NaN: `check --json` wrote bare NaN (not
    JSON: JSON.parse refuses the file) and the table blamed every variant. The file now holds null and says which
    side was not finite, and the command says the reference is broken."""
    from safetensors.torch import save_file

    from vlaperf.checkpoints import read_tensors, save_checkpoint
    from vlaperf.models.pi0 import build_model

    tensors = read_tensors(save_checkpoint(build_model("tiny", seed=0), tmp_path / "ok"))
    save_file({k: v * 1e12 if v.ndim == 2 else v for k, v in tensors.items()}, str(tmp_path / "huge.safetensors"))
    out = tmp_path / "check.json"
    assert main(["check", "--workload", "tiny", "--device", "cpu", "--checkpoint", str(tmp_path / "huge.safetensors"),
                 "--levers", "exact", "--json", str(out)]) == 1
    assert "the reference's own actions hold NaN or inf" in capsys.readouterr().err
    (row,) = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in a result file"))["checks"]
    assert row["rel_l2"] is None and row["max_abs"] is None and row["reference_finite"] is False and not row["passed"]


def test_write_result_writes_non_finite_numbers_as_null(tmp_path):
    from vlaperf.report.schema import strict_json, write_result

    assert strict_json({"a": [1.0, float("nan"), {"b": float("-inf")}], "c": (2, "x")}) == \
        {"a": [1.0, None, {"b": None}], "c": [2, "x"]}
    bench = tmp_path / "b.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--iters", "2", "--warmup", "1", "--no-progress",
                 "--json", str(bench)]) == 0
    result = json.loads(bench.read_text())
    result["extra"] = {"ratio": float("inf"), "values": [float("nan"), 0.5]}
    write_result(result, tmp_path / "w.json")
    back = json.loads((tmp_path / "w.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert back["extra"] == {"ratio": None, "values": [None, 0.5]}


def test_the_grid_is_each_compile_mode_over_loop_only_and_all_exact_levers():
    """grid: reference, then {eager, compile default} (on a CPU) over {for_loop, exact}, each a valid spec."""
    from vlaperf.engine.levers import Levers
    from vlaperf.profile.matrix import grid_variants, parse_variants

    cpu = torch.device("cpu")
    grid = parse_variants("grid", cpu)
    assert grid == grid_variants(cpu) and len(grid) == 5 and grid[0] == "reference"
    loop, loop_c, exact, exact_c = (Levers.parse(v, cpu) for v in grid[1:])
    assert loop == Levers.parse("for_loop", cpu) and exact == Levers.parse("exact", cpu)
    assert loop_c.names() == loop.names() + ["compile=default"]
    assert exact_c.names() == exact.names() + ["compile=default"]


def test_the_matrix_tables_tell_every_gpu_grid_and_cumulative_row_apart(monkeypatch):
    """A long variant is shortened in the printed table; cut to 4 letters a lever, the GPU grid's exact levers with
    compile=default and with compile=reduce-overhead were both printed '...+fuse+comp'."""
    from rich.console import Console
    from rich.table import Table

    from vlaperf.profile.matrix import _print, cumulative_variants, grid_variants
    from vlaperf.profile.ray_matrix import print_ray_matrix
    from vlaperf.workloads import get_workload

    cuda = torch.device("cuda")
    for variants in (grid_variants(cuda), cumulative_variants(cuda)):
        rows = [{"variant": v, "levers": [], "skipped": "x"} for v in variants]
        console = Console(width=400, record=True)
        _print(rows, get_workload("tiny"), cuda, console, Table)
        names = [line.split("\u2502")[1].strip() for line in console.export_text().splitlines()
                 if line.startswith("\u2502")]
        assert len(names) == len(variants) == len(set(names)), names
        assert "loop+skipimg+trim+kv+sdpa+fuse+c:reduce-overhead" in names or variants != grid_variants(cuda)
        # one table names a lever one way: the cumulative table printed for_loop,skip_masked_images above
        # loop+skipimg+trim+kv
        assert not any("for_loop," in n or "_masked_" in n for n in names), names
    result = {"workload": {"id": "tiny"}, "ray": {"tasks": 2, "devices": ["a"]},
              "variants": [{"variant": v, "skipped": "x"} for v in grid_variants(cuda)]}
    console = Console(width=400, record=True)
    monkeypatch.setattr("vlaperf.cli.wide_console", lambda *a: console)
    print_ray_matrix(result)
    names = [line.split("\u2502")[1].strip() for line in console.export_text().splitlines() if line.startswith("\u2502")]
    assert len(names) == len(set(names)) == len(grid_variants(cuda)), names
    assert not any("for_loop," in n for n in names), names


def test_the_ray_matrix_plans_the_variants_of_the_dtype_its_tasks_build(monkeypatch):
    """The Ray matrix's tasks build their models in --dtype and resolve `best` for it (a float32 model's has no kernels
    on Hopper); the driver planned the cumulative table and checked for a variant given twice as for bfloat16, so a
    float32 table ended in explicit triton_kernels and megakernel rows (libero-pi0's step kernel does not fit an H100
    in float32) and `best` beside its float32 lever list was two tasks of one variant."""
    import types

    import vlaperf.engine.levers as levers_mod
    from vlaperf.cli import CliError
    from vlaperf.engine.levers import Levers
    from vlaperf.profile.ray_matrix import ray_matrix

    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    planned = []

    class Planned(Exception):  # every task planned: the fake cluster stops the matrix there
        pass

    def remote(**options):
        return lambda fn: types.SimpleNamespace(remote=lambda task: planned.append(task) or len(planned))

    fake = types.SimpleNamespace(cluster_resources=lambda: {"GPU": 1, "CPU": 2}, remote=remote, nodes=lambda: [],
                                 wait=lambda *a, **kw: (_ for _ in ()).throw(Planned()))
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(Planned):
        ray_matrix(["libero-pi0"], "cumulative", dtype="float32", log=lambda m: None)
    last = Levers.parse(planned[-1]["variant"])
    assert last == Levers.parse("best", "cuda", torch.float32) and not last.megakernel and not last.triton_kernels
    assert {t["dtype"] for t in planned} == {"float32"}
    planned.clear()
    with pytest.raises(Planned):  # bfloat16, the GPU's default: the table goes on to the kernels
        ray_matrix(["libero-pi0"], "cumulative", log=lambda m: None)
    assert Levers.parse(planned[-1]["variant"]) == Levers.parse("best", "cuda", torch.bfloat16)
    assert Levers.parse(planned[-1]["variant"]).megakernel
    fp32 = ",".join(Levers.parse("best", "cuda", torch.float32).names())
    with pytest.raises(CliError, match=f"'best' and '{fp32}' are the same variant on cuda"):
        ray_matrix(["libero-pi0"], f"best;{fp32}", dtype="float32", log=lambda m: None)


def test_the_reference_given_among_matrix_variants_is_its_reference_row():
    """'none;exact' was refused as "'reference' and 'none' are the same variant", naming a 'reference' the user
    never typed: the matrix adds the reference itself. A reference given anywhere is now that first row."""
    from vlaperf.profile import wam
    from vlaperf.profile.matrix import parse_variants

    cpu = torch.device("cpu")
    assert parse_variants("none;exact", cpu) == parse_variants("exact;reference", cpu) == ["reference", "exact"]
    assert wam.parse_variants("exact;none", cpu) == ["reference", "exact"]


def test_resolve_shape_applies_and_checks_the_conventions_horizon(capsys):
    """--conventions set the chunk they were trained with (the workload's and the model's), refuse an
    --action-horizon that contradicts it and a model family they do not fit; --action-horizon alone overrides
    the workload's chunk. A chunk the conventions change is said once (it was silent: tiny's 10 actions became 50)."""
    from argparse import Namespace

    from vlaperf.cli import CliError, resolve_shape
    from vlaperf.workloads import get_workload

    base = get_workload("tiny")  # pi0, libero layout, 10 actions a chunk

    def shape(**kw):
        args = Namespace(**{"conventions": None, "action_horizon": None, "batch": None, "steps": None, **kw})
        workload, config = resolve_shape(args, base)
        return workload.horizon, config.action_horizon, workload.overrides_vs(base)

    assert shape() == (10, 10, {})
    assert shape(action_horizon=10) == (10, 10, {})
    assert shape(action_horizon=7, batch=2) == (7, 7, {"horizon": 7, "batch": 2})
    assert capsys.readouterr().err == ""
    assert shape(conventions="openpi:pi0_libero") == (50, 50, {"horizon": 50})
    assert capsys.readouterr().err == ("vlaperf: 50 actions a chunk, as --conventions openpi:pi0_libero were trained; "
                                       "workload tiny has 10\n")
    args = Namespace(conventions="openpi:pi0_libero", action_horizon=None, batch=None, steps=None)
    resolve_shape(args, base)
    resolve_shape(args, base)  # serve resolves the shape twice: said once
    assert capsys.readouterr().err.count("actions a chunk") == 1
    assert shape(conventions="openpi:pi0_libero", action_horizon=50) == (50, 50, {"horizon": 50})
    assert capsys.readouterr().err == ""  # asked for in so many words
    libero = get_workload("libero-pi0")  # the conventions' own chunk: nothing to say
    resolve_shape(Namespace(conventions="openpi:pi0_libero", action_horizon=None, batch=None, steps=None), libero)
    assert capsys.readouterr().err == ""
    with pytest.raises(CliError, match="--action-horizon 7: --conventions openpi:pi0_libero were trained with 50 "
                                       "actions a chunk"):
        shape(conventions="openpi:pi0_libero", action_horizon=7)
    with pytest.raises(CliError, match=r"--conventions: conventions 'openpi:pi05_libero' are for pi05 checkpoints; "
                                       r"the model is pi0 \(workload tiny\)"):
        shape(conventions="openpi:pi05_libero")


def test_argument_types_take_their_bounds_and_refuse_what_is_past_them(tmp_path):
    """Each bound is inclusive where the message says '>=' / '<=' and exclusive where it says '>'; inf is no
    number an option means; blank strings are empty; a device index is digits."""
    import argparse

    from vlaperf import cli

    accepted = [(cli.steps_int, "1000", 1000), (cli.port_int, "65535", 65535), (cli.port_int, "0", 0),
                (cli.non_negative_int, "0", 0), (cli.non_negative_float, "0", 0.0), (cli.positive_float, "0.5", 0.5),
                (cli.seed_int, str(2**63 - 1), 2**63 - 1), (cli.batch_int, "1024", 1024), (cli.horizon_int, "1", 1),
                (cli.horizon_int, "256", 256), (cli.device_arg, "cuda:1", "cuda:1"), (cli.png_file, "T.PNG", "T.PNG")]
    for parse, text, value in accepted:
        assert parse(text) == value, (parse, text)
    refused = [(cli.steps_int, "1001", "expected an integer >= 1 and <= 1000, got 1001"),
               (cli.positive_float, "0", "expected a number > 0, got 0"),
               (cli.non_negative_float, "inf", "expected a finite number >= 0, got 'inf'"),
               (cli.positive_float, "-inf", "expected a number > 0, got -inf"),
               (cli.horizon_int, "257", "expected an integer >= 1 and <= 256, got 257"),
               (cli.horizon_int, "0", "expected an integer >= 1 and <= 256, got 0"),
               (cli.batch_int, "1025", "expected an integer >= 1 and <= 1024, got 1025"),
               (cli.device_arg, "cuda1", "expected cpu, cuda or cuda:N, got 'cuda1'"),
               (cli.workload_arg, "  ", "expected a workload id, got an empty string"),
               (cli.output_file, " ", "expected a file path, got an empty string"),
               (cli.levers_arg, " ", "expected 'reference', a preset or a comma list of levers, got an empty string"),
               (cli.levers_arg, "best;", "empty variant in 'best;'"),
               (cli.png_file, str(tmp_path / "plot.svg"), "expected a .png file name")]
    for parse, text, message in refused:
        with pytest.raises(argparse.ArgumentTypeError) as e:
            parse(text)
        assert message in str(e.value), (text, str(e.value))


def test_number_errors_show_the_numbers_readably_and_never_rounded_into_the_bound():
    """A float in the range message is written as `:g` writes it where that reads back as the same float (2e+13, not
    20000000000000.0; 1000, not 1000.0), else in just enough digits to read back as it: a refused value just below
    1/1024 is not shown as the bound (`:g` writes both as 0.000976562)."""
    import argparse
    import math

    from vlaperf import cli

    message_mb = cli.number_arg(float, 1 / 1024, maximum=4096.0)
    below = math.nextafter(1 / 1024, 0)
    cases = [(message_mb, "2e13", "expected a number >= 0.0009765625 and <= 4096, got 2e+13"),
             (message_mb, repr(below), "expected a number >= 0.0009765625 and <= 4096, got 0.0009765624999999999"),
             (message_mb, "0.000976562499", "expected a number >= 0.0009765625 and <= 4096, got 0.000976562499"),
             (cli.number_arg(float, 0, strict=True, maximum=1000.0), "5000",
              "expected a number > 0 and <= 1000, got 5000"),
             (cli.positive_float, "-0.5", "expected a number > 0, got -0.5"),
             (cli.seed_int, str(2**63), "expected an integer >= 0 and <= 9223372036854775807, got 9223372036854775808")]
    for parse, text, message in cases:
        with pytest.raises(argparse.ArgumentTypeError) as e:
            parse(text)
        assert str(e.value) == message, (text, str(e.value))
    assert message_mb(repr(1 / 1024)) == 1 / 1024  # the bound as shown is accepted
    for x in (1 / 3, 0.1, 123456789.0, 1e-300, 2.0**63, below):  # any float: read back as itself
        assert float(cli.exact_number(x)) == x


def test_bench_none_is_the_reference_and_no_check_is_recorded(tmp_path, capsys):
    """--levers none is the reference (no engine, nothing to check); --no-check skips a variant's check and the file
    says so; one timed call is "call", not "calls"."""
    common = ["bench", "--workload", "tiny", "--device", "cpu", "--warmup", "0", "--no-progress", "--json"]
    assert main(common + [str(tmp_path / "n.json"), "--levers", "none", "--iters", "1"]) == 0
    r = read_result(tmp_path / "n.json")
    assert r["variant"]["label"] == "reference" and r["variant"]["levers"] == []
    assert r["equivalence"] is None and r["first_call_timing"] == "reference: no check"
    assert "1 timed call after 1 warm-up" in " ".join(capsys.readouterr().out.split())  # --warmup 0: the first call
    assert main(common + [str(tmp_path / "x.json"), "--levers", "exact", "--no-check", "--iters", "2"]) == 0
    r = read_result(tmp_path / "x.json")
    assert r["equivalence"] is None and r["first_call_timing"] == "not checked (--no-check)"
    assert "2 timed calls after 1 warm-up" in " ".join(capsys.readouterr().out.split())


def test_bench_refuses_to_time_a_variant_that_fails_its_check(monkeypatch, tmp_path, capsys):
    import vlaperf.check

    monkeypatch.setattr(vlaperf.check, "check_equivalence", lambda model, engine, workload, rtc=None: {
        "passed": False, "rel_l2": 0.5, "max_abs": 1.0, "tolerance": 1e-4, "seeds": 2})
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", "sdpa", "--warmup", "0", "--iters", "1",
                 "--no-progress", "--json", str(out)]) == 1
    assert "vlaperf: variant sdpa fails equivalence (rel_l2 0.5 > 0.0001); refusing to report its speed" in \
        capsys.readouterr().err
    assert not out.exists()


def test_check_keeps_its_rows_when_a_variant_cannot_run(monkeypatch, tmp_path, capsys):
    """`check --levers all` of a float32 model on an H100 checked each lever, then the megakernel's run raised (its
    float32 tiles do not fit): the command ended with that message and every row checked before it was lost. The
    variant is now a row of its own that says why, the others are checked and kept, and the exit is 2 (1 where a
    variant that ran gave other actions: the finding check is for)."""
    import vlaperf.check
    from vlaperf.engine.levers import LeverError
    from vlaperf.report.render import render

    real = vlaperf.check.check_equivalence
    verdicts = {}

    def kernel_does_not_fit(model, engine, workload, **kw):
        if "sdpa" in engine.levers.names():
            raise LeverError("megakernel: the expert_step kernel does not fit NVIDIA H100 in float32")
        row = real(model, engine, workload, **kw)
        return {**row, "passed": verdicts.get(engine.name, row["passed"])}

    monkeypatch.setattr(vlaperf.check, "check_equivalence", kernel_does_not_fit)
    out = tmp_path / "c.json"
    argv = ["check", "--workload", "tiny", "--device", "cpu", "--levers", "for_loop;sdpa;for_loop,static_kv_cache",
            "--json", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "sdpa could not run: megakernel: the expert_step kernel does not fit NVIDIA H100 in float32" in captured.err
    assert "could not run" in captured.out and "Traceback" not in captured.err
    rows = read_result(out)["checks"]
    assert [r["variant"] for r in rows] == ["for_loop", "sdpa", "for_loop+static_kv_cache"]
    assert rows[0]["passed"] and rows[2]["passed"] and rows[0]["rel_l2"] is not None
    failed = rows[1]
    assert failed["variant"] == "sdpa" and not failed["passed"] and failed["rel_l2"] is None
    assert failed["error"].startswith("megakernel: the expert_step kernel") and failed["tolerance"] == 1e-4
    assert failed["dtype"] == "float32" and failed["seeds"] == 2
    page = render([out], tmp_path / "r.md", jobs=1).read_text()
    assert "could not run" in page and "sdpa could not run: megakernel: the expert_step kernel" in page
    # a variant that ran and failed outranks one that could not run
    verdicts["for_loop"] = False
    assert main(argv) == 1
    assert read_result(out)["checks"][0]["passed"] is False


def test_matrix_skips_a_variant_that_cannot_run_and_times_the_others(monkeypatch, tmp_path, capsys):
    """The same in the matrix: a variant whose first call raises a LeverError is a skipped row that says why."""
    from vlaperf.engine.levers import LeverError
    from vlaperf.profile import matrix

    real = matrix.first_call_seconds

    def kernel_does_not_fit(engine, *a):
        if "sdpa" in engine.levers.names():
            raise LeverError("triton_kernels: the small_m_matmul kernel does not fit this GPU")
        return real(engine, *a)

    monkeypatch.setattr(matrix, "first_call_seconds", kernel_does_not_fit)
    out = tmp_path / "m.json"
    assert main(["matrix", "--workload", "tiny", "--device", "cpu", "--variants", "for_loop;sdpa", "--iters", "2",
                 "--warmup", "1", "--no-progress", "--json", str(out)]) == 0
    rows = {r["variant"]: r for r in read_result(out)["variants"]}
    assert rows["sdpa"]["skipped"] == "could not run: triton_kernels: the small_m_matmul kernel does not fit this GPU"
    assert "skipped" not in rows["for_loop"] and rows["for_loop"]["timers"]["wall_ms"]["median"] > 0


def test_check_runs_the_seeds_asked_for(tmp_path):
    assert main(["check", "--workload", "tiny", "--device", "cpu", "--levers", "exact", "--seeds", "3",
                 "--json", str(tmp_path / "c.json")]) == 0
    (row,) = read_result(tmp_path / "c.json")["checks"]
    assert row["seeds"] == 3 and row["passed"]


@pytest.mark.parametrize("args,message", [
    (["--workload", "tiny", "--sparsity", "none", "--video-steps", "2", "--cfg-scale", "0"],
     "vlaperf bench: error: --sparsity, --video-steps, --cfg-scale: only for the world-action workloads (wam-761, "
     "wam-tiny)"),
    (["--workload", "tiny", "--cfg-scale", "1.5"], "error: --cfg-scale: only for the world-action workloads"),
    (["--workload", "tiny", "--mode", "forward"], "error: --mode forward: only for the world-action workloads"),
    (["--workload", "wam-tiny", "--video-steps", "1001"],
     "argument --video-steps: expected an integer >= 1 and <= 1000, got 1001"),
    (["--workload", "wam-tiny", "--cfg-scale", "-1"], "argument --cfg-scale: expected a number >= 0, got -1"),
])
def test_world_action_settings_are_refused_where_they_do_nothing(args, message, capsys):
    assert run_cli(["bench", "--device", "cpu", "--warmup", "0", "--iters", "1", "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_gpu_index_past_the_machine_s_gpus_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["bench", "--workload", "tiny", "--device", "cuda:2", "--no-progress"]) == 2
    assert "vlaperf bench: error: --device cuda:2: this machine has 2 GPU(s), cuda:0 to cuda:1" in capsys.readouterr().err


def test_negative_values_are_joined_only_to_a_long_option_without_a_value():
    from vlaperf.cli import join_negative_values

    assert join_negative_values(["--cfg-scale", "-1.5"]) == ["--cfg-scale=-1.5"]
    for argv in (["-o", "-1"], ["--seed=1", "-3"], ["--json", "-"], ["--levers", "-x"]):
        assert join_negative_values(argv) == argv


def test_main_lets_other_os_errors_through_and_keeps_the_first_line_of_an_oom(monkeypatch, capsys):
    import vlaperf.cli as cli

    def raising(exc):
        def cmd(args):
            raise exc
        return cmd

    monkeypatch.setattr(cli, "cmd_bench", raising(OSError(5, "Input/output error")))  # no file named: a bug
    with pytest.raises(OSError, match="Input/output error"):
        main(["bench", "--device", "cpu"])
    monkeypatch.setattr(cli, "cmd_bench", raising(RuntimeError("can't allocate memory: " + "x" * 300 + "\nsecond line")))
    assert main(["bench", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    first = "can't allocate memory: " + "x" * 177
    assert f"out of memory ({first}); try a smaller --batch" in err and "second line" not in err


class _Built(Exception):
    """Raised by a stand-in model builder: the notice must come before the build."""


@pytest.mark.parametrize("args, builder, notice", [
    (["bench", "--workload", "libero-pi0"], "vlaperf.models.pi0.build_model",
     "libero-pi0 on the CPU: 3.5e9 parameters, 14.0 GB of float32 weights"),
    (["check", "--workload", "libero-pi0", "--dtype", "bfloat16"], "vlaperf.models.pi0.build_model",
     "libero-pi0 on the CPU: 3.5e9 parameters, 7.0 GB of bfloat16 weights"),
    (["bench", "--workload", "wam-761"], "vlaperf.models.wam.build_wam", "wam-761 on the CPU: 1.4e9 parameters, 5.7 GB"),
])
def test_a_full_size_model_on_the_cpu_is_announced_before_its_long_build(monkeypatch, capsys, args, builder, notice):
    """libero-pi0 on a CPU took 86 s to build and 30 s a call with nothing printed: the wait is said first, with
    the weights' size against the memory available (counted on the meta device, nothing allocated)."""
    import vlaperf.cli as cli

    def build(*a, **kw):
        raise _Built

    monkeypatch.setattr(builder, build)
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: 24e9)
    with pytest.raises(_Built):
        main(args + ["--device", "cpu"])
    err = capsys.readouterr().err
    assert notice in err and "weights of the 24 GB available" in err and "The tiny workloads are the CPU's" in err
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: 2e9)
    with pytest.raises(_Built):
        main(args + ["--device", "cpu"])
    assert "weights (2 GB available: the build may be killed for memory)" in capsys.readouterr().err
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: None)  # no /proc/meminfo: the size alone
    with pytest.raises(_Built):
        main(args + ["--device", "cpu"])
    assert "weights. A model this size is slow on a CPU" in capsys.readouterr().err


def test_small_models_and_gpus_get_no_size_notice(monkeypatch, capsys):
    import vlaperf.cli as cli
    from vlaperf.models.pi0 import Pi0Model, get_config

    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--iters", "1", "--warmup", "0"]) == 0
    assert "on the CPU:" not in capsys.readouterr().err
    cli.note_size_on_cpu(Pi0Model, get_config("pi0"), torch.device("cuda"), None, "libero-pi0")  # no GPU needed
    assert capsys.readouterr().err == ""
    meminfo = cli.available_memory_bytes()
    assert meminfo is None or meminfo > 0


@pytest.mark.parametrize("workload", ["tiny", "wam-tiny"])
def test_the_reference_run_says_where_to_go_next_and_an_engine_run_does_not(capsys, workload):
    """`vlaperf bench` with no arguments times the reference: a first-time user is told which commands time the
    engine and each lever; a run of the engine is not told again."""
    base = ["bench", "--workload", workload, "--device", "cpu", "--iters", "1", "--warmup", "0"]
    assert main(base) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap the line
    semantics = " (openpi's semantics)" if workload == "tiny" else ""  # the world-action model is not openpi's
    assert f"the reference path{semantics}; next: `--levers best`" in out
    assert "`vlaperf matrix --variants cumulative` what each lever buys" in out
    assert main(base + ["--levers", "exact"]) == 0
    assert "next: `--levers best`" not in capsys.readouterr().out


def test_every_option_with_a_default_names_it_in_its_help():
    """`vlaperf <command> --help` says each option's default where it has one (a value, not None or a flag's False):
    compare's --warmup / --iters had no help at all, check's --seeds and every --seed gave none."""
    import argparse

    from vlaperf.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.option_strings[-1]}" for name, p in sub.choices.items() for action in p._actions
               if action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
               and "default" not in (action.help or "")]
    assert not missing, missing


@pytest.mark.parametrize(("warmup", "recorded"), [(0, 1), (3, 3)])
def test_bench_warmup_counts_its_first_call(tmp_path, monkeypatch, warmup, recorded):
    """--warmup W: W untimed calls before the timed ones, the first (timed on its own as first_call_s) included, as
    the help and results.md say. bench made the first call and then W more, and the second call's time was lost."""
    from vlaperf.models.pi0 import Pi0Model

    calls = []
    sample = Pi0Model.sample_actions
    monkeypatch.setattr(Pi0Model, "sample_actions", lambda self, *a, **k: (calls.append(1), sample(self, *a, **k))[1])
    out = tmp_path / "b.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--warmup", str(warmup), "--iters", "2",
                 "--no-progress", "--json", str(out)]) == 0
    r = read_result(out)
    assert len(calls) == recorded + 2 and r["warmup"] == recorded and r["timers"]["wall_ms"]["count"] == 2
    assert (r["warmup_s"] > 0.0) == (recorded > 1)


def test_tables_name_the_gpu_not_cuda(monkeypatch):
    """A table's title calls a CUDA device by its GPU's name ('cuda' said nothing of which card a figure is from); a
    CPU is 'cpu', and a CUDA device whose name cannot be read stays 'cuda:0'."""
    from vlaperf.timing import device_label

    assert device_label("cpu") == "cpu" and device_label(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert device_label(torch.device("cuda")) == "NVIDIA H200"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: 1 / 0)
    assert device_label("cuda:0") == "cuda:0"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's answer")
def test_gpu_only_benchmark_scripts_exit_with_one_line_on_a_cpu():
    """The GPU-only scripts of benchmarks/ say so in one line on a machine without CUDA (they ended in torch's "Torch
    not compiled with CUDA enabled" traceback from deep inside), those with --device where it names CUDA (its
    default); --help still answers."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    first_call = ["benchmarks/first_call.py", "--workload", "tiny", "--compile-cache", "/nonexistent"]
    for argv in (["benchmarks/gemm_probe.py"], first_call):
        run = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=300)
        name = Path(argv[0]).name
        assert run.returncode == 1 and run.stderr.strip().splitlines() == [
            f"{name}: needs a CUDA GPU, and torch {torch.__version__} sees none (docs/profiling.md says which scripts "
            "of benchmarks/ run on a CPU)"], run.stderr
    run = subprocess.run([sys.executable, "benchmarks/gemm_probe.py", "--help"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "usage:" in run.stdout
