"""CadenceForecast: where a steady client's next request is due (vlaperf.serve.cadence)."""

import pytest

from vlaperf.serve.cadence import CADENCE_ARRIVALS, QUIET_MARGIN_S, CadenceForecast


def _fed(times, arrivals=CADENCE_ARRIVALS):
    f = CadenceForecast(arrivals)
    for t in times:
        f.observe(t)
    return f


def test_a_steady_cadence_gives_a_window_around_the_next_arrival():
    f = _fed([10.0 + 0.5 * i for i in range(CADENCE_ARRIVALS)])  # a call every 0.5 s, exactly
    start, end = f.quiet_window(run_s=0.0006)
    due = 10.0 + 0.5 * CADENCE_ARRIVALS
    assert start == pytest.approx(due - QUIET_MARGIN_S - 0.0006)  # a run that starts later would still be running
    assert end == pytest.approx(due + QUIET_MARGIN_S)


def test_jitter_widens_the_window_on_both_sides():
    times = [0.0, 0.5, 1.002, 1.5]  # gaps 0.5, 0.502, 0.498: median 0.5, the farthest 2 ms from it
    start, end = _fed(times, arrivals=4).quiet_window(run_s=0.001)
    assert start == pytest.approx(2.0 - 0.002 - QUIET_MARGIN_S - 0.001)
    assert end == pytest.approx(2.0 + 0.002 + QUIET_MARGIN_S)


def test_too_few_or_irregular_arrivals_give_no_window():
    assert _fed([0.0, 0.5]).quiet_window(0.001) is None  # one gap: nothing to compare it with
    assert CadenceForecast(4).quiet_window(0.001) is None  # nothing seen
    # several clients: gaps of 0.05, 0.4, 0.1 s; no cadence to stand aside for
    assert _fed([0.0, 0.05, 0.45, 0.55], arrivals=4).quiet_window(0.001) is None
    # steady, but a run as long as a quarter of the gap: holding the runs would leave the host cold too long
    assert _fed([0.0, 0.04, 0.08, 0.12], arrivals=4).quiet_window(0.009) is None
    assert _fed([0.0, 0.04, 0.08, 0.12], arrivals=4).quiet_window(0.005) is not None


def test_the_window_follows_the_newest_arrivals():
    f = _fed([0.0, 0.05, 0.45, 0.55], arrivals=4)  # irregular at first
    for t in (1.05, 1.55, 2.05):  # then a call every 0.5 s
        f.observe(t)
    start, end = f.quiet_window(0.0)
    assert start < 2.55 < end


def test_two_gaps_that_agree_give_a_window_before_the_deque_is_full():
    f = _fed([0.0, 0.5, 1.0])
    assert f.last_arrival == 1.0 and CadenceForecast().last_arrival == float("-inf")
    start, end = f.quiet_window(0.0)
    assert start < 1.5 < end and end - start == pytest.approx(2 * QUIET_MARGIN_S)


def test_a_change_of_pace_is_forecast_from_the_new_gaps_alone():
    """An episode's start: a closed-loop burst (a call every 16 ms), half a second's reset, then the loop's calls
    every 0.5 s. The gaps of the burst and the reset make no window with the loop's, so the newest two give it: the
    episode's third call on is forecast, where waiting for three loop gaps left its fourth unforecast too."""
    burst = [0.0, 0.016, 0.032]
    f = _fed(burst + [0.548])  # the episode's first call: the reset's gap against the burst's, no window
    assert f.quiet_window(0.001) is None
    f.observe(1.048)  # its second: the newest gaps 0.516 and 0.5 s, 16 ms apart: with a 5 ms run, wider than 20 ms
    assert f.quiet_window(0.005) is None
    f.observe(1.548)  # its third: the gaps 0.5 and 0.5 agree, the reset's 0.516 before them does not
    start, end = f.quiet_window(0.001)
    assert start == pytest.approx(2.048 - QUIET_MARGIN_S - 0.001) and end == pytest.approx(2.048 + QUIET_MARGIN_S)
    # all three gaps are used where they agree: the jitter of the oldest widens the window
    start, end = _fed([0.0, 0.503, 1.003, 1.503]).quiet_window(0.0)
    assert end - 2.003 == pytest.approx(0.003 + QUIET_MARGIN_S)


def test_the_jobs_of_one_list_request_count_as_one_arrival():
    f = _fed([0.0, 0.5, 0.5, 0.5, 1.0, 1.5], arrivals=4)  # three observations enqueued at once at 0.5 s
    start, end = f.quiet_window(0.0)
    assert start < 2.0 < end  # the gaps are 0.5 s, not 0


@pytest.mark.parametrize("bad", [2, 0, True, 4.0, "4"])
def test_the_number_of_arrivals_is_checked(bad):
    with pytest.raises(ValueError, match=r"arrivals must be an integer >= 3 \(two gaps to compare\), got"):
        CadenceForecast(bad)


def test_a_miss_says_why_a_request_met_a_run_the_window_did_not_hold_back():
    assert CadenceForecast().miss(1.0, 0.001) == "no_forecast"  # nothing seen
    assert _fed([0.0, 0.05, 0.45]).miss(0.9, 0.001) == "no_forecast"  # too irregular for a window
    f = _fed([0.0, 0.5, 1.0, 1.5])  # due at 2.0 s, expected within QUIET_MARGIN_S of it
    assert f.miss(2.0, 0.001) == "long_run"  # where expected: the run outlasted the 1 ms it was held back for
    assert f.miss(2.0 + QUIET_MARGIN_S, 0.001) == "long_run"
    assert f.miss(2.0 - 2 * QUIET_MARGIN_S, 0.001) == "off_forecast"  # early: inside the window, before the span
    assert f.miss(2.0 + 2 * QUIET_MARGIN_S, 0.001) == "off_forecast"  # late: after the window closed
