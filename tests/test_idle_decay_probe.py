"""benchmarks/idle_decay_probe.py: the call after an idle of each length, asleep, spinning and rewarming, against
itself back to back. A stand-in call whose cost grows with the time since its own last run (the state it leaves
decaying) must read costlier after a long idle than a short one, asleep or spinning alike, and not when rewarmed."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "idle_decay_probe.py"


def _probe():
    spec = importlib.util.spec_from_file_location("idle_decay_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DecayingCall:
    """Sleeps 0.1 ms per ms since its previous run (at most 3 ms): warm state that decays with wall-clock time."""

    def __init__(self):
        self.last = time.perf_counter()
        self.last_cpu = time.process_time()
        self.starts: list[float] = []
        self.idles: list[tuple[float, float]] = []  # (wall s, this process's CPU s) between a call and the next

    def __call__(self):
        now, cpu = time.perf_counter(), time.process_time()
        self.starts.append(now)
        self.idles.append((now - self.last, cpu - self.last_cpu))
        time.sleep(min(now - self.last, 0.030) * 0.1)
        self.last, self.last_cpu = time.perf_counter(), time.process_time()


def test_gaps_are_parsed_and_bad_ones_refused_with_the_expected_form():
    probe = _probe()
    assert probe.gaps_arg("0.2, 2,50") == [0.2, 2.0, 50.0]
    for bad in ("", "0", "-1,2", "fast", "20000"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            probe.gaps_arg(bad)


def test_a_call_whose_state_decays_costs_more_after_a_long_idle_asleep_or_spinning_but_not_rewarmed():
    probe = _probe()
    cpu = torch.device("cpu")
    rows = {(r["way"], r["idle_ms"]): r for r in probe.decay(DecayingCall(), cpu, [1.0, 25.0], rounds=5, warmup=1,
                                                             rewarm_every_ms=2.0)}
    assert set(rows) == {(way, gap) for way in probe.WAYS for gap in (1.0, 25.0)}
    ratio = {k: r["wall_ms"]["after_idle_over_back_to_back"] for k, r in rows.items()}
    # back to back the call sleeps ~0.1x its own length; after 25 ms about 2.5 ms more
    assert ratio[("asleep", 25.0)] > 1.5 and ratio[("spinning", 25.0)] > 1.5
    assert ratio[("asleep", 25.0)] > ratio[("asleep", 1.0)] and ratio[("spinning", 25.0)] > ratio[("spinning", 1.0)]
    assert ratio[("rewarming", 25.0)] < 0.5 * ratio[("spinning", 25.0)] + 0.5  # far below spinning's
    for r in rows.values():
        w = r["wall_ms"]
        assert r["extra_ms"] == pytest.approx(w["after_idle_median"] - w["back_to_back_median"])
        assert w["per_round_p10"] <= w["per_round_p90"] and r["iters"] == 5


@pytest.mark.quiet_host  # reruns and CPU time within ms-long idles: another process's load moves them
def test_the_host_ways_rerun_their_own_part_alone_through_the_idle():
    probe = _probe()
    call, starts = DecayingCall(), {way: [] for way in probe.HOST_WAYS}
    parts = {way: (lambda way=way: starts[way].append(time.perf_counter())) for way in probe.HOST_WAYS}
    rows = probe.decay(call, torch.device("cpu"), [20.0], rounds=3, warmup=1, rewarm_every_ms=2.0, host_parts=parts)
    assert [r["way"] for r in rows] == ["asleep", "spinning", "rewarming", "rewarming_host", "rewarming_transform",
                                        "rewarming_upload"]
    for way in probe.HOST_WAYS:
        # three rounds, two or more reruns in each 20 ms idle: every 2 ms gives ~10 on an idle host, and 11 in all
        # came on a 2-core machine with other work on it (session 57), so the bound asks only that they rerun
        assert len(starts[way]) >= 3 * 2, way
    # the call itself did not rerun through the host ways' idles: after them it pays the whole 20 ms decay, a sleep of
    # 2 ms or more (a late wake-up only lengthens the idle), where a rerun every 2 ms would leave 0.2-0.4 ms. Judged in
    # ms, not as a ratio to the call back to back: that ~0.1 ms sleep moves 2x with the host, and against rewarming's
    # ratio the bound failed in a full CPU run of session 63 (one stolen stretch left rewarming's 3 rounds at 27x)
    for r in rows[3:]:
        assert r["wall_ms"]["after_idle_median"] > 1.5, (r["way"], r["wall_ms"])
    # --ways picks: only those run, in the order given; a host way without host parts is skipped
    rows = probe.decay(call, torch.device("cpu"), [1.0], rounds=3, warmup=1, rewarm_every_ms=2.0,
                       ways=["rewarming_upload", "asleep"], host_parts=parts)
    assert [r["way"] for r in rows] == ["rewarming_upload", "asleep"]
    assert [r["way"] for r in probe.decay(call, torch.device("cpu"), [1.0], rounds=3, warmup=1, rewarm_every_ms=2.0,
                                          ways=["rewarming_host", "spinning"])] == ["spinning"]


@pytest.mark.quiet_host  # reruns and CPU time within ms-long idles: another process's load moves them
def test_spinning_keeps_the_core_busy_through_the_idle_and_asleep_does_not():
    probe = _probe()
    call = DecayingCall()
    probe.decay(call, torch.device("cpu"), [30.0], rounds=4, warmup=1, rewarm_every_ms=50.0)  # no rewarm call fits
    long_idles = [(wall, cpu) for wall, cpu in call.idles if 0.029 < wall < 0.060]  # the 30 ms idles
    busy = [cpu / wall for wall, cpu in long_idles if cpu > 0.5 * wall]
    asleep = [cpu / wall for wall, cpu in long_idles if cpu < 0.2 * wall]
    # spinning and rewarming spin (4 rounds each), asleep sleeps (4); one of each may lose its core to another process
    assert len(busy) >= 7 and len(asleep) >= 3, long_idles


@pytest.mark.quiet_host  # reruns and CPU time within ms-long idles: another process's load moves them
def test_rewarming_calls_through_the_idle_and_none_starts_within_a_period_of_its_end():
    probe = _probe()
    call = DecayingCall()
    probe.rewarmed_pair(call, torch.device("cpu"), gap_ms=20.0, every_ms=4.0, rounds=2, warmup=1)
    # warm-up 1, then per round one back-to-back call, the rewarm calls, the timed call after the idle
    starts = call.starts[1:]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) >= 2 * 2 + 2 * 3  # at least three rewarm calls in each 20 ms idle
    # the timed call follows its last rewarm call by more than the period (the idle's end lies beyond it)
    assert max(gaps) > 0.004


def test_the_probe_runs_on_the_cpu_and_writes_a_valid_file(tmp_path):
    from vlaperf.report.schema import read_result

    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--workload", "tiny", "--device", "cpu", "--levers", "exact",
                           "--targets", "policy,small_torch_ops", "--gaps", "1", "--rounds", "3", "--warmup", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    r = read_result(out)
    assert r["command"] == "idle-decay-probe" and r["gaps_ms"] == [1.0] and r["rewarm_every_ms"] == 5.0
    assert set(r["targets"]) == {"policy", "small_torch_ops"}
    ways = {name: [(row["way"], row["idle_ms"]) for row in rows] for name, rows in r["targets"].items()}
    assert ways["small_torch_ops"] == [("asleep", 1.0), ("spinning", 1.0), ("rewarming", 1.0)]
    # only the policy has host stages
    assert ways["policy"] == ways["small_torch_ops"] + [(w, 1.0) for w in ("rewarming_host", "rewarming_transform",
                                                                           "rewarming_upload")]
    assert r["ways"] == ["asleep", "spinning", "rewarming", "rewarming_host", "rewarming_transform", "rewarming_upload"]
    for rows in r["targets"].values():
        assert all(row["wall_ms"]["back_to_back_median"] > 0 and row["cuda_event_ms"] is None for row in rows)

    bad = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--workload", "tiny", "--targets", "gpu"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--targets: expected some of policy, model, small_torch_ops" in bad.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--workload", "tiny", "--ways", "asleep,nap"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--ways: expected some of asleep, spinning, rewarming" in bad.stderr
