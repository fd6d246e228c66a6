"""When a steady client's next request is due, so that the server's keep-warm runs can stand aside for it.

A robot's control loop calls the policy at a steady rate (a chunk replanned every 5 steps at 10 Hz: a call every
0.5 s). `serve --keep-warm-ms` reruns the host stages through the idle between calls, and a request that arrives
during a run waits for it: on an H100, 10-14 of a 10 Hz rollout's ~60 calls at cadence did, and the queue's p95 went
from ~0.2 to 0.3-0.6 ms (session 52's part kc). The arrivals of such a loop are regular enough to forecast: from the
last few gaps, the next arrival and how far it may stray. `CadenceForecast.quiet_windows` are the spans in which a
run would meet that arrival; the server holds its runs there, forecasting each connection's arrivals on its own (and
all of them together, for a client that reconnects for each call). Where the newest gaps keep no cadence (a loop that
paused for a reset or ran a closed-loop burst), the paces the stream kept before are forecast from its last arrival:
a loop resumes at its own pace. The server tells the forecast when each reply goes out (`replied`): a call that took
longer than the usual may have overrun the loop's step, and the next request may come that much late.
"""

from __future__ import annotations

import statistics
from collections import deque

# arrivals a forecast is made from: up to seven gaps (at 2 calls a second, 3.5 s of a loop), of which the newest two
# at least must agree; the more of them agree, the better their spread tells the loop's jitter. Three gaps (session
# 53-56's four arrivals) let 4, 0 and 4 of 150 calls at 50 Hz wait for a run on an H100, all off their forecast
# (session 56); benchmarks/cadence_replay.py at 50 Hz with a 0.2 ms jitter leaves 161 of 7500 calls unexpected
# with three gaps and 39 with seven, for 0.2 ms more held a call
CADENCE_ARRIVALS = 8
# added to each side of the window: the inference thread's wake-up from its condition wait, and the clocks of
# two threads, are late by a few hundred microseconds at worst on a busy host
QUIET_MARGIN_S = 0.0005
# the window may take at most this much of the gap (and never over QUIET_MAX_S): a loop whose arrivals stray
# further is not steady, and holding the runs longer would let the host go cold before the call
QUIET_MAX_FRACTION = 0.25
QUIET_MAX_S = 0.02
# why a request of a quiet server still met a keep-warm run (CadenceForecast.miss; the server's stats and /metrics)
MISSES = ("no_forecast", "off_forecast", "long_run")
# a window from one gap alone knows nothing of the loop's jitter: it allows this much on each side (beside the
# margin). On benchmarks/cadence_replay.py's rollout with a 0.2 ms jitter, without it the one-gap window missed 62 of
# 200 episode starts' third calls, with it 6, for 0.06 ms more of held runs a call
ONE_GAP_JITTER_S = 0.0005
# the paces a stream kept (each from at least two gaps that agreed) that are remembered, the newest first: a loop's,
# and a closed-loop burst's or a second rate's beside it
PACES_KEPT = 3
# the calls (arrival to reply) remembered, whose median is a stream's usual call: one longer than that may have
# overrun the loop's period, and a loop that sleeps out the period after each step then sends every later request
# that much late (benchmarks/cadence_replay.py at 60 Hz, a third of the calls overrunning: 1268 -> 352 of 9000 calls
# unexpected; on an H100 no request has yet been seen to wait after an overrun, session 56)
CALLS_KEPT = 8


class CadenceForecast:
    """The next arrival of a steady stream of requests, from its last CADENCE_ARRIVALS arrival times (seconds on one
    clock, e.g. time.perf_counter())."""

    def __init__(self, arrivals: int = CADENCE_ARRIVALS):
        if isinstance(arrivals, bool) or not isinstance(arrivals, int) or arrivals < 3:
            raise ValueError(f"arrivals must be an integer >= 3 (two gaps to compare), got {arrivals!r}")
        self._arrivals: deque[float] = deque(maxlen=arrivals)
        self._paces: deque[list[float]] = deque(maxlen=PACES_KEPT)  # the gaps of each pace kept, the newest first
        self._calls: deque[float] = deque(maxlen=CALLS_KEPT)  # arrival to reply, seconds
        self._late_s = 0.0  # how much longer than the usual call the newest arrival's call took

    @property
    def last_arrival(self) -> float:
        """The newest arrival seen (-inf before any)."""
        return self._arrivals[-1] if self._arrivals else -float("inf")

    @property
    def paces(self) -> list[float]:
        """The median gap of each pace remembered, the newest first."""
        return [statistics.median(p) for p in self._paces]

    def observe(self, t: float) -> None:
        """One request's arrival. A time not after the last one (the jobs of one list request) adds nothing."""
        if self._arrivals and t <= self._arrivals[-1]:
            return
        self._arrivals.append(t)
        self._late_s = 0.0  # the next reply says
        newest = _newest_window(t, self._gaps(), 0.0)
        if newest is not None:  # a pace kept: it replaces the one remembered at about its gap
            steady = newest[0]
            self._paces = deque([p for p in self._paces if not _same_pace(p, steady)], maxlen=PACES_KEPT)
            self._paces.appendleft(steady)

    def replied(self, arrival: float, t: float) -> None:
        """The reply to the request that arrived at `arrival` went out at `t` (on the arrivals' clock). Where that is
        the newest arrival and its call took longer than the stream's usual one (the median of the CALLS_KEPT calls
        before it), each window stays open that much longer: a loop that sleeps out its control period after each
        step (vlaperf's rollout, openpi's runtime) starts the step after a call that overran the period late, by up
        to how much longer that call took, and its next request comes that much late."""
        took = t - arrival
        if not took >= 0:
            return
        if self._arrivals and arrival == self._arrivals[-1]:
            self._late_s = max(0.0, took - statistics.median(self._calls)) if self._calls else 0.0
        self._calls.append(took)

    def quiet_windows(self, run_s: float) -> list[tuple[float, float]]:
        """The spans (start, end) in which a keep-warm run of `run_s` seconds that starts there may still be running
        when the next request arrives; none before two arrivals.

        The next arrival is the last one plus the median gap, give or take the largest gap's distance from that
        median (the jitter). A window opens a run's length before the earliest arrival and closes at the latest,
        each widened by QUIET_MARGIN_S. The gaps are the newest ones that give a window, all of them where they
        agree, else the newest two: where a loop changes pace (an episode's first calls, after a closed-loop burst
        or a reset), its older gaps are another cadence's (session 54's CPU rollouts: waiting for them to pass left
        each episode's first four calls without a window). Where the newest two do not agree either, each pace the
        stream kept before (PACES_KEPT) gives a window from the last arrival: after a burst and a reset, the loop's
        second call comes at the loop's old pace (session 55, an H100: the four requests that still waited in two
        rounds had no window, at an episode's calls 1 and 2). A stream that has kept no pace yet has its newest gap
        forecast to repeat: a robot's first calls after its first request. After a call that took longer than the
        usual (`replied`), each window's end is later by as much (at most to the width a window may take). A wrong
        window only holds the runs for its width (a few ms)."""
        gaps = self._gaps()
        if not gaps:
            return []
        last, late = self._arrivals[-1], self._late_s
        newest = _newest_window(last, gaps, run_s, late)
        if newest is not None:
            return [newest[1]]
        if not self._paces:
            window = _window(last, gaps[-1:], run_s, min_jitter=ONE_GAP_JITTER_S, late_s=late)
            return [] if window is None else [window]
        return [w for p in self._paces if (w := _window(last, p, run_s, late_s=late)) is not None]

    def miss(self, arrival: float, run_s: float) -> str:
        """Why a request that arrived at `arrival` met a keep-warm run, the windows being those for runs of `run_s`
        (call it before the arrival is observed): "no_forecast" (no window: under two arrivals, or each window
        too wide beside the run's length), "off_forecast" (it arrived outside every span a window expected it in), or
        "long_run" (it arrived where expected: the run, started before the window, lasted longer than the run_s it
        was held back for)."""
        windows = self.quiet_windows(run_s)
        if not windows:
            return "no_forecast"
        expected = any(start + max(0.0, run_s) <= arrival <= end for start, end in windows)
        return "long_run" if expected else "off_forecast"

    def _gaps(self) -> list[float]:
        times = list(self._arrivals)
        return [b - a for a, b in zip(times, times[1:])]


def _newest_window(last: float, gaps: list[float], run_s: float,
                   late_s: float = 0.0) -> tuple[list[float], tuple[float, float]] | None:
    """(the gaps, their window): the newest two or more gaps that give a window, as many as do; None where none."""
    for n in range(len(gaps), 1, -1):
        window = _window(last, gaps[-n:], run_s, late_s=late_s)
        if window is not None:
            return gaps[-n:], window
    return None


def _window(last: float, gaps: list[float], run_s: float, min_jitter: float = 0.0,
            late_s: float = 0.0) -> tuple[float, float] | None:
    """A quiet window from these gaps after the arrival at `last`, allowing at least `min_jitter` each side and
    `late_s` more after (as far as the widest window allowed); None where the window without `late_s` is too wide."""
    gap = statistics.median(gaps)
    jitter = max(min_jitter, max(abs(g - gap) for g in gaps))
    due = last + gap
    start = due - jitter - QUIET_MARGIN_S - max(0.0, run_s)
    end = due + jitter + QUIET_MARGIN_S
    widest = min(QUIET_MAX_FRACTION * gap, QUIET_MAX_S)
    if end - start > widest:
        return None
    return start, min(end + late_s, start + widest)


def _same_pace(a: list[float], b: list[float]) -> bool:
    """Whether two paces' gaps are one pace: their medians within the larger jitter and the margin of each other."""
    ga, gb = statistics.median(a), statistics.median(b)
    jitter = max(abs(g - m) for gaps, m in ((a, ga), (b, gb)) for g in gaps)
    return abs(ga - gb) <= jitter + QUIET_MARGIN_S
