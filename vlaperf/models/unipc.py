"""UniPC multistep sampling (Zhao et al. 2023) for flow-matching models, in two forms.

The model is a flow-matching one: x_sigma = (1 - sigma) * x0 + sigma * noise, sampled from
sigma = 1 (pure noise) down to sigma = 0 (data). In the diffusion notation of the paper that is
alpha = 1 - sigma, sigma = sigma, and the log-SNR lambda = log(alpha / sigma), which runs from
-inf (sigma 1) to +inf (sigma 0). The sampler works on the model's x0 prediction m_i at each
sample x_i ("data prediction"); a velocity model converts with `x0_from_velocity`.

The variant is UniPC-bh2 (B(h) = expm1(-h)) with the predictor UniP and the corrector UniC,
orders 1 to 3. For a step from s to t with h = lambda_t - lambda_s, history outputs m_k at
r_k = (lambda_k - lambda_s) / h and D_k = m_k - m_s:

    x_t = (sigma_t / sigma_s) x_s + alpha_t (1 - e^-h) m_s - alpha_t B(h) sum_k rho_k D_k / r_k

where rho solves sum_k rho_k r_k^(n-1) = n! * hh phi_(n+1)(hh) / B(h), n = 1.., hh = -h (phi_k the
exponential-integrator phi functions). The predictor of order p uses the p - 1 previous outputs;
the corrector (run once the model has been evaluated at x_t) uses the same ones plus the new
output m_t at r = 1, and recomputes x_t from x_s. Where the system is 1 x 1 (predictor order 2,
corrector order 1) rho = 1/2, as the paper's reference implementation and the scheduler
libraries do; that is accurate enough for those orders and keeps results comparable with them.

The ends of a flow schedule are singular in lambda, and are handled as explicit limits:
  * sigma_s = 1 or sigma_t = 0: h = +inf, so e^-h = 0 and B(h) = -1; the update is finite while
    no r_k is needed (order 1 predictor; the order-1 corrector of step 1).
  * a history output at sigma = 1 (lambda = -inf, only ever the first one, m_0): r_k -> -inf,
    so its weight rho_k / r_k -> 0 and the system loses that column and its last row (Cramer's
    rule: rho_k ~ r_k^-(n-1)). The limit keeps the other points' exact solve.
  * a predictor step to sigma_t = 0 of order >= 2 has no finite limit (r_k -> 0: it extrapolates
    m to lambda = +inf, the weights grow like h), so a step to sigma 0 always uses order 1
    (x_t = m_s), with or without lower_order_final.

Two forms of the same sampler:
  * `unipc_plan` + `UniPCSampler`: every coefficient computed once on the host in float64 and
    folded into one weight per tensor, so a step is a few multiply-adds with Python-float
    constants (no host sync, no per-step host tensors: CUDA-graph and torch.compile friendly).
  * `ReferenceUniPC`: computed as scheduler libraries do in a model runner, rebuilding lambdas,
    h, the r_k, B(h) and the linear system as device tensors at every step (linalg.solve on the
    device). The reference runner uses it; the engine replaces it with `UniPCSampler`, and the
    tests check that the two agree to float32 rounding.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_ORDER = 3


# --------------------------------------------------------------------------- schedule


def flow_sigmas(steps: int, shift: float = 1.0) -> list[float]:
    """steps + 1 sigmas from 1.0 down to 0.0: uniform in t, then the flow-matching time shift
    sigma = shift * t / (1 + (shift - 1) * t) (shift > 1 spends more steps at high noise)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not (shift > 0 and math.isfinite(shift)):
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}")
    shift = float(shift)
    sigmas = []
    for i in range(steps + 1):
        t = 1.0 - i / steps
        sigmas.append(shift * t / (1.0 + (shift - 1.0) * t))
    # the ends exactly: 1 + (shift - 1) can differ from shift by an ulp
    sigmas[0], sigmas[-1] = 1.0, 0.0
    # a shift far from 1 squeezes the sigmas against 1 (or 0) until neighbours round to the same float; say so here,
    # naming shift, rather than let the plan refuse a list of steps + 1 sigmas that the caller never wrote
    if not all(a > b for a, b in itertools.pairwise(sigmas)):
        raise ValueError(f"shift {shift!r} is too far from 1 for {steps} steps: neighbouring sigmas round to the same "
                         "float64 value (the schedule would not be strictly decreasing)")
    return sigmas


def x0_from_velocity(x: Tensor, v: Tensor, sigma: float | Tensor) -> Tensor:
    """The x0 prediction of a velocity model: v = noise - x0 and x = (1 - sigma) x0 + sigma noise
    give x0 = x - sigma * v. sigma: a float or a tensor that broadcasts against x."""
    return x - sigma * v


# --------------------------------------------------------------------------- argument checks


def _check_sigmas(sigmas: list[float]) -> list[float]:
    sig = [float(s) for s in sigmas]
    if len(sig) < 2:
        raise ValueError(f"sigmas must hold at least 2 values (steps + 1), got {len(sig)}")
    if not all(0.0 <= s <= 1.0 for s in sig):
        raise ValueError(f"sigmas must lie in [0, 1], got {sig}")
    if not all(a > b for a, b in itertools.pairwise(sig)):
        raise ValueError(f"sigmas must be strictly decreasing, got {sig}")
    return sig


def _check_order(order: int) -> None:
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise ValueError(f"order must be an integer in 1..{MAX_ORDER}, got {order!r}")


def _step_orders(sigmas: list[float], order: int, lower_order_final: bool) -> list[int]:
    """The predictor order of each step: limited by the outputs available so far (i + 1), with
    lower_order_final by the steps left (steps - i), and 1 for the step to sigma 0 (see the
    module docstring: higher orders have no finite limit there)."""
    steps = len(sigmas) - 1
    orders = []
    for i in range(steps):
        p = min(order, i + 1)
        if lower_order_final:
            p = min(p, steps - i)
        if sigmas[i + 1] == 0.0:
            p = 1
        orders.append(p)
    return orders


def _check_index(i: int, steps: int, next_index: int) -> None:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < steps:
        raise ValueError(f"step index must be an integer in 0..{steps - 1}, got {i!r}")
    if i != 0 and i != next_index:
        raise ValueError(f"steps must run in order: expected step {next_index} (or 0 to start over), got {i}")


# --------------------------------------------------------------------------- host-side math


def _lam(sigma: float) -> float:
    """lambda = log(alpha / sigma), alpha = 1 - sigma: -inf at sigma 1, +inf at sigma 0."""
    if sigma == 1.0:
        return -math.inf
    if sigma == 0.0:
        return math.inf
    return math.log1p(-sigma) - math.log(sigma)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting: the systems here are at most 3 x 3."""
    n = len(b)
    m = [row[:] + [rhs] for row, rhs in zip(a, b)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if m[piv][col] == 0.0:
            raise ValueError("singular UniPC system: the sigmas must be distinct")
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _bh2_rhs(hh: float, b_h: float, n: int) -> list[float]:
    """b_k = k! * hh phi_(k+1)(hh) / B(h) for k = 1..n, by phi_(k+1) = (phi_k - 1/k!) / hh."""
    hphi = math.expm1(hh) / hh - 1.0  # hh * phi_2(hh)
    factorial = 1.0
    out = []
    for k in range(1, n + 1):
        out.append(hphi * factorial / b_h)
        factorial *= k + 1
        hphi = hphi / hh - 1.0 / factorial
    return out


def _host_update(sigmas: list[float], s: int, t: int, history: list[int], with_new: bool
                 ) -> tuple[float, float, list[float], float]:
    """Weights of one UniP/UniC update from sample index s to t, folded per tensor:
        x_t = c_x * x_s + w_s * m_s + sum_k w_hist[k] * m_history[k] + w_new * m_t
    history: indices of the older outputs used (newest first); with_new: the corrector's m_t."""
    sig_s, sig_t = sigmas[s], sigmas[t]
    alpha_t = 1.0 - sig_t
    c_x = sig_t / sig_s  # exactly 0 at sigma_t = 0
    if sig_s == 1.0 or sig_t == 0.0:
        h = math.inf
        b_h = -1.0  # B(h) = expm1(-h) -> -1
    else:
        h = _lam(sig_t) - _lam(sig_s)
        b_h = math.expm1(-h)
    w_s = -alpha_t * b_h  # alpha_t (1 - e^-h); B(h) = e^-h - 1 here

    # the r_k of the points in the system; an output at sigma 1 has r = -inf and drops out
    kept = [k for k in history if sigmas[k] != 1.0]
    if kept and not math.isfinite(h):
        raise AssertionError("unreachable: a multistep term with h = inf")  # excluded by _step_orders
    rks = [(_lam(sigmas[k]) - _lam(sig_s)) / h for k in kept]
    if with_new:
        rks.append(1.0)
    n_full = len(history) + int(with_new)
    if not rks:
        rhos: list[float] = []
    elif n_full == 1:
        rhos = [0.5]  # the libraries' 1 x 1 convention (see the module docstring)
    else:
        rhs = _bh2_rhs(-h, b_h, len(rks))
        rhos = _solve([[r**row for r in rks] for row in range(len(rks))], rhs)

    weights = [-alpha_t * b_h * rho / r for rho, r in zip(rhos, rks)]  # on each D_k = m_k - m_s
    w_s -= sum(weights)
    by_index = dict(zip(kept, weights))
    w_hist = [by_index.get(k, 0.0) for k in history]
    w_new = weights[-1] if with_new else 0.0
    return c_x, w_s, w_hist, w_new


# --------------------------------------------------------------------------- plan + sampler


@dataclass(frozen=True)
class UniPCStep:
    """The coefficients of step i, all Python floats (k = 0 is the newest output, m_i)."""

    sigma: float  # sigma_i, where the model was evaluated
    sigma_next: float
    # x_i corrected = corrector[0] * x_{i-1} + sum_k corrector[1][k] * m_{i-k}; None: no corrector
    corrector: tuple[float, tuple[float, ...]] | None
    # x_{i+1} = predictor[0] * x_i (corrected) + sum_k predictor[1][k] * m_{i-k}
    predictor: tuple[float, tuple[float, ...]]


def unipc_plan(sigmas: list[float], order: int = 2, corrector: bool = True,
               lower_order_final: bool = True) -> list[UniPCStep]:
    """Every step's coefficients, computed once on the host in float64; len(sigmas) - 1 steps.
    Predictor order at step i: min(order, i + 1), with lower_order_final also <= steps - i,
    and 1 for the step to sigma 0. The corrector at step i uses the order of step i - 1's
    predictor (it redoes that step with the new output)."""
    sig = _check_sigmas(sigmas)
    _check_order(order)
    orders = _step_orders(sig, order, lower_order_final)
    plan = []
    for i, p in enumerate(orders):
        corr = None
        if corrector and i > 0:
            q = orders[i - 1]
            c_x, w_s, w_hist, w_new = _host_update(sig, i - 1, i, list(range(i - 2, i - 1 - q, -1)), True)
            corr = (c_x, (w_new, w_s, *w_hist))  # m_i, m_{i-1}, m_{i-2}, ..
        c_x, w_s, w_hist, _ = _host_update(sig, i, i + 1, list(range(i - 1, i - p, -1)), False)
        plan.append(UniPCStep(sig[i], sig[i + 1], corr, (c_x, (w_s, *w_hist))))
    return plan


def _combine(c_x: float, x: Tensor, weights: tuple[float, ...], outputs: list[Tensor]) -> Tensor:
    """c_x * x + sum_k weights[k] * outputs[k]; exact-zero weights are skipped (the limits at the
    schedule's ends), so the step to sigma 0 returns m exactly."""
    acc = None if c_x == 0.0 else x * c_x
    for w, m in zip(weights, outputs):
        if w == 0.0:
            continue
        acc = m * w if acc is None else torch.add(acc, m, alpha=w)
    return torch.zeros_like(x) if acc is None else acc


class UniPCSampler:
    """Runs a plan on tensors: plain multiply-adds with Python-float coefficients, no host syncs,
    no tensor creation on the host per step, so it can be captured in a CUDA graph or traced by
    torch.compile (the coefficients are constants of the traced step)."""

    def __init__(self, plan: list[UniPCStep]):
        plan = list(plan)
        if not plan:
            raise ValueError("plan must hold at least one step")
        for i, st in enumerate(plan):
            if not isinstance(st, UniPCStep):
                raise TypeError(f"plan[{i}] is a {type(st).__name__}, not a UniPCStep")
            if i + 1 < len(plan) and st.sigma_next != plan[i + 1].sigma:
                raise ValueError(f"plan[{i}].sigma_next {st.sigma_next} != plan[{i + 1}].sigma {plan[i + 1].sigma}:"
                                 " the steps do not chain (a plan from other sigmas?)")
            if i == 0 and st.corrector is not None:
                raise ValueError("plan[0] has a corrector, but step 0 has no previous sample")
            if len(st.predictor[1]) > i + 1 or (st.corrector is not None and len(st.corrector[1]) > i + 1):
                raise ValueError(f"plan[{i}] uses more outputs than exist at step {i}")
        self.plan = plan
        # previous outputs to carry into the next step: a corrector of order p needs p of them
        # (plus the new one), a predictor of order p needs p - 1
        self._keep = max(len(c[1]) - 1 for st in plan for c in (st.predictor, st.corrector) if c is not None)
        self._keep = max(self._keep, 1)
        self.reset()

    @property
    def steps(self) -> int:
        return len(self.plan)

    def reset(self) -> None:
        """Forget the history: the next step is step 0 of a new call."""
        self._prev_x: Tensor | None = None  # the sample the last predictor started from
        self._history: list[Tensor] = []  # previous x0 predictions, newest first
        self._next = 0

    def step(self, i: int, x: Tensor, x0: Tensor) -> Tensor:
        """x = x_i, x0 = the model's x0 prediction at it; returns x_{i+1}. Step 0 starts a new call.
        The arithmetic runs in x's dtype."""
        _check_index(i, len(self.plan), self._next)
        if i == 0:
            self.reset()
        st = self.plan[i]
        outputs = [x0.to(x.dtype), *self._history]
        if st.corrector is not None:
            x = _combine(st.corrector[0], self._prev_x, st.corrector[1], outputs)
        x_next = _combine(st.predictor[0], x, st.predictor[1], outputs)
        self._prev_x = x
        self._history = outputs[: self._keep]
        self._next = i + 1
        return x_next


# --------------------------------------------------------------------------- reference form


class ReferenceUniPC:
    """The same sampler computed the way scheduler libraries do it in a model runner: at every
    step the sigmas become a device tensor, and lambda, h, the r_k, B(h), the D_k and the linear
    system (torch.linalg.solve, on the device) are rebuilt from it. The coefficients are float64
    tensors so that comparing with `UniPCSampler` measures the sampler, not float32 rounding of
    lambda differences; the sample arithmetic runs in x's dtype (a 0-dim float64 tensor times a
    float32 tensor is float32). Same interface as `UniPCSampler`."""

    def __init__(self, sigmas: list[float], order: int = 2, corrector: bool = True, lower_order_final: bool = True):
        self.sigmas = _check_sigmas(sigmas)
        _check_order(order)
        self.order = order
        self.corrector = corrector
        self.orders = _step_orders(self.sigmas, order, lower_order_final)
        self.reset()

    @property
    def steps(self) -> int:
        return len(self.orders)

    def reset(self) -> None:
        self._last_sample: Tensor | None = None
        self._outputs: list[Tensor] = []  # x0 predictions, oldest first
        self._next = 0

    def step(self, i: int, x: Tensor, x0: Tensor) -> Tensor:
        _check_index(i, self.steps, self._next)
        if i == 0:
            self.reset()
        x0 = x0.to(x.dtype)
        sig = torch.tensor(self.sigmas, dtype=torch.float64, device=x.device)
        alpha = 1.0 - sig
        lam = torch.log(alpha) - torch.log(sig)  # -inf at sigma 1, +inf at sigma 0
        if self.corrector and i > 0:
            # UniC: redo step i-1 -> i from the last sample with the new output x0 = m_i
            q = self.orders[i - 1]
            x = self._update(i - 1, i, self._last_sample, sig, alpha, lam, q, model_t=x0)
        self._outputs = [*self._outputs, x0][-MAX_ORDER - 1 :]
        self._last_sample = x
        self._next = i + 1
        return self._update(i, i + 1, x, sig, alpha, lam, self.orders[i], model_t=None)

    def _update(self, s: int, t: int, x: Tensor, sig: Tensor, alpha: Tensor, lam: Tensor, order: int,
                model_t: Tensor | None) -> Tensor:
        """One bh2 update from index s to t. The outputs so far end with m_s: the predictor runs
        after m_i is stored, the corrector (model_t = m_t given) before."""
        outs = self._outputs
        m0 = outs[-1]
        sigma_t, sigma_s0, alpha_t = sig[t], sig[s], alpha[t]
        h = lam[t] - lam[s]  # +inf from sigma 1 or to sigma 0
        hh = -h
        h_phi_1 = torch.expm1(hh)
        b_h = torch.expm1(hh)

        rks, d1s = [], []
        for k in range(1, order):
            idx = s - k
            if self.sigmas[idx] == 1.0:
                continue  # lambda = -inf: r_k = -inf, its term -> 0 (the limit, not a NaN from solve)
            rk = (lam[idx] - lam[s]) / h
            rks.append(rk)
            d1s.append((outs[-1 - k] - m0) / rk)
        if model_t is not None:
            rks.append(torch.ones((), dtype=torch.float64, device=x.device))
        n_full = order - 1 + int(model_t is not None)

        x_t = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0
        if not rks:
            return x_t
        if n_full == 1:
            rhos = torch.tensor([0.5], dtype=torch.float64, device=x.device)
        else:
            r = torch.stack(rks)
            rows, b = [], []
            hphi = h_phi_1 / hh - 1.0
            factorial = 1
            for k in range(1, len(rks) + 1):
                rows.append(r ** (k - 1))
                b.append(hphi * factorial / b_h)
                factorial *= k + 1
                hphi = hphi / hh - 1.0 / factorial
            rhos = torch.linalg.solve(torch.stack(rows), torch.stack(b))
        res = 0
        for j, d in enumerate(d1s):
            res = res + rhos[j] * d
        if model_t is not None:
            res = res + rhos[-1] * (model_t - m0)
        return x_t - alpha_t * b_h * res
