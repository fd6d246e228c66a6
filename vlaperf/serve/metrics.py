"""The server's live figures at `GET /metrics`, in Prometheus's text format (no client library needed).

A fleet of robots on one policy server is watched the way any service is: a scraper reads counters and latency
histograms every few seconds. What the server exports:

    vlaperf_requests_total, vlaperf_request_errors_total        frames received, and those answered with an error
    vlaperf_batches_total, vlaperf_batched_observations_total   inference calls and the observations they carried
    vlaperf_dropped_observations_total                          queued observations of connections that closed
    vlaperf_refused_connections_total                           connections refused at max_connections (HTTP 503)
    vlaperf_idle_closed_connections_total                       connections closed after idle_timeout_s quiet
    vlaperf_rtc_guided_observations_total, vlaperf_rtc_unguided_observations_total
                                                                observations sent with real-time chunking's keys
                                                                (`serve --rtc`), guided or not (nothing to continue)
    vlaperf_keep_warm_runs_total, vlaperf_keep_warm_delayed_observations_total, vlaperf_keep_warm_quiet_total
                                                                `serve --keep-warm-ms`: its runs, the observations
                                                                that waited for one, the windows that held runs back
    vlaperf_keep_warm_paused_total                              runs over 20 ms (not the cheap host path keep-warm
                                                                is for), after each of which runs stop until the
                                                                next request
    vlaperf_keep_warm_delayed_why_total{why}                    of those that waited with quiet on, why: no_forecast,
                                                                off_forecast, long_run (vlaperf.serve.cadence)
    vlaperf_connections, vlaperf_inflight_requests, vlaperf_queued_observations   gauges, now
    vlaperf_request_seconds      a request's server-side time, frame received to reply sent (histogram)
    vlaperf_queue_seconds        an observation's wait for the inference thread (histogram)
    vlaperf_infer_seconds        one batched policy call, transform to actions on the host (histogram)
    vlaperf_batch_size           observations per policy call (histogram)

The latency buckets are finest where a closed control loop lives (5-50 ms). Histograms are cumulative from the
server's start, as Prometheus expects; rates and quantiles over a window are the scraper's to compute.
"""

from __future__ import annotations

import bisect
import math
import threading

from vlaperf.serve.cadence import MISSES

METRICS_PATH = "/metrics"
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# a keep-warm run is host work and a few small kernels: well under SECONDS_BUCKETS' first bucket on a GPU host
KEEP_WARM_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Histogram:
    """Counts of observed values at or below each bucket's upper bound, their sum and count; safe to observe from
    the inference thread while the event loop renders."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)  # the last one: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[int], float, int]:
        """(cumulative count at each bound, then +Inf), sum, count."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for c in counts:
            running += c
            cumulative.append(running)
        return cumulative, total, running

    def lines(self, name: str, help_text: str) -> list[str]:
        cumulative, total, count = self.snapshot()
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, c in zip(self.buckets, cumulative):
            out.append(f'{name}_bucket{{le="{bound:g}"}} {c}')
        out += [f'{name}_bucket{{le="+Inf"}} {cumulative[-1]}', f"{name}_sum {float(total)!r}", f"{name}_count {count}"]
        return out


class ServerMetrics:
    """The histograms a PolicyServer fills as it serves."""

    def __init__(self):
        self.request_seconds = Histogram(SECONDS_BUCKETS)
        self.queue_seconds = Histogram(SECONDS_BUCKETS)
        self.infer_seconds = Histogram(SECONDS_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.keep_warm_seconds = Histogram(KEEP_WARM_BUCKETS)


def render(stats: dict, gauges: dict, metrics: ServerMetrics) -> str:
    """The text a scrape gets: `stats` the server's counters, `gauges` its values now."""
    out: list[str] = []

    def counter(name: str, help_text: str, key: str) -> None:
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {int(stats.get(key, 0))}"])

    counter("vlaperf_requests_total", "requests (frames) received", "requests")
    counter("vlaperf_request_errors_total", "requests answered with an error frame", "errors")
    counter("vlaperf_batches_total", "batched policy calls", "batches")
    counter("vlaperf_batched_observations_total", "observations answered by the policy calls", "batched_observations")
    counter("vlaperf_dropped_observations_total", "queued observations of connections that closed", "dropped_observations")
    counter("vlaperf_refused_connections_total", "connections refused at the server's limit (HTTP 503)",
            "refused_connections")
    counter("vlaperf_idle_closed_connections_total", "connections closed after --idle-timeout-s without a request",
            "idle_closed")
    counter("vlaperf_rtc_guided_observations_total", "observations with real-time chunking's keys, guided toward "
            "their connection's previous chunk", "rtc_guided")
    counter("vlaperf_rtc_unguided_observations_total", "observations with real-time chunking's keys and nothing to "
            "continue (no previous chunk, or all of it executed)", "rtc_unguided")
    counter("vlaperf_keep_warm_runs_total", "keep-warm runs of the last request's host stages while idle "
            "(--keep-warm-ms)", "keep_warm_runs")
    counter("vlaperf_keep_warm_delayed_observations_total", "observations that arrived during a keep-warm run and "
            "waited for it", "keep_warm_delayed")
    counter("vlaperf_keep_warm_paused_total", "keep-warm runs that took over 20 ms, after which runs stopped until "
            "the next request", "keep_warm_paused")
    counter("vlaperf_keep_warm_quiet_total", "times keep-warm held its runs back because a steady client's next "
            "request was due", "keep_warm_quiet")
    name = "vlaperf_keep_warm_delayed_why_total"
    out.extend([f"# HELP {name} of the observations that waited for a keep-warm run with quiet on, why the run was "
                "not held back: no forecast (too few or irregular arrivals), off forecast (arrived outside the "
                "expected span), long run (the run outlasted the length it was held back for)", f"# TYPE {name} counter"])
    out.extend(f'{name}{{why="{why}"}} {int(stats.get(f"keep_warm_delayed_{why}", 0))}' for why in MISSES)
    for name, help_text in (("connections", "open websocket connections"),
                            ("inflight_requests", "requests received and not yet answered"),
                            ("queued_observations", "observations waiting for the inference thread")):
        out.extend([f"# HELP vlaperf_{name} {help_text}", f"# TYPE vlaperf_{name} gauge",
                    f"vlaperf_{name} {int(gauges.get(name, 0))}"])
    out += metrics.request_seconds.lines("vlaperf_request_seconds",
                                         "a request's time in the server, frame received to reply sent")
    out += metrics.queue_seconds.lines("vlaperf_queue_seconds", "an observation's wait for the inference thread")
    out += metrics.infer_seconds.lines("vlaperf_infer_seconds", "one batched policy call")
    out += metrics.batch_size.lines("vlaperf_batch_size", "observations per policy call")
    out += metrics.keep_warm_seconds.lines("vlaperf_keep_warm_seconds", "one keep-warm run (--keep-warm-ms)")
    return "\n".join(out) + "\n"
