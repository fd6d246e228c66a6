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
    assert _fed([0.5 * i for i in range(CADENCE_ARRIVALS - 1)]).quiet_window(0.001) is None  # one short
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


def test_the_jobs_of_one_list_request_count_as_one_arrival():
    f = _fed([0.0, 0.5, 0.5, 0.5, 1.0, 1.5], arrivals=4)  # three observations enqueued at once at 0.5 s
    start, end = f.quiet_window(0.0)
    assert start < 2.0 < end  # the gaps are 0.5 s, not 0


@pytest.mark.parametrize("bad", [2, 0, True, 4.0, "4"])
def test_the_number_of_arrivals_is_checked(bad):
    with pytest.raises(ValueError, match=r"arrivals must be an integer >= 3 \(two gaps to compare\), got"):
        CadenceForecast(bad)
