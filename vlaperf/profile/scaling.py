"""T(N): latency of one policy call against the number of denoise steps, and its line fit.

A flow-matching policy call is a fixed part (vision, prefill, set-up) plus N denoise steps,
so T(N) = a + b*N fits it closely: the intercept a is what step count cannot buy back,
the slope b is the cost of one step (host syncs included: the reference's while loop adds
a round trip per step, the for_loop lever takes it out of b).

    result = scaling(model, "libero-pi0")                                 # the reference
    result = scaling({"reference": model, "for_loop": Engine(model, "for_loop")}, "libero-pi0")
    plot_scaling(result, "tn.png")

Every (variant, N) pair is timed in the same interleaved rounds (vlaperf.timing.interleaved:
rotating order, synced before and after each call), so drift hits every point alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vlaperf.models.pi0 import MAX_NUM_STEPS as MAX_STEP_COUNT  # sample_actions' own bound
from vlaperf.timing import interleaved

DEFAULT_STEPS = (1, 2, 5, 10, 20)


def fit_linear(ns: Sequence[float], times: Sequence[float]) -> dict[str, float]:
    """Least-squares line times = intercept + slope * n, and its r^2.

    Closed form on centred data (exact for points on a line, up to float rounding).
    r^2 = 1 - SS_res / SS_tot; with all times equal it is 1.0 for a perfect fit, else 0.0.
    """
    n = len(ns)
    if n != len(times):
        raise ValueError(f"fit_linear: {n} x values but {len(times)} times")
    if n < 2 or len(set(float(x) for x in ns)) < 2:
        raise ValueError("fit_linear: need at least two distinct x values")
    xs, ys = [float(x) for x in ns], [float(y) for y in times]
    if min(ys) == max(ys):
        # A flat line, said exactly: the float mean of equal values can sit an ulp off them (three 0.1s average to
        # 0.10000000000000002), and SS_res / SS_tot of those ulps made a flat T(N) a "poor fit" with r^2 0.
        return {"intercept": ys[0], "slope": 0.0, "r2": 1.0}
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_res = math.fsum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = math.fsum((y - my) ** 2 for y in ys)
    if ss_tot == 0.0:
        r2 = 1.0 if ss_res == 0.0 else 0.0
    else:
        r2 = 1.0 - ss_res / ss_tot
    return {"intercept": intercept, "slope": slope, "r2": r2}


def _as_sample_fn(source) -> tuple[Callable, Any, torch.device | None]:
    """A model, an Engine or a callable (obs, noise, num_steps) -> (fn, config, device)."""
    from vlaperf.engine import Engine
    from vlaperf.engine.wam import WamEngine
    from vlaperf.models.pi0 import Pi0Model
    from vlaperf.models.wam import WorldActionModel

    if isinstance(source, WorldActionModel):
        return source.generate, source.config, source.device
    if isinstance(source, WamEngine):
        return source.generate, source.cfg, source.device
    if isinstance(source, Pi0Model):
        return source.sample_actions, source.config, source.action_in_proj.weight.device
    if isinstance(source, Engine):
        return source.sample_actions, source.model.config, source.device
    if callable(source):
        return source, None, None
    raise TypeError(f"scaling: expected a Pi0Model, an Engine or a callable (obs, noise, num_steps), got {type(source).__name__}")




def scaling(sources, workload, steps: Sequence[int] = DEFAULT_STEPS, warmup: int = 3, iters: int = 10,
            device: torch.device | str | None = None, *, seed: int = 0, config=None, progress: bool = False,
            mode: str = "model") -> dict[str, Any]:
    """Time T(N) for each N in `steps` and fit a + b*N per variant.

    sources: a Pi0Model, an Engine, a callable (obs, noise, num_steps), or a dict
    {label: one of those} to compare variants on one plot. For a bare callable pass
    `config` (defaults to the workload's preset) and `device`. `mode` "policy" (pi0 family, a
    model or an Engine): each point is the served call of N steps (`vlaperf.policy.served_call`),
    whose transform and copies add to the intercept, not to the slope.
    Returns {"steps", "warmup", "iters", "timer", "series": [{"label", "points", "fit",
    "fit_cuda_event"}], "fit": the first series' fit}. Times in ms; points hold the
    median/p95 of each N and the full summaries.
    """
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.workloads import get_workload

    from vlaperf.workloads import WamWorkload, get_wam_workload, is_wam_workload

    if isinstance(workload, str):
        w = get_wam_workload(workload) if is_wam_workload(workload) else get_workload(workload)
    else:
        w = workload
    wam = isinstance(w, WamWorkload)
    if mode not in ("model", "policy"):
        raise ValueError(f"scaling: mode must be 'model' or 'policy', got {mode!r}")
    if isinstance(steps, (str, bytes)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in steps):
        raise ValueError(f"scaling: steps must be integers, got {steps!r}")
    steps = sorted(set(steps))
    if len(steps) < 2 or steps[0] < 1 or steps[-1] > MAX_STEP_COUNT:
        raise ValueError(f"scaling: need at least two different step counts in 1..{MAX_STEP_COUNT}, got {steps}")
    from vlaperf.models.wam import WorldActionModel

    if not isinstance(sources, dict):
        from vlaperf.models.pi0 import Pi0Model

        reference = isinstance(sources, (Pi0Model, WorldActionModel))
        label = sources.name if hasattr(sources, "levers") else "reference" if reference else "policy"
        sources = {label: sources}
    fns, cfg, dev = {}, config, None if device is None else torch.device(device)
    resolved = {}
    for label, src in sources.items():
        is_wam_source = isinstance(getattr(src, "model", src), WorldActionModel)
        if callable(getattr(src, "sample_actions", None)) or is_wam_source:  # a model or an engine: its family
            if is_wam_source != wam:
                raise ValueError(f"scaling: source {label!r} is a {'world-action' if is_wam_source else 'pi0-family'} "
                                 f"model, the workload {w.id!r} is not")
        fn, c, d = _as_sample_fn(src)
        resolved[label] = fn
        cfg = cfg or c
        dev = dev or d
    dev = dev or torch.device("cpu")
    if mode == "policy" and wam:
        raise ValueError("scaling: mode 'policy' is for the pi0 family; the world-action model has no served path in "
                         "vlaperf to time")
    if wam:  # generate(obs, noise, N, ...): the video's early stop keeps its share of the N calls
        from vlaperf.models.wam import get_config as wam_config
        from vlaperf.models.wam import random_wam_inputs

        cfg = cfg or wam_config(w.preset)
        first = next(iter(sources.values()))  # a WorldActionModel or a WamEngine (which has .model)
        dtype = getattr(first, "model", first).dtype
        obs, noise = random_wam_inputs(cfg, w.batch, dev, dtype, seed=seed)

        def call(f, k):
            kw = w.with_overrides(steps=k).sampling()
            return lambda: f(obs, noise, **kw)

        for label, fn in resolved.items():
            for n in steps:
                fns[(label, n)] = call(fn, n)
    else:
        if cfg is None:
            cfg = w.model_config()
        obs = random_observation(w, cfg, dev, seed=seed)
        noise = random_noise(w, cfg, dev, seed=seed)
        from vlaperf.models.pi0 import Pi0Model
        from vlaperf.policy import served_call

        for label, fn in resolved.items():
            if mode == "policy":  # a Policy of N steps around the same sample, the same request each call
                src = sources[label]
                model = getattr(src, "model", src)  # an Engine's model
                if not isinstance(model, Pi0Model):
                    raise ValueError(f"scaling: mode 'policy' needs a Pi0Model or an Engine, got {type(src).__name__} "
                                     f"for {label!r}")
                verify = getattr(src, "raise_on_kernel_fault", None)  # as a server checks the step kernel
                for n in steps:
                    fns[(label, n)] = served_call(model, fn, w.with_overrides(steps=n), noise, seed=seed, verify=verify)
                continue
            for n in steps:
                fns[(label, n)] = (lambda f, k: lambda: f(obs, noise, k))(fn, n)
    keys = list(fns)
    names = {k: f"{k[0]} N={k[1]}" for k in keys}
    timing = interleaved({names[k]: fns[k] for k in keys}, device=dev, warmup=max(warmup, 1), iters=iters,
                         progress=progress)
    series = []
    for label in resolved:
        points = []
        for n in steps:
            v = timing["variants"][names[(label, n)]]
            wall, ev = v["timers"]["wall_ms"], v["timers"]["cuda_event_ms"]
            points.append({"steps": n, "median_ms": wall["median"], "p95_ms": wall["p95"],
                           "event_median_ms": ev["median"] if ev else None,
                           "wall_ms": wall, "cuda_event_ms": ev, "first_call_s": v["first_call_s"]})
        fit = fit_linear([p["steps"] for p in points], [p["median_ms"] for p in points])
        fit_ev = None
        if all(p["event_median_ms"] is not None for p in points):
            fit_ev = fit_linear([p["steps"] for p in points], [p["event_median_ms"] for p in points])
        series.append({"label": label, "points": points, "fit": fit, "fit_cuda_event": fit_ev})
    return {
        "steps": steps, "warmup": max(warmup, 1), "iters": iters, "interleaved": True, "mode": mode,
        "timer": "wall clock, synced (median per N)", "series": series, "fit": series[0]["fit"],
    }


def poor_fit(fit: dict[str, float]) -> bool:
    """Noise or a non-linear T(N): the line's a and b mean little (the CLI's table and the report both say so)."""
    return fit["r2"] < 0.95 or fit["intercept"] < 0


def describe_fit(fit: dict[str, float], points: int | None = None) -> str:
    """The fitted line and its r^2; fitted to `points` T(N), where two say so instead of the r^2 (1 whatever T(N)
    does: one line passes through any two points, so it is no evidence of a line)."""
    text = f"T(N) = {fit['intercept']:.3f} + {fit['slope']:.3f}*N ms"
    text += " (2 points: a line fits any two, so no r^2; 3 or more --steps test it)" if points == 2 \
        else f" (r^2 {fit['r2']:.4f})"
    if poor_fit(fit):  # says which test failed: with 2 points the r^2 is 1, and only the intercept can be at fault
        why = "a negative fixed cost a" if fit["r2"] >= 0.95 else "not a line"
        text += f" (poor fit: {why}; more --iters or a quieter machine)"
    return text


def plot_scaling(result: dict[str, Any], path: str | Path | None = None, title: str | None = None):
    """Points (median, p95 whisker) and the fitted line per series. Writes a PNG when
    `path` is given; returns the matplotlib Figure. `result` is scaling()'s return value
    or a result file holding it under "scaling"."""
    from matplotlib.figure import Figure

    from vlaperf.report.render import short_variant

    data = result.get("scaling", result)
    fig = Figure(figsize=(6.4, 4.2 + 0.25 * len(data["series"])), dpi=110, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    ns_all = [p["steps"] for s in data["series"] for p in s["points"]]
    x_line = [0, max(ns_all) * 1.05]
    for i, s in enumerate(data["series"]):
        c = colors[i % len(colors)]
        ns = [p["steps"] for p in s["points"]]
        med = [p["median_ms"] for p in s["points"]]
        up = [max(p["p95_ms"] - p["median_ms"], 0.0) for p in s["points"]]
        ax.errorbar(ns, med, yerr=[[0.0] * len(up), up], fmt="o", color=c, capsize=3)
        f = s["fit"]
        name = short_variant(s["label"])
        name = name if len(name) <= 64 else name[:63] + "\u2026"
        ax.plot(x_line, [f["intercept"] + f["slope"] * x for x in x_line], "-", color=c, alpha=0.8,
                label=f"{name}: {f['intercept']:.2f} + {f['slope']:.3f}*N ms "
                      + ("(2 points)" if len(ns) == 2 else f"(r²={f['r2']:.3f})"))
    ax.set_xlabel("denoise steps N")
    ax.set_ylabel("latency per call, median ms (whisker: p95)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    # below the axes: inside, long variant names squeezed the plot and hid the whiskers
    fig.legend(fontsize=8, loc="outside lower center")
    ax.set_title(title or "T(N) = a + b*N", fontsize=10)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(str(path), format="png")
    return fig
