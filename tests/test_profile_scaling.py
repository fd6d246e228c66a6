"""CPU tests of vlaperf.profile.scaling: the least-squares fit and T(N) on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlaperf.engine import Engine
from vlaperf.models.pi0 import build_model
from vlaperf.profile.scaling import fit_linear, plot_scaling, scaling


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("a,b", [(13.9, 0.628), (13.9, 0.795), (0.0, 1.0), (250.0, -0.5)])
def test_fit_recovers_a_line_exactly(a, b):
    ns = [1, 2, 5, 10, 20]
    fit = fit_linear(ns, [a + b * n for n in ns])
    assert fit["intercept"] == pytest.approx(a, rel=1e-12, abs=1e-12)
    assert fit["slope"] == pytest.approx(b, rel=1e-12, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)


def test_fit_least_squares_on_noisy_points():
    np = pytest.importorskip("numpy")
    ns = [1, 2, 5, 10, 20]
    ts = [15.0, 15.3, 17.9, 21.6, 29.8]
    fit = fit_linear(ns, ts)
    slope, intercept = np.polyfit(ns, ts, 1)
    assert fit["slope"] == pytest.approx(slope) and fit["intercept"] == pytest.approx(intercept)
    pred = [intercept + slope * n for n in ns]
    r2 = 1 - sum((t - p) ** 2 for t, p in zip(ts, pred)) / sum((t - np.mean(ts)) ** 2 for t in ts)
    assert fit["r2"] == pytest.approx(r2) and 0.9 < fit["r2"] < 1.0


def test_fit_rejects_degenerate_input():
    with pytest.raises(ValueError):
        fit_linear([5, 5, 5], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="fit_linear: 2 x values but 1 times"):
        fit_linear([1, 2], [1.0])
    assert fit_linear([1, 2, 3], [2.0, 2.0, 2.0]) == {"intercept": 2.0, "slope": 0.0, "r2": 1.0}


@pytest.mark.parametrize("t", [0.1, 0.7, 4.89])
def test_fit_of_equal_times_is_a_perfect_flat_line(t):
    # the mean of three 0.1s is 0.10000000000000002 in floats: every point then sat 1 ulp off the mean, so SS_tot was
    # not 0 and a flat T(N) came out with r^2 0 ("poor fit") and an intercept that was not any measured time
    for ns in ([1, 2, 3], [1, 2, 5, 10, 20, 32]):
        assert fit_linear(ns, [t] * len(ns)) == {"intercept": t, "slope": 0.0, "r2": 1.0}


def test_scaling_tiny_model_reports_fit_and_plot(tmp_path):
    model = build_model("tiny")
    # up to 32 steps: 1..8 left ~4 ms between the ends, which a busy 2-core machine's noise once turned into a
    # negative slope
    result = scaling({"reference": model, "for_loop": Engine(model, "for_loop")}, "tiny", steps=(1, 2, 16, 32),
                     warmup=1, iters=3)
    assert result["steps"] == [1, 2, 16, 32] and result["interleaved"]
    assert [s["label"] for s in result["series"]] == ["reference", "for_loop"]
    for s in result["series"]:
        assert [p["steps"] for p in s["points"]] == [1, 2, 16, 32]
        assert all(p["wall_ms"]["count"] == 3 for p in s["points"])
        # the flat fields the report and the table read are the summary's own
        assert all(p["median_ms"] == p["wall_ms"]["median"] and p["p95_ms"] == p["wall_ms"]["p95"] for p in s["points"])
        fit = s["fit"]
        assert set(fit) == {"intercept", "slope", "r2"}
        assert fit["slope"] > 0  # each step costs time
        # the line and its r^2 are the least-squares ones of the medians, computed here independently (numpy)
        ns, ms = np.array([p["steps"] for p in s["points"]], float), np.array([p["median_ms"] for p in s["points"]])
        slope, intercept = np.polyfit(ns, ms, 1)
        r2 = 1 - np.sum((ms - (intercept + slope * ns)) ** 2) / np.sum((ms - ms.mean()) ** 2)
        assert (fit["slope"], fit["intercept"], fit["r2"]) == pytest.approx((slope, intercept, r2), rel=1e-6, abs=1e-9)
    assert result["fit"] == result["series"][0]["fit"]
    png = tmp_path / "tn.png"
    plot_scaling(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_interleaved(seen):
    """interleaved() with known timings: 'label N=n' takes a + b*n ms on the wall clock (plus a 0.1 ms median
    offset and a 3 ms outlier, so mean, median and p95 all differ) and 0.5 ms less on the CUDA events."""
    from vlaperf.timing import summarize

    lines = {"reference": (6.0, 0.8), "for_loop": (4.0, 0.5)}

    def fake(fns, *, device, warmup, iters, progress):
        seen.update(names=list(fns), warmup=warmup, iters=iters)
        variants = {}
        for name, fn in fns.items():
            fn()
            label, n = name.rsplit(" N=", 1)
            a, b = lines[label]
            t = a + b * int(n)
            variants[name] = {"timers": {"wall_ms": summarize([t, t + 0.1, t + 3.0]),
                                         "cuda_event_ms": summarize([t - 0.5] * 3)},
                              "first_call_s": int(n) / 100, "warmup_s": 0.0, "peak_memory_bytes": None}
        return {"variants": variants}

    return fake


def test_scaling_fits_the_medians_of_each_series(monkeypatch):
    """Each point is its own N's median and p95; each series' line fits its medians (wall clock) and, where
    there are CUDA events, the event medians; `fit` is the first series'. Steps are sorted and given once, and each
    call gets its own N."""
    seen, called = {}, []
    monkeypatch.setattr("vlaperf.profile.scaling.interleaved", _fake_interleaved(seen))
    sources = {label: (lambda obs, noise, n, label=label: called.append((label, n)))
               for label in ("for_loop", "reference")}
    result = scaling(sources, "tiny", steps=(16, 1, 2, 16), warmup=0, iters=7)
    assert result["steps"] == [1, 2, 16] and result["warmup"] == 1 and result["iters"] == 7
    assert seen["warmup"] == 1 and seen["iters"] == 7 and len(seen["names"]) == 6
    assert sorted(called) == [(label, n) for label in ("for_loop", "reference") for n in (1, 2, 16)]
    for s, (a, b) in zip(result["series"], [(4.0, 0.5), (6.0, 0.8)]):
        assert [p["median_ms"] for p in s["points"]] == pytest.approx([a + b * n + 0.1 for n in (1, 2, 16)])
        assert [p["p95_ms"] for p in s["points"]] == pytest.approx([a + b * n + 0.1 + 2.9 * 0.9 for n in (1, 2, 16)])
        assert [p["first_call_s"] for p in s["points"]] == [0.01, 0.02, 0.16]
        assert s["fit"] == pytest.approx({"intercept": a + 0.1, "slope": b, "r2": 1.0})
        assert s["fit_cuda_event"] == pytest.approx({"intercept": a - 0.5, "slope": b, "r2": 1.0})
    assert result["fit"] == result["series"][0]["fit"] != result["series"][1]["fit"]


def test_scaling_names_a_lone_source_by_what_it_is(monkeypatch):
    """A bare model is the 'reference' series, an Engine its lever spec, a callable 'policy'."""
    monkeypatch.setattr("vlaperf.profile.scaling.interleaved", _fake_interleaved({}))
    model = build_model("tiny")
    assert scaling(model, "tiny", steps=(1, 2))["series"][0]["label"] == "reference"
    assert scaling(Engine(model, "for_loop"), "tiny", steps=(1, 2))["series"][0]["label"] == "for_loop"


def test_policy_mode_times_the_served_call_of_each_step_count(monkeypatch):
    """mode 'policy': each point is Policy.infer of N steps around the source's sample (the model's, an Engine's),
    the same request every call; the actions are the model call's on the host. A bare callable has no model to
    serve, a world-action workload no served path, and another mode is none: each refused by name."""
    from vlaperf.policy import Policy

    seen = []
    infer = Policy.infer
    monkeypatch.setattr(Policy, "infer", lambda self, example: seen.append(
        (type(self.sample.__self__).__name__, self.num_steps, self.verify is not None)) or infer(self, example))
    model = build_model("tiny")
    result = scaling({"reference": model, "for_loop": Engine(model, "for_loop")}, "tiny", steps=(1, 3), warmup=1,
                     iters=2, mode="policy")
    assert result["mode"] == "policy" and [s["label"] for s in result["series"]] == ["reference", "for_loop"]
    # an Engine's calls check its step kernel after each call, as a server's do
    assert set(seen) == {("Pi0Model", 1, False), ("Pi0Model", 3, False), ("Engine", 1, True), ("Engine", 3, True)}
    assert len({seen.count(k) for k in set(seen)}) == 1  # as many calls of each point
    assert scaling(model, "tiny", steps=(1, 2), warmup=1, iters=1)["mode"] == "model"
    with pytest.raises(ValueError, match="scaling: mode 'policy' needs a Pi0Model or an Engine, got function"):
        scaling(lambda obs, noise, n: None, "tiny", steps=(1, 2), device="cpu", mode="policy")
    with pytest.raises(ValueError, match="scaling: mode must be 'model' or 'policy', got 'forward'"):
        scaling(model, "tiny", steps=(1, 2), mode="forward")
    from vlaperf.models.wam import build_wam
    from vlaperf.workloads import get_wam_workload

    with pytest.raises(ValueError, match="scaling: mode 'policy' is for the pi0 family"):
        scaling(build_wam(get_wam_workload("wam-tiny").preset), "wam-tiny", steps=(1, 2), mode="policy")


def test_scaling_accepts_a_plain_callable():
    model = build_model("tiny")
    result = scaling(lambda obs, noise, n: model.sample_actions(obs, noise, n), "tiny", steps=(1, 3), warmup=1,
                     iters=2, config=model.config)
    assert result["series"][0]["label"] == "policy" and len(result["series"][0]["points"]) == 2


def test_profiler_api_counts_are_checked():
    """The Python API refuses what the CLI refuses: no calls, fractional or huge step counts."""
    from vlaperf.profile.breakdown import breakdown_fn
    from vlaperf.profile.scaling import scaling
    from vlaperf.profile.syncs import count_syncs

    for iters in (0, -1, 2.5):
        with pytest.raises(ValueError, match="breakdown_fn: iters must be an integer >= 1"):
            breakdown_fn(lambda rec: None, iters=iters)
    with pytest.raises(ValueError, match="breakdown_fn: warmup must be an integer >= 0"):
        breakdown_fn(lambda rec: None, warmup=-5)
    with pytest.raises(ValueError, match="count_syncs: calls must be an integer >= 1, got 0"):
        count_syncs(lambda: None, device="cpu", calls=0)
    for steps in ((1.9, 2.9), "12", (1, 10**6)):
        with pytest.raises(ValueError, match="scaling: "):
            scaling(lambda obs, noise, n: None, "tiny", steps=steps, device="cpu")
    # one step count (given once or twice) fits no line; 0 steps is no policy call; True is no step count
    for steps in ((5,), (2, 2), (0, 2), (True, 2)):
        with pytest.raises(ValueError, match=r"scaling: (need at least two different step counts in 1\.\.1000|steps "
                                             r"must be integers), got"):
            scaling(lambda obs, noise, n: None, "tiny", steps=steps, device="cpu")


def test_scaling_takes_the_largest_step_count_sample_actions_takes(monkeypatch):
    from vlaperf.profile.scaling import MAX_STEP_COUNT

    monkeypatch.setattr("vlaperf.profile.scaling.interleaved", _fake_interleaved({}))
    result = scaling({"reference": lambda obs, noise, n: None}, "tiny", steps=(1, MAX_STEP_COUNT), device="cpu")
    assert result["steps"] == [1, MAX_STEP_COUNT]


def test_describe_fit_flags_a_line_that_does_not_fit():
    from vlaperf.profile.scaling import describe_fit

    assert "poor fit" not in describe_fit({"intercept": 6.0, "slope": 0.8, "r2": 0.999})
    assert "poor fit" in describe_fit({"intercept": -72.7, "slope": 32.6, "r2": 0.93})
    assert "poor fit" in describe_fit({"intercept": -0.1, "slope": 1.0, "r2": 0.999})
    assert "poor fit" in describe_fit({"intercept": 6.0, "slope": 0.8, "r2": 0.94})  # r^2 below 0.95
    assert describe_fit({"intercept": 13.9, "slope": 0.628, "r2": 0.99876}) == "T(N) = 13.900 + 0.628*N ms (r^2 0.9988)"
    # more steps never take less time: a falling T(N) (noise over few --iters) is flagged, and reads as arithmetic
    falling = fit_linear([1, 2, 5], [10.0, 9.5, 8.0])
    assert falling["r2"] == pytest.approx(1.0) and falling["slope"] == pytest.approx(-0.5)
    assert describe_fit(falling) == ("T(N) = 10.500 - 0.500*N ms (r^2 1.0000) (poor fit: a negative cost per step b; "
                                     "more --iters or a quieter machine)")


def test_a_two_point_fit_says_so_instead_of_an_r2_of_one():
    """Through two T(N) a line always passes exactly: its r^2 is 1 whatever T(N) does, so the table says "2 points"
    in its place and the plot's legend too; three or more points show the r^2 as before."""
    from vlaperf.profile.scaling import describe_fit

    fit = {"intercept": 35.091, "slope": 20.945, "r2": 1.0}
    assert describe_fit(fit, 2) == ("T(N) = 35.091 + 20.945*N ms (2 points: a line fits any two, so no r^2; 3 or more "
                                    "--steps test it)")
    assert describe_fit(fit, 3) == describe_fit(fit) == "T(N) = 35.091 + 20.945*N ms (r^2 1.0000)"
    # a negative a still is a poor fit, said as such (it read "not a line" beside a line through two points)
    assert describe_fit({**fit, "intercept": -1.0}, 2).endswith("test it) (poor fit: a negative fixed cost a; more "
                                                                  "--iters or a quieter machine)")
    assert "(poor fit: not a line;" in describe_fit({**fit, "r2": 0.9}, 3)
    for steps, said in (((1, 10), "(2 points)"), ((1, 5, 10), "(r²=1.000)")):
        points = [{"steps": n, "median_ms": 2.0 + 0.5 * n, "p95_ms": 2.5 + 0.5 * n} for n in steps]
        fit = {"intercept": 2.0, "slope": 0.5, "r2": 1.0}
        result = {"series": [{"label": "reference", "fit": fit, "points": points}]}
        (legend,) = plot_scaling(result).legends
        assert [t.get_text() for t in legend.get_texts()] == [f"reference: 2.00 + 0.500*N ms {said}"]


def test_plot_draws_each_series_fitted_line():
    """The drawn line is the fit's a + b*N over 0..max N (plus 5%), not just the points."""
    points = [{"steps": n, "median_ms": 2.0 + 0.5 * n, "p95_ms": 2.5 + 0.5 * n} for n in (1, 10)]
    result = {"series": [{"label": "reference", "fit": {"intercept": 2.0, "slope": 0.5, "r2": 1.0}, "points": points}]}
    ax = plot_scaling(result).axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert list(line.get_xdata()) == pytest.approx([0.0, 10.5])
    assert list(line.get_ydata()) == pytest.approx([2.0, 2.0 + 0.5 * 10.5])


def test_a_model_and_a_workload_of_different_families_are_named():
    """scaling(pi0_model, "wam-tiny") failed on a missing config attribute; Policy / WamPolicy given the other
    family's workload failed at their first call. Each is now refused up front, naming both sides."""
    from vlaperf.models.pi0 import build_model
    from vlaperf.models.wam import build_wam
    from vlaperf.policy import Policy, WamPolicy
    from vlaperf.workloads import get_wam_workload, get_workload

    pi0, wam = build_model("tiny"), build_wam("wam-tiny")
    with pytest.raises(ValueError, match="source 'reference' is a pi0-family model, the workload 'wam-tiny' is not"):
        scaling(pi0, "wam-tiny")
    with pytest.raises(ValueError, match="source 'reference' is a world-action model, the workload 'tiny' is not"):
        scaling(wam, "tiny")
    with pytest.raises(TypeError, match="expected a pi0-family Workload .* got WamWorkload: serve the world-action"):
        Policy(pi0, pi0.sample_actions, get_wam_workload("wam-tiny"))
    with pytest.raises(TypeError, match="expected a WamWorkload .* got Workload: serve the pi0 family with Policy"):
        WamPolicy(wam, wam.generate, get_workload("tiny"))
