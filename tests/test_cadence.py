"""CadenceForecast: where a steady client's next request is due (vlaperf.serve.cadence)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vlaperf.serve.cadence import (CADENCE_ARRIVALS, CALLS_KEPT, ONE_GAP_JITTER_S, PACES_KEPT, QUIET_MARGIN_S,
                                   QUIET_MAX_FRACTION, QUIET_MAX_S, CadenceForecast)


def _fed(times, arrivals=CADENCE_ARRIVALS):
    f = CadenceForecast(arrivals)
    for t in times:
        f.observe(t)
    return f


def test_a_steady_cadence_gives_a_window_around_the_next_arrival():
    f = _fed([10.0 + 0.5 * i for i in range(CADENCE_ARRIVALS)])  # a call every 0.5 s, exactly
    [(start, end)] = f.quiet_windows(run_s=0.0006)
    due = 10.0 + 0.5 * CADENCE_ARRIVALS
    assert start == pytest.approx(due - QUIET_MARGIN_S - 0.0006)  # a run that starts later would still be running
    assert end == pytest.approx(due + QUIET_MARGIN_S)


def test_jitter_widens_the_window_on_both_sides():
    times = [0.0, 0.5, 1.002, 1.5]  # gaps 0.5, 0.502, 0.498: median 0.5, the farthest 2 ms from it
    [(start, end)] = _fed(times, arrivals=4).quiet_windows(run_s=0.001)
    assert start == pytest.approx(2.0 - 0.002 - QUIET_MARGIN_S - 0.001)
    assert end == pytest.approx(2.0 + 0.002 + QUIET_MARGIN_S)


def test_too_few_arrivals_or_too_long_a_run_give_no_window():
    assert CadenceForecast(4).quiet_windows(0.001) == []  # nothing seen
    assert _fed([0.0]).quiet_windows(0.001) == []  # one arrival: no gap
    # steady, but a run as long as a quarter of the gap: holding the runs would leave the host cold too long
    assert _fed([0.0, 0.04, 0.08, 0.12], arrivals=4).quiet_windows(0.009) == []
    assert len(_fed([0.0, 0.04, 0.08, 0.12], arrivals=4).quiet_windows(0.005)) == 1


def test_a_stream_that_kept_no_pace_has_its_newest_gap_forecast_to_repeat():
    """A robot's connection: its first request (a warm-up), then its loop's calls every 0.5 s. Two arrivals make one
    gap, and it is taken to repeat; at the third, the gaps (the warm-up's, the loop's) disagree, and the newest is
    the loop's. Several clients' arrivals together (gaps of 0.05, 0.4, 0.1 s) keep no pace: only the newest gap's
    narrow window, wrong at worst by the few ms it holds the runs. One gap says nothing of the loop's jitter, so
    its window allows ONE_GAP_JITTER_S each side."""
    side = QUIET_MARGIN_S + ONE_GAP_JITTER_S
    [(start, end)] = _fed([0.0, 0.5]).quiet_windows(0.001)
    assert start == pytest.approx(1.0 - side - 0.001) and end == pytest.approx(1.0 + side)
    f = _fed([0.0, 0.03, 0.53])  # the warm-up, then the loop
    assert f.paces == []
    [(start, end)] = f.quiet_windows(0.001)
    assert start < 1.03 < end and end - start == pytest.approx(0.001 + 2 * side)
    [(start, end)] = _fed([0.0, 0.05, 0.45, 0.55], arrivals=4).quiet_windows(0.001)
    assert start < 0.65 < end and end - start == pytest.approx(0.001 + 2 * side)
    # a pace's own jitter, where it has one, is what its window allows: two agreeing gaps, no more than the margin
    [(start, end)] = _fed([0.0, 0.5, 1.0]).quiet_windows(0.0)
    assert end - start == pytest.approx(2 * QUIET_MARGIN_S)


def test_the_window_follows_the_newest_arrivals():
    f = _fed([0.0, 0.05, 0.45, 0.55], arrivals=4)  # irregular at first
    for t in (1.05, 1.55, 2.05):  # then a call every 0.5 s
        f.observe(t)
    [(start, end)] = f.quiet_windows(0.0)
    assert start < 2.55 < end


def test_the_jitter_of_the_older_gaps_that_agree_still_widens_the_window():
    """A loop whose gaps stray by 3 ms once in a while: the stray gap six calls back still tells the window how far
    the next arrival may stray, where the newest three alone (0.5 s each) would allow only the margin."""
    times = [0.0, 0.503] + [0.503 + 0.5 * k for k in range(1, CADENCE_ARRIVALS - 1)]
    assert len(times) == CADENCE_ARRIVALS >= 8
    [(start, end)] = _fed(times).quiet_windows(0.0)
    due = times[-1] + 0.5
    assert start == pytest.approx(due - 0.003 - QUIET_MARGIN_S) and end == pytest.approx(due + 0.003 + QUIET_MARGIN_S)
    [(start, end)] = _fed(times, arrivals=4).quiet_windows(0.0)
    assert end - start == pytest.approx(2 * QUIET_MARGIN_S)


def test_two_gaps_that_agree_give_a_window_before_the_deque_is_full():
    f = _fed([0.0, 0.5, 1.0])
    assert f.last_arrival == 1.0 and CadenceForecast().last_arrival == float("-inf")
    [(start, end)] = f.quiet_windows(0.0)
    assert start < 1.5 < end and end - start == pytest.approx(2 * QUIET_MARGIN_S)


def test_a_change_of_pace_is_forecast_from_the_new_gaps_alone():
    """An episode's start on a stream that kept only a closed-loop burst's pace (a call every 16 ms): half a
    second's reset, then the loop's calls every 0.5 s. The gaps of the burst and the reset make no window with the
    loop's, so the newest two give it: the episode's third call on is forecast, where waiting for three loop gaps
    left its fourth unforecast too."""
    burst = [0.0, 0.016, 0.032]
    f = _fed(burst + [0.548])  # the episode's first call: the reset's gap against the burst's: the burst's pace only
    assert f.paces == [pytest.approx(0.016)]
    assert [s < 0.564 < e for s, e in f.quiet_windows(0.001)] == [True]
    f.observe(1.048)  # its second: the newest gaps 0.516 and 0.5 s, 16 ms apart: with a 5 ms run, wider than 20 ms
    assert f.paces == [pytest.approx(0.508), pytest.approx(0.016)]  # kept (for no run), and so remembered
    assert f.quiet_windows(0.005) == []  # too wide for a 5 ms run, as is the burst's 16 ms
    f.observe(1.548)  # its third: the gaps 0.5 and 0.5 agree, the reset's 0.516 before them does not
    [(start, end)] = f.quiet_windows(0.001)
    assert start == pytest.approx(2.048 - QUIET_MARGIN_S - 0.001) and end == pytest.approx(2.048 + QUIET_MARGIN_S)
    assert f.paces == [pytest.approx(0.5), pytest.approx(0.016)]
    # all the gaps are used where they agree: the jitter of the oldest widens the window
    [(start, end)] = _fed([0.0, 0.503, 1.003, 1.503]).quiet_windows(0.0)
    assert end - 2.003 == pytest.approx(0.003 + QUIET_MARGIN_S)


def test_a_loop_that_resumes_after_a_burst_and_a_reset_is_forecast_at_its_old_pace():
    """Session 55 (H100, two robots): with quiet, the requests that still met a run were an episode's first calls.
    Episode 1 of a rollout: the loop every 0.5 s, a closed-loop burst every 16 ms, half a second's reset, then the
    loop again. At its first call the newest gaps (the burst's, the reset's 0.516 s) keep no pace, and both paces
    the stream kept give a window: the second call, 0.5 s on, is in the loop's."""
    loop = [0.5 * i for i in range(6)]  # ... 2.5
    burst = [3.0 + 0.016 * i for i in range(5)]  # 3.0 ... 3.064
    f = _fed(loop + burst + [3.58])  # the episode's first call
    assert f.paces == [pytest.approx(0.016), pytest.approx(0.5)]
    windows = f.quiet_windows(0.001)
    assert [s < 3.58 + 0.016 < e for s, e in windows] == [True, False]
    assert [s < 4.08 < e for s, e in windows] == [False, True]  # the second call, at the loop's pace
    assert f.miss(4.08, 0.001) == "long_run" and f.miss(4.09, 0.001) == "off_forecast"
    f.observe(4.08)  # newest gaps 0.516 and 0.5: with a 1 ms run, a window of their own (16 ms wide)
    [(start, end)] = f.quiet_windows(0.001)
    assert start < 4.58 < end and end - start == pytest.approx(0.016 + 0.001 + 2 * QUIET_MARGIN_S)
    # one pace remembered per gap: the loop's refreshed in place; past PACES_KEPT the oldest goes
    f = _fed(loop)
    assert f.paces == [pytest.approx(0.5)]
    t = loop[-1]
    for gap in (0.1, 0.2, 0.3, 0.4):
        for _ in range(3):
            t += gap
            f.observe(t)
    assert len(f.paces) == PACES_KEPT == 3 and f.paces == [pytest.approx(g) for g in (0.4, 0.3, 0.2)]


def test_the_jobs_of_one_list_request_count_as_one_arrival():
    f = _fed([0.0, 0.5, 0.5, 0.5, 1.0, 1.5], arrivals=4)  # three observations enqueued at once at 0.5 s
    [(start, end)] = f.quiet_windows(0.0)
    assert start < 2.0 < end  # the gaps are 0.5 s, not 0


@pytest.mark.parametrize("bad", [2, 0, True, 4.0, "4"])
def test_the_number_of_arrivals_is_checked(bad):
    with pytest.raises(ValueError, match=r"arrivals must be an integer >= 3 \(two gaps to compare\), got"):
        CadenceForecast(bad)


def test_a_miss_says_why_a_request_met_a_run_the_window_did_not_hold_back():
    assert CadenceForecast().miss(1.0, 0.001) == "no_forecast"  # nothing seen
    assert _fed([0.0]).miss(0.9, 0.001) == "no_forecast"  # one arrival: no gap to forecast from
    assert _fed([0.0, 0.04, 0.08]).miss(0.12, 0.012) == "no_forecast"  # the run too long for a window
    f = _fed([0.0, 0.5, 1.0, 1.5])  # due at 2.0 s, expected within QUIET_MARGIN_S of it
    assert f.miss(2.0, 0.001) == "long_run"  # where expected: the run outlasted the 1 ms it was held back for
    assert f.miss(2.0 + QUIET_MARGIN_S, 0.001) == "long_run"
    assert f.miss(2.0 - 2 * QUIET_MARGIN_S, 0.001) == "off_forecast"  # early: inside the window, before the span
    assert f.miss(2.0 + 2 * QUIET_MARGIN_S, 0.001) == "off_forecast"  # late: after the window closed


def _looped(calls_s, gap_s=0.1, period_s=0.02):
    """A loop that sleeps out its period after each step (a call every gap_s), fed with the replies: each call takes
    calls_s[k]; one that overruns period_s makes every later arrival that much late. The forecast, and the next
    arrival's time."""
    f, t = CadenceForecast(), 0.0
    for took in calls_s:
        f.observe(t)
        f.replied(t, t + took)
        t += gap_s + max(0.0, took - period_s)
    return f, t


def test_a_call_that_ran_long_keeps_the_window_open_that_much_longer():
    """At 50 Hz (a call every 0.1 s, steps of 20 ms), calls of 16 ms: the window is the cadence's. A call of 21 ms
    overran its step by 1 ms, and the loop's next request comes 1 ms late, past the cadence's window: the window
    stays open 5 ms longer (21 ms against the usual 16), and the late request is expected."""
    usual, start_usual = _looped([0.016] * 5)
    [(start, end)] = usual.quiet_windows(0.001)
    assert start < usual.last_arrival + 0.1 < end and end == pytest.approx(usual.last_arrival + 0.1 + QUIET_MARGIN_S)
    f, due = _looped([0.016] * 4 + [0.021])
    [(start_long, end_long)] = f.quiet_windows(0.001)
    assert start_long == pytest.approx(start) and end_long == pytest.approx(end + 0.005)
    assert due == pytest.approx(f.last_arrival + 0.101) and start_long + 0.001 < due < end_long
    assert f.miss(due, 0.001) == "long_run"  # expected there
    f.observe(due)  # the late request arrived: its own reply decides again
    assert f.quiet_windows(0.001)[0][1] < due + 0.1 + 0.002
    # a call no longer than the usual, or the reply to an older request than the newest, keeps the windows as they are
    g, _ = _looped([0.016] * 4 + [0.015])
    assert g.quiet_windows(0.001) == usual.quiet_windows(0.001)
    g.replied(g.last_arrival - 0.1, g.last_arrival + 0.03)
    assert g.quiet_windows(0.001) == usual.quiet_windows(0.001)


def test_a_long_call_widens_the_window_at_most_to_the_widest_one_allowed():
    """A call 50 ms over the usual (a slow first call of a shape, a stall): the window stays open only as far as the
    widest window from the gaps (QUIET_MAX_S here, under a quarter of the gap), and a reply before its request is
    ignored."""
    f, _ = _looped([0.016] * 4 + [0.066])
    [(start, end)] = f.quiet_windows(0.001)
    assert end - start == pytest.approx(min(QUIET_MAX_S, QUIET_MAX_FRACTION * 0.1))
    g = CadenceForecast()
    g.observe(1.0)
    g.replied(1.0, 0.9)  # a reply "before" its request: another clock's time, nothing learnt
    assert len(g._calls) == 0 and len(_looped([0.016] * (CALLS_KEPT + 3))[0]._calls) == CALLS_KEPT


REPLAY = Path(__file__).resolve().parents[1] / "benchmarks" / "cadence_replay.py"


RULES = ("late_replies", "kept_paces")


def _replay_script():
    spec = importlib.util.spec_from_file_location("cadence_replay", REPLAY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_replayed_rollout_leaves_only_the_calls_no_forecast_can_place():
    """benchmarks/cadence_replay.py, without jitter: each episode's first call (after the warm-up or the burst and the
    idle) and the first episode's second (one gap, the warm-up's) are all the kept paces leave unexpected. Session
    54's rule, the newest gaps only, leaves episode 0's third call and episode 1's second too."""
    replay = _replay_script()
    late, kept, newest = (replay.replay(rule, seeds=3, run_s=0.001, jitter_s=0.0) for rule in replay.RULES)
    assert late["calls_at_cadence"] == kept["calls_at_cadence"] == newest["calls_at_cadence"] == 3 * 2 * 15
    assert late["unexpected_by_call"] == kept["unexpected_by_call"] == {"e0c0": 3, "e0c1": 3, "e1c0": 3}
    assert newest["unexpected_by_call"] == {"e0c0": 3, "e0c1": 3, "e0c2": 3, "e1c0": 3, "e1c1": 3}
    with pytest.raises(ValueError, match="rule: expected one of late_replies, kept_paces, newest_gaps, got 'other'"):
        replay.windows(CadenceForecast(), "other", 0.001)


def test_the_replayed_loop_with_overruns_expects_the_late_calls_only_with_the_replies():
    """At 60 Hz (steps of 16.7 ms) with calls of 15.8 ms and a tail (mean 0.9 ms), over a third of the calls overrun
    their step; told the replies, the forecast expects the late calls after them, and without them it misses
    almost a tenth of all calls (50 of 540). (What the replies leave: a call on time after several late ones comes
    before a window made from late gaps; one of 540 here.) Without a tail no call overruns, and the replies change
    nothing."""
    replay = _replay_script()
    pattern = {"gap_s": 5 / 60, "period_s": 1 / 60, "calls": 90, "call_s": 0.0158, "jitter_s": 0.0}
    late, kept = (replay.replay(rule, seeds=3, run_s=0.001, tail_s=0.0009, **pattern) for rule in RULES)
    unplaceable = {"e0c0": 3, "e0c1": 3, "e1c0": 3}
    assert all(late["unexpected_by_call"].get(call) == n for call, n in unplaceable.items())
    assert late["unexpected"] <= sum(unplaceable.values()) + 3
    assert kept["unexpected"] > 3 * 2 * 90 * 0.05
    steady = [replay.replay(rule, seeds=3, run_s=0.001, tail_s=0.0, **pattern) for rule in RULES[:2]]
    assert steady[0]["unexpected_by_call"] == steady[1]["unexpected_by_call"] == unplaceable


def test_the_replay_script_runs_and_refuses_a_negative_jitter(tmp_path):
    out = tmp_path / "replay.json"
    run = subprocess.run([sys.executable, str(REPLAY), "--seeds", "2", "--json", str(out)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    rules = json.loads(out.read_text())["rules"]
    assert [r["rule"] for r in rules] == ["late_replies", "kept_paces", "newest_gaps"]
    assert rules[1]["unexpected"] < rules[2]["unexpected"] and "kept_paces   unexpected" in run.stdout
    bad = subprocess.run([sys.executable, str(REPLAY), "--jitter-ms", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--jitter-ms: expected a length >= 0 ms, got -1.0" in bad.stderr
