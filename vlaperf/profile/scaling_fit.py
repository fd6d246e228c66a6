"""T(N)'s line fit, its words and its plot: functions of numbers and of a scaling result, nothing measured.

vlaperf.profile.scaling times T(N) and fits it with these (and re-exports them, its documented API); `vlaperf
report` draws a result file's T(N) with them. This module imports no torch (nor the models), so that a report,
pure post-processing of result files, does not import it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence


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


def poor_fit(fit: dict[str, float]) -> bool:
    """Noise or a non-linear T(N): the line's a and b mean little (the CLI's table and the report both say so). A
    negative fixed cost a or cost per step b is no call's: more steps never take less time."""
    return fit["r2"] < 0.95 or fit["intercept"] < 0 or fit["slope"] < 0


def _signed(x: float) -> str:
    """'+ 0.628' or '- 0.500': the line reads as arithmetic ('10.500 - 0.500*N', not '10.500 + -0.500*N')."""
    return f"{'-' if x < 0 else '+'} {abs(x):.3f}"


def describe_fit(fit: dict[str, float], points: int | None = None) -> str:
    """The fitted line and its r^2; fitted to `points` T(N), where two say so instead of the r^2 (1 whatever T(N)
    does: one line passes through any two points, so it is no evidence of a line)."""
    text = f"T(N) = {fit['intercept']:.3f} {_signed(fit['slope'])}*N ms"
    text += " (2 points: a line fits any two, so no r^2; 3 or more --steps test it)" if points == 2 \
        else f" (r^2 {fit['r2']:.4f})"
    if poor_fit(fit):  # says which test failed: with 2 points the r^2 is 1, and only the intercept can be at fault
        why = ("not a line" if fit["r2"] < 0.95 else "a negative cost per step b" if fit["slope"] < 0
               else "a negative fixed cost a")
        text += f" (poor fit: {why}; more --iters or a quieter machine)"
    return text


def plot_scaling(result: dict[str, Any], path: str | Path | None = None, title: str | None = None):
    """Points (median, p95 whisker) and the fitted line per series. Writes a PNG when
    `path` is given; returns the matplotlib Figure. `result` is scaling()'s return value
    or a result file holding it under "scaling"."""
    from matplotlib.figure import Figure

    from vlaperf.report.document import short_variant

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
