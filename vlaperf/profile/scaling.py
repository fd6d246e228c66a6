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

from typing import Any, Callable, Sequence

import torch

from vlaperf.models.pi0 import MAX_NUM_STEPS as MAX_STEP_COUNT  # sample_actions' own bound
# the fit and the plot live in a torch-free module (`vlaperf report` draws T(N) with them); the names stay here too,
# where docs/profiling.md's Python API imports them
from vlaperf.profile.scaling_fit import describe_fit, fit_linear, plot_scaling, poor_fit  # noqa: F401
from vlaperf.timing import interleaved

DEFAULT_STEPS = (1, 2, 5, 10, 20)


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
            point = {"steps": n, "median_ms": wall["median"], "p95_ms": wall["p95"],
                     "event_median_ms": ev["median"] if ev else None,
                     "wall_ms": wall, "cuda_event_ms": ev, "first_call_s": v["first_call_s"]}
            if wam:  # the video's calls at this N (its early stop keeps its share), which the workload's settings,
                # at the workload's own steps, do not say
                point["video_steps"] = w.with_overrides(steps=n).video_steps
            points.append(point)
        fit = fit_linear([p["steps"] for p in points], [p["median_ms"] for p in points])
        fit_ev = None
        if all(p["event_median_ms"] is not None for p in points):
            fit_ev = fit_linear([p["steps"] for p in points], [p["event_median_ms"] for p in points])
        series.append({"label": label, "points": points, "fit": fit, "fit_cuda_event": fit_ev})
    return {
        "steps": steps, "warmup": max(warmup, 1), "iters": iters, "interleaved": True, "mode": mode,
        "timer": "wall clock, synced (median per N)", "series": series, "fit": series[0]["fit"],
    }
