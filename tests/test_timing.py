"""CPU-only tests of vlaperf.timing: statistics, timers, interleaved A/B, environment record."""

from __future__ import annotations

import math
import os
import re
import time

import pytest
import torch

from vlaperf.report.schema import SUMMARY_KEYS
from vlaperf.timing import Timer, environment_record, interleaved, summarize, synchronize, time_calls

# ----------------------------------------------------------------------------- summarize


def test_summarize_known_values():
    s = summarize(range(1, 101))
    assert set(s) == set(SUMMARY_KEYS)
    assert s["count"] == 100
    assert s["mean"] == pytest.approx(50.5)
    assert s["median"] == pytest.approx(50.5)
    assert s["p90"] == pytest.approx(90.1)
    assert s["p95"] == pytest.approx(95.05)
    assert s["p99"] == pytest.approx(99.01)
    assert s["min"] == 1.0 and s["max"] == 100.0
    # Population std of 1..n is sqrt((n^2 - 1) / 12).
    assert s["std"] == pytest.approx(math.sqrt((100**2 - 1) / 12))


def test_summarize_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    values = [3.2, 0.5, 9.9, 4.4, 4.4, 7.1, 2.0]
    s = summarize(values)
    for key, q in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert s[key] == pytest.approx(float(np.percentile(values, q)))
    assert s["std"] == pytest.approx(float(np.std(values)))


def test_summarize_single_value_and_unsorted_input():
    s = summarize([7.0])
    assert s["count"] == 1
    assert s["mean"] == s["median"] == s["p99"] == s["min"] == s["max"] == 7.0
    assert s["std"] == 0.0
    assert summarize([3, 1, 2])["median"] == 2.0


def test_summarize_empty_raises():
    with pytest.raises(ValueError, match="need at least one value"):
        summarize([])


# ----------------------------------------------------------------------------- time_calls


def test_synchronize_cpu_is_noop():
    synchronize("cpu")
    synchronize(__import__("torch").device("cpu"))


def test_timer_cpu_has_no_event_time():
    wall_ms, event_ms = Timer("cpu")(lambda: None)
    assert wall_ms >= 0.0 and event_ms is None


def test_time_calls_schema_cpu():
    calls = []
    r = time_calls(lambda: calls.append(1), device="cpu", warmup=2, iters=5, progress=False)
    assert len(calls) == 7  # 2 warm-up (first call included) + 5 timed
    assert set(r) == {"timers", "samples", "first_call_s", "warmup_s", "warmup", "iters", "peak_memory_bytes"}
    assert r["timers"]["cuda_event_ms"] is None
    assert r["samples"]["cuda_event_ms"] is None
    assert r["timers"]["wall_ms"]["count"] == 5
    assert set(r["timers"]["wall_ms"]) == set(SUMMARY_KEYS)
    assert len(r["samples"]["wall_ms"]) == 5
    assert r["first_call_s"] > 0.0 and r["warmup_s"] >= 0.0
    assert r["warmup"] == 2 and r["iters"] == 5
    assert r["peak_memory_bytes"] is None


def test_time_calls_first_call_is_separate():
    # Mimic torch.compile: the first call is expensive, later ones are cheap.
    state = {"n": 0}

    def fn():
        state["n"] += 1
        if state["n"] == 1:
            time.sleep(0.03)

    r = time_calls(fn, device="cpu", warmup=3, iters=5, progress=False)
    assert r["first_call_s"] >= 0.03
    assert r["warmup_s"] < 0.03
    assert r["timers"]["wall_ms"]["max"] < 30.0


def test_time_calls_without_warmup_uses_first_sample():
    r = time_calls(lambda: None, device="cpu", warmup=0, iters=3, progress=False)
    assert r["first_call_s"] == pytest.approx(r["samples"]["wall_ms"][0] / 1e3)
    assert r["warmup_s"] == 0.0


def test_time_calls_sleep_duration():
    r = time_calls(lambda: time.sleep(0.005), device="cpu", warmup=1, iters=8, progress=False)
    median = r["timers"]["wall_ms"]["median"]
    # sleep never returns early; the upper bound is loose for busy CI machines.
    assert 4.9 <= median <= 30.0


@pytest.mark.parametrize(("kwargs", "name"), [({"warmup": -1}, "warmup"), ({"iters": 0}, "iters"),
                                               # True is an int to Python, not a count a user meant
                                               ({"warmup": True}, "warmup"), ({"iters": True}, "iters"),
                                               ({"iters": 2.0}, "iters")])
def test_time_calls_validation(kwargs, name):
    with pytest.raises(ValueError, match=f"time_calls: {name} must be an integer >= [01], got {kwargs[name]!r}"):
        time_calls(lambda: None, device="cpu", progress=False, **kwargs)


def test_time_calls_counts_calls_and_reports_seconds():
    """warmup=1 is the first call alone (then `iters` timed calls); iters=1 is allowed. first_call_s and
    warmup_s are seconds (samples are ms), and warmup_s adds up every warm-up call after the first."""
    calls = []
    r = time_calls(lambda: calls.append(1), device="cpu", warmup=1, iters=1, progress=False)
    assert len(calls) == 2 and r["timers"]["wall_ms"]["count"] == 1 and r["warmup_s"] == 0.0
    r = time_calls(lambda: time.sleep(0.01), device="cpu", warmup=3, iters=1, progress=False)
    assert 0.01 <= r["first_call_s"] < 1.0
    assert 0.02 <= r["warmup_s"] < 2.0  # two warm-up calls of >= 10 ms each
    assert r["samples"]["wall_ms"][0] >= 10.0


def test_time_calls_progress_bar_paths(monkeypatch):
    # Not a terminal under pytest: the bar must silently do nothing.
    r = time_calls(lambda: None, device="cpu", warmup=1, iters=3, progress=True, label="t")
    assert r["timers"]["wall_ms"]["count"] == 3
    # Forced terminal: the rich bar is actually drawn (to captured stderr) without breaking.
    pytest.importorskip("rich")
    monkeypatch.setenv("FORCE_TERMINAL", "1")
    r = time_calls(lambda: None, device="cpu", warmup=1, iters=3, progress=True, label="t")
    assert r["timers"]["wall_ms"]["count"] == 3


# ----------------------------------------------------------------------------- interleaved


def _sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def test_interleaved_speedup_and_ratio_keys():
    r = interleaved(
        {"slow": _sleeper(0.006), "fast": _sleeper(0.002)},
        device="cpu",
        warmup=1,
        iters=8,
        baseline="slow",
        progress=False,
    )
    assert set(r) == {"variants", "ratios", "baseline", "warmup", "iters"}
    assert r["baseline"] == "slow"
    for name in ("slow", "fast"):
        v = r["variants"][name]
        assert set(v) == {"timers", "samples", "first_call_s", "warmup_s", "peak_memory_bytes"}
        assert v["timers"]["wall_ms"]["count"] == 8
        assert v["timers"]["cuda_event_ms"] is None and v["samples"]["cuda_event_ms"] is None
        assert v["peak_memory_bytes"] is None
        assert v["first_call_s"] > 0.0
    fast = r["ratios"]["fast"]
    assert fast["cuda_event_ms"] is None
    assert set(fast["wall_ms"]) == {"speedup", "ratio_median", "ratio_p10", "ratio_p90", "significant"}
    assert fast["wall_ms"]["speedup"] > 1.5
    assert fast["wall_ms"]["ratio_p10"] <= fast["wall_ms"]["ratio_p90"]
    assert fast["wall_ms"]["significant"] is True
    # The baseline against itself: exactly 1.0 and never significant.
    assert r["ratios"]["slow"]["wall_ms"]["speedup"] == 1.0
    assert r["ratios"]["slow"]["wall_ms"]["significant"] is False


def test_interleaved_idle_sleeps_before_that_variants_timed_calls_only(monkeypatch):
    """idle_ms: a sleep right before each of that variant's timed calls (the rounds, not the warm-up), outside its
    timer; the other variants run back to back."""
    import vlaperf.timing as T

    events, sleep = [], T.time.sleep
    monkeypatch.setattr(T.time, "sleep", lambda s: (events.append(("sleep", s)), sleep(s)))
    fns = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    r = interleaved(fns, device="cpu", warmup=2, iters=5, progress=False, idle_ms={"b": 20})
    rounds = events[4:]  # 2 warm-up calls of each first
    assert events[:4] == ["a", "a", "b", "b"]
    assert rounds.count(("sleep", 0.02)) == 5 and len(rounds) == 15
    for i, e in enumerate(rounds):
        if e == "b":
            assert rounds[i - 1] == ("sleep", 0.02)
        if e == "a":
            assert i == 0 or rounds[i - 1] != ("sleep", 0.02)
    assert r["variants"]["b"]["timers"]["wall_ms"]["max"] < 10  # 20 ms asleep, never in the timer


def test_interleaved_settle_puts_an_untimed_call_of_its_own_before_each_timed_call():
    """settle: each timed call of a settled variant follows an untimed call of the same variant (not the round's
    previous row); only the timed ones are in its samples."""
    calls = []

    def fn(name, ms):
        def call():
            calls.append(name)
            time.sleep(ms / 1e3)
        return call

    r = interleaved({"slow": fn("slow", 4), "fast": fn("fast", 1)}, device="cpu", warmup=1, iters=4, progress=False,
                    settle=["fast"])
    expected = []  # the rotating order, the settled variant's untimed call right before its timed one
    for order in (["slow", "fast"], ["fast", "slow"]) * 2:
        for name in order:
            expected += [name, name] if name == "fast" else [name]
    assert calls[2:] == expected  # after one warm-up call of each
    assert r["variants"]["fast"]["timers"]["wall_ms"]["count"] == 4
    with pytest.raises(ValueError, match=re.escape("interleaved: settle names ['nope'], not among ['slow', 'fast']")):
        interleaved({"slow": fn("slow", 0), "fast": fn("fast", 0)}, device="cpu", warmup=1, iters=1, progress=False,
                    settle=["nope"])


def test_wait_idle_sleeps_or_spins_for_the_time_given(monkeypatch):
    import vlaperf.timing as T

    slept, sleep = [], T.time.sleep
    monkeypatch.setattr(T.time, "sleep", lambda s: (slept.append(s), sleep(s)))
    t0 = time.perf_counter()
    T.wait_idle(20, spin=True)
    assert time.perf_counter() - t0 >= 0.02 and slept == []  # busy on the clock: never asleep
    T.wait_idle(5)
    T.wait_idle(0)  # no idle: nothing at all
    assert slept == [0.005]


@pytest.mark.quiet_host  # a busy-wait paused over 5 ms by another process skips a rewarm (3 of 5 runs at load 6)
def test_wait_idle_rewarms_through_a_spun_idle_and_stops_a_period_before_its_end(monkeypatch):
    import vlaperf.timing as T

    slept, sleep = [], T.time.sleep
    monkeypatch.setattr(T.time, "sleep", lambda s: (slept.append(s), sleep(s)))
    starts = []
    t0 = time.perf_counter()
    T.wait_idle(30, rewarm=lambda: starts.append(time.perf_counter() - t0), rewarm_every_ms=5)
    end = time.perf_counter() - t0
    assert slept == [] and end >= 0.03  # a rewarmed idle spins, asleep never
    assert 4 <= len(starts) <= 6 and starts[0] < 0.002  # every 5 ms from the start
    assert all(b - a > 0.0049 for a, b in zip(starts, starts[1:])) and starts[-1] < 0.0251  # none in the last 5 ms
    with pytest.raises(ValueError, match=re.escape("interleaved: idle_rewarm names ['a'], which have no idle_ms")):
        interleaved({"a": lambda: None}, device="cpu", warmup=1, iters=1, progress=False, idle_rewarm={"a": print})


@pytest.mark.parametrize("idle,message", [({"c": 1.0}, "idle_ms names 'c', which is not one of ['a', 'b']"),
                                          ({"a": -1.0}, "idle_ms['a']: expected milliseconds >= 0, got -1.0"),
                                          ({"a": math.inf}, "expected milliseconds >= 0, got inf"),
                                          ({"a": True}, "expected milliseconds >= 0, got True")])
def test_interleaved_refuses_a_bad_idle(idle, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        interleaved({"a": lambda: None, "b": lambda: None}, device="cpu", warmup=1, iters=1, progress=False,
                    idle_ms=idle)


def test_interleaved_keeps_each_variants_own_warmup_and_a_baseline_that_is_not_first():
    """first_call_s and warmup_s belong to their own variant (a compile shows up in that variant's row only), and
    a baseline given by name is the one every ratio divides by, wherever it sits among the keys."""
    state = {"slow": 0}

    def slow():
        state["slow"] += 1
        time.sleep(0.03 if state["slow"] == 1 else 0.006)  # an expensive first call, as with torch.compile

    r = interleaved({"fast": _sleeper(0.001), "slow": slow}, device="cpu", warmup=3, iters=4, baseline="slow",
                    progress=False)
    assert r["baseline"] == "slow" and r["warmup"] == 3 and r["iters"] == 4
    v = r["variants"]
    assert v["slow"]["first_call_s"] >= 0.03 and v["fast"]["first_call_s"] < 0.03
    assert v["slow"]["warmup_s"] >= 0.012 > v["fast"]["warmup_s"]  # two warm-up calls of >= 6 ms, added up
    assert r["ratios"]["slow"]["wall_ms"]["speedup"] == 1.0
    assert r["ratios"]["fast"]["wall_ms"]["speedup"] > 1.5


def test_ratio_stats_percentiles_of_per_round_ratios():
    """ratio_p10 / ratio_median / ratio_p90 are percentiles (numpy's linear rule) of the per-round ratios, taken in
    sorted order whatever order the rounds came in; speedup is the ratio of the two medians."""
    np = pytest.importorskip("numpy")
    from vlaperf.timing import _ratio_stats

    per_round = [1.2, 0.9, 1.5, 1.1, 1.3, 1.0, 1.4, 0.8, 1.6, 1.7]  # even count: the median sits between two
    variant = [1.0, 2.0, 1.0, 3.0, 1.0, 2.0, 1.0, 2.0, 4.0, 1.0]
    baseline = [r * v for r, v in zip(per_round, variant)]
    r = _ratio_stats(baseline, variant)
    assert r["ratio_p10"] == pytest.approx(float(np.percentile(per_round, 10)))
    assert r["ratio_median"] == pytest.approx(float(np.percentile(per_round, 50)))
    assert r["ratio_p90"] == pytest.approx(float(np.percentile(per_round, 90)))
    assert r["speedup"] == pytest.approx(float(np.median(baseline) / np.median(variant)))
    assert r["significant"] is False  # p10 < 1 < p90: neither side won often enough


def test_ratio_stats_significant_either_way():
    """A variant that is always slower is as significant as one that is always faster."""
    from vlaperf.timing import _ratio_stats

    slower = _ratio_stats([1.0] * 5, [1.3, 1.2, 1.5, 1.25, 1.4])
    assert slower["speedup"] < 1.0 and slower["ratio_p90"] < 1.0 and slower["significant"] is True
    faster = _ratio_stats([1.3, 1.2, 1.5, 1.25, 1.4], [1.0] * 5)
    assert faster["ratio_p10"] > 1.0 and faster["significant"] is True
    # the rounds say faster and the medians slower (one slow round at the lower of two loads): not significant,
    # where the table read "0.69x (1.03..1.03)" as a significant result
    torn = _ratio_stats([1.0] * 10 + [3.0] * 10, [0.97] * 9 + [30.0] + [2.9] * 10)
    assert torn["ratio_p10"] > 1.0 and torn["speedup"] < 1.0 and torn["significant"] is False


def test_ratio_stats_with_zero_readings_are_inf_not_nan():
    """A 0.0 reading (below the timer's resolution, e.g. a CUDA event pair) is an infinite ratio; percentiles
    over such ratios must stay inf (inf - inf would be nan) and an exact rank next to an inf must stay finite."""
    from vlaperf.timing import _ratio_stats

    r = _ratio_stats([1.0, 2.0, 1.0], [1.0, 1.0, 0.0])  # per-round ratios 1, 2, inf
    assert r["ratio_median"] == 2.0 and r["ratio_p90"] == math.inf and r["speedup"] == 1.0
    r = _ratio_stats([1.0, 1.0, 1.0], [0.0, 0.0, 1.0])  # 1, inf, inf
    assert r["ratio_median"] == math.inf and r["ratio_p90"] == math.inf and r["significant"] is True
    assert summarize([1.0, 2.0, math.inf])["median"] == 2.0
    # two 0.0 readings are a tie, not an infinite speed-up: a variant compared with itself stays not significant
    r = _ratio_stats([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert r["speedup"] == 1.0 and r["ratio_p10"] == r["ratio_p90"] == 1.0 and r["significant"] is False


def test_speedup_is_a_ratio_of_medians_not_means():
    from vlaperf.timing import _ratio_stats

    # one outlier round (a GC pause, a clock dip) moves a mean 2.8x; the median not at all
    r = _ratio_stats([2.0, 2.0, 2.0, 2.0, 20.0], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert r["speedup"] == 2.0 and r["ratio_median"] == 2.0 and r["significant"] is True


def test_interleaved_default_baseline_is_first_key():
    r = interleaved({"fast": _sleeper(0.002), "slow": _sleeper(0.006)}, device="cpu", warmup=1, iters=6, progress=False)
    assert r["baseline"] == "fast"
    assert r["ratios"]["slow"]["wall_ms"]["speedup"] < 1 / 1.5


def test_interleaved_order_rotates():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    warmup, iters = 2, 6
    interleaved(fns, device="cpu", warmup=warmup, iters=iters, progress=False)
    # Warm-up is variant by variant, then one call per variant per round.
    assert calls[: 3 * warmup] == ["a", "a", "b", "b", "c", "c"]
    rounds = [calls[3 * warmup + 3 * i : 3 * warmup + 3 * (i + 1)] for i in range(iters)]
    assert all(sorted(rnd) == ["a", "b", "c"] for rnd in rounds)
    assert {rnd[0] for rnd in rounds} == {"a", "b", "c"}
    assert rounds[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


def test_interleaved_validation():
    with pytest.raises(ValueError, match=r"baseline 'z' is not one of \['a'\]"):  # names the choices
        interleaved({"a": lambda: None}, device="cpu", baseline="z", progress=False)
    with pytest.raises(ValueError, match="warmup"):
        interleaved({"a": lambda: None}, device="cpu", warmup=0, progress=False)
    with pytest.raises(ValueError, match="iters"):
        interleaved({"a": lambda: None}, device="cpu", iters=0, progress=False)
    with pytest.raises(ValueError, match="interleaved: need at least one function"):
        interleaved({}, device="cpu", progress=False)


# ----------------------------------------------------------------------------- environment

ENV_KEYS = {
    "gpu", "gpu_count", "driver", "cuda", "cudnn", "torch", "triton", "python", "platform", "cpu",
    "cpu_id", "cpus", "memory_bytes", "vlaperf", "git_commit", "git_dirty", "env_vars", "c_compiler", "matmul_precision",
    "tf32_matmul", "tf32_cudnn", "torch_threads", "timestamp", "hostname",
}  # fmt: skip


def test_environment_record_keys_and_env_vars(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "32768")
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    env = environment_record("cpu")
    assert ENV_KEYS <= set(env)
    assert env["gpu"] is None and env["gpu_state"] is None  # CPU device
    assert env["env_vars"]["TORCHDYNAMO_DISABLE"] == "1"
    assert env["env_vars"]["TORCHINDUCTOR_MAX_AUTOTUNE"] == "1"
    assert env["env_vars"]["CUBLASLT_WORKSPACE_SIZE"] == "32768"  # picks other GEMM kernels
    assert "TORCH_LOGS" not in env["env_vars"]
    assert env["torch"] and env["python"] and env["timestamp"].endswith("+00:00")
    assert isinstance(env["torch_threads"], int)
    assert isinstance(env["load_avg"], float) and env["load_avg"] >= 0  # the host's, as the record is taken
    assert env["git_dirty"] in (None, True, False)
    assert env["cpu_power"] is None or set(env["cpu_power"]) == {"frequency_governors", "idle_governor", "idle_states"}


def test_cpu_power_reads_governors_and_enabled_idle_states(tmp_path, monkeypatch):
    """cpu_power: the frequency governors of the CPUs this process may use, the idle governor, and the first such
    CPU's idle states that are not disabled, in state order; None where sysfs says nothing."""
    from vlaperf.timing import cpu_power

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2}, raising=False)
    for cpu, governor in ((0, "performance"), (1, "ignored"), (2, "powersave")):
        (tmp_path / f"cpu{cpu}" / "cpufreq").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "cpufreq" / "scaling_governor").write_text(governor + "\n")
    for i, (name, disabled) in enumerate([("POLL", "0"), ("C1", "0"), ("C6", "1"), ("C10", "0")] + [("C12", "0")] * 8):
        state = tmp_path / "cpu0" / "cpuidle" / f"state{i}"
        state.mkdir(parents=True)
        (state / "name").write_text(name if i < 4 else f"S{i}")
        (state / "disable").write_text(disabled)
    (tmp_path / "cpuidle").mkdir()
    (tmp_path / "cpuidle" / "current_governor_ro").write_text("menu\n")
    power = cpu_power(tmp_path)
    assert power["frequency_governors"] == ["performance", "powersave"]  # cpu1 is not this process's
    assert power["idle_governor"] == "menu"
    assert power["idle_states"] == ["POLL", "C1", "C10"] + [f"S{i}" for i in range(4, 12)]  # state10 after state9
    assert cpu_power(tmp_path / "nothing") is None


def test_the_host_is_recorded_beyond_its_model_name(monkeypatch):
    """A VM's model name can be a bare "Intel(R) Xeon(R) Processor": cpu_id names vendor, family, model and stepping
    of the first processor; cpus the CPUs this process may use (its affinity), memory_bytes the machine's memory."""
    from vlaperf.timing import cpu_id

    first = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
             "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\nflags\t\t: fpu vme\n")
    second = first.replace("processor\t: 0", "processor\t: 1").replace(": 143", ": 106")
    assert cpu_id(first + "\n" + second) == "GenuineIntel family 6 model 143 stepping 8"
    assert cpu_id(first.replace("stepping\t: 8\n", "")) == "GenuineIntel family 6 model 143"
    assert cpu_id("processor\t: 0\nmodel name\t: some ARM core\n") is None  # no vendor/family/model fields
    assert cpu_id("") is None
    env = environment_record("cpu")
    if hasattr(os, "sched_getaffinity"):
        assert env["cpus"] == len(os.sched_getaffinity(0))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # `taskset -c 0`, a one-CPU container
        assert environment_record("cpu")["cpus"] == 1
    assert env["memory_bytes"] is None or env["memory_bytes"] > 2**28
    if os.path.exists("/proc/cpuinfo"):
        assert re.fullmatch(r"\S+ family \d+ model \d+( stepping \d+)?", env["cpu_id"] or "x86 family 0 model 0")


def test_gpu_state_parses_nvidia_smi_and_selects_the_gpu_by_uuid(monkeypatch, tmp_path):
    """The GPU's clocks, power and temperature come from nvidia-smi for the torch device's own
    GPU (by UUID: nvidia-smi numbers GPUs its own way), numbers as numbers, N/A as None."""
    import vlaperf.timing as T
    from vlaperf.gpu_state import clock_event_names, describe_gpu_state, parse_gpu_state

    line = "GPU-5a1d, P0, 1980, 1980, 3201, 312.45, 700.00, 41, 0x0000000000000000"
    assert parse_gpu_state(line) == {
        "uuid": "GPU-5a1d", "pstate": "P0", "sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "mem_clock_mhz": 3201,
        "power_draw_w": 312.45, "power_limit_w": 700.0, "temperature_c": 41, "clock_event_reasons": "0x0000000000000000"}
    assert parse_gpu_state(line.replace("312.45", "[N/A]"))["power_draw_w"] is None
    assert type(parse_gpu_state(line)["sm_clock_mhz"]) is int  # a clock is written 1980, not 1980.0
    assert parse_gpu_state(line.replace("0x0000000000000000", "[N/A]"))["clock_event_reasons"] is None
    assert describe_gpu_state(parse_gpu_state(line)) == "SM 1980/1980 MHz, 312/700 W, 41 C"
    assert describe_gpu_state(parse_gpu_state(line.replace("0x0000000000000000", "0x24"))) == \
        "SM 1980/1980 MHz, 312/700 W, 41 C, held by software power cap + software thermal slowdown"
    assert clock_event_names("0x0000000000000005") == ["software power cap"]  # idle is not a hold
    assert clock_event_names("0x60") == ["software thermal slowdown", "hardware thermal slowdown"]
    assert clock_event_names("garbage") == [] and describe_gpu_state(None) == "-"
    with pytest.raises(ValueError, match="9 fields"):
        parse_gpu_state("GPU-5a1d, P0")
    # a fake nvidia-smi that logs its arguments
    log = tmp_path / "args.txt"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"$@\" > {log}\necho '{line}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"uuid": "5A1D"})())
    state = T._gpu_state(torch.device("cuda", 0))
    assert state["sm_clock_mhz"] == 1980 and state["clock_event_reasons"] == "0x0000000000000000"
    args = log.read_text()
    assert "--id=GPU-5a1d" in args and "clocks.sm" in args and "enforced.power.limit" in args


def test_environment_record_no_compiler_on_empty_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CC", "CXX"):  # an absolute $CXX (the GPU machine sets /opt/gcc/bin/g++) is found without PATH
        monkeypatch.delenv(var, raising=False)
    env = environment_record("cpu")
    assert env["c_compiler"] is None
    assert env["driver"] is None  # no nvidia-smi either, and no exception


def test_git_commit_given_by_the_caller_wins(monkeypatch):
    """A tree copied to a GPU machine may hold a .git at another HEAD: VLAPERF_GIT_COMMIT wins."""
    from vlaperf.timing import _git_state

    monkeypatch.setenv("VLAPERF_GIT_COMMIT", "0123abcd")
    assert _git_state() == ("0123abcd", None)
    monkeypatch.delenv("VLAPERF_GIT_COMMIT")
    commit, _ = _git_state()
    assert commit != "0123abcd"


def test_engine_ab_interleaves_and_takes_the_median_of_per_round_ratios():
    """benchmarks/engine_ab.py (heads_ab.py, step_config_ab.py): one call of each side per round,
    in order; the speedup is the median of old/new per round, the file carries the schema."""
    import os
    import sys
    import types

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import engine_ab

    from vlaperf.report.schema import SCHEMA

    calls = []
    samples = engine_ab.interleave({"old": lambda: calls.append("old"), "new": lambda: calls.append("new")}, rounds=3,
                                   warmup=2)
    assert calls == ["old", "old", "new", "new"] + ["old", "new"] * 3
    assert {k: len(v) for k, v in samples.items()} == {"old": 3, "new": 3} and all(t >= 0 for t in samples["old"])
    fixed = {"old": [2.0, 3.0, 4.0, 9.0], "new": [1.0, 1.0, 2.0, 3.0]}  # ratios 2, 3, 2, 3
    engine = types.SimpleNamespace(levers=types.SimpleNamespace(names=lambda: ["for_loop"]), name="for_loop")
    r = engine_ab.ab_result("step-config-ab", types.SimpleNamespace(id="tiny"), types.SimpleNamespace(dtype="torch.float32"),
                            engine, fixed, "old", "new")
    assert r["schema"] == SCHEMA and r["command"] == "step-config-ab" and r["rounds"] == 4
    assert r["median_ms"] == {"old": 3.5, "new": 1.5} and r["speedup_median"] == 2.5
    assert r["speedup_p10_p90"][0] <= 2.0 and r["speedup_p10_p90"][1] >= 3.0


def test_env_record_leaves_out_the_inductor_cache_dir_torch_set_itself(monkeypatch):
    """torch sets TORCHINDUCTOR_CACHE_DIR to its default when inductor first looks for its cache; the record
    keeps it only where the process started with it or it points elsewhere (`--compile-cache`)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from vlaperf import timing

    monkeypatch.setattr(timing, "_ENV_AT_IMPORT", frozenset())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert "TORCHINDUCTOR_CACHE_DIR" not in timing.behaviour_env_vars()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    assert timing.behaviour_env_vars()["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"
    monkeypatch.setattr(timing, "_ENV_AT_IMPORT", frozenset({"TORCHINDUCTOR_CACHE_DIR"}))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert timing.behaviour_env_vars()["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_timing_on_cuda_without_cuda_is_a_named_error():
    """time_calls(device="cuda") on a CPU-only torch failed with "Tried to instantiate dummy base class Event"."""
    with pytest.raises(ValueError, match="device: cuda requested, but CUDA is not available here"):
        time_calls(lambda: None, device="cuda", warmup=0, iters=1)


@pytest.mark.parametrize(("warmup", "more"), [(0, 0), (1, 0), (3, 2)])
def test_time_calls_counts_a_first_call_made_by_the_caller(warmup, more):
    """bench makes and times the first call itself, before its equivalence check: that call is the first of `warmup`,
    so time_calls makes warmup - 1 more (bench made `warmup` more, one untimed call beyond what the file said, whose
    time landed in neither first_call_s nor warmup_s)."""
    calls = []
    r = time_calls(lambda: calls.append(1), device="cpu", warmup=warmup, iters=4, progress=False, first_call_s=2.5)
    assert len(calls) == more + 4
    assert r["first_call_s"] == 2.5 and r["warmup"] == max(warmup, 1) and len(r["samples"]["wall_ms"]) == 4
    assert (r["warmup_s"] > 0.0) == (more > 0)


def test_the_recorded_compiler_is_the_one_inductor_runs_on_the_device(monkeypatch, tmp_path):
    """env.c_compiler: the compiler inductor would run where the record was taken (Triton's C compiler on a GPU, a
    C++ compiler on the CPU), not the first of cc/gcc/clang on PATH: a machine with gcc alone recorded gcc while
    inductor on its CPU could not build anything."""
    from vlaperf.timing import _c_compiler

    for name in ("gcc", "g++", "cc"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    assert _c_compiler("cuda") == str(tmp_path / "gcc") and _c_compiler("cpu") == str(tmp_path / "g++")
    (tmp_path / "g++").unlink()
    assert _c_compiler("cpu") is None
    monkeypatch.setenv("CXX", "cc")
    monkeypatch.setenv("CC", "no-such-cc")  # Triton uses $CC as given, with no fallback
    assert _c_compiler("cpu") == str(tmp_path / "cc") and _c_compiler("cuda") is None
