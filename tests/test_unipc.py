"""UniPC (vlaperf.models.unipc): the schedule, the math (Euler at order 1, convergence on an
analytic Gaussian problem, the limits at the schedule's ends), the agreement of the host-planned
sampler with the reference form, traceability, and argument errors."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from vlaperf.models.unipc import (
    ReferenceUniPC,
    UniPCSampler,
    UniPCStep,
    flow_sigmas,
    unipc_plan,
    x0_from_velocity,
)

F64 = torch.float64


# --------------------------------------------------------------------------- helpers


def gaussian_x0(x: torch.Tensor, sigma: float, mu: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """E[x0 | x_sigma] for x0 ~ N(mu, s^2) per coordinate, x_sigma = (1 - sigma) x0 + sigma eps."""
    a = 1.0 - sigma
    return mu + a * s**2 / (a**2 * s**2 + sigma**2) * (x - a * mu)


def sample(sampler, sigmas: list[float], x: torch.Tensor, model) -> torch.Tensor:
    for i in range(len(sigmas) - 1):
        x = sampler.step(i, x, model(x, sigmas[i]))
    return x


def euler(sigmas: list[float], x: torch.Tensor, model) -> torch.Tensor:
    """Euler on the velocity v = (x - x0) / sigma."""
    for i in range(len(sigmas) - 1):
        v = (x - model(x, sigmas[i])) / sigmas[i]
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def all_coefficients(plan: list[UniPCStep]) -> list[float]:
    out = []
    for st in plan:
        for c in (st.corrector, st.predictor):
            if c is not None:
                out += [c[0], *c[1]]
    return out


# --------------------------------------------------------------------------- 1. flow_sigmas


@pytest.mark.parametrize("steps", [1, 2, 10, 37])
@pytest.mark.parametrize("shift", [0.25, 1.0, 3.0])
def test_flow_sigmas(steps, shift):
    sig = flow_sigmas(steps, shift)
    assert len(sig) == steps + 1 and all(type(s) is float for s in sig)
    assert sig[0] == 1.0 and sig[-1] == 0.0
    assert all(a > b for a, b in itertools.pairwise(sig))
    for i, s in enumerate(sig):
        t = 1.0 - i / steps
        assert s == pytest.approx(shift * t / (1.0 + (shift - 1.0) * t), abs=1e-15)


@pytest.mark.parametrize("shift", [0.1, 0.2, 0.3])
def test_flow_sigmas_ends_are_exact_where_the_formula_rounds(shift):
    """For these shifts 1 + (shift - 1) is not shift in floats, so the formula gives 1 +- an ulp at t = 1: the
    schedule still starts at exactly 1 (pure noise) and a plan takes it (a sigma above 1 is refused)."""
    assert shift / (1.0 + (shift - 1.0)) != 1.0  # the rounding this is about
    sig = flow_sigmas(5, shift)
    assert sig[0] == 1.0 and sig[-1] == 0.0
    assert len(unipc_plan(sig)) == 5


def test_flow_sigmas_shift_one_is_uniform_and_shift_moves_steps_to_high_noise():
    assert flow_sigmas(4) == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert flow_sigmas(4, 3.0)[2] == pytest.approx(0.75)  # 3 * 0.5 / (1 + 2 * 0.5)


@pytest.mark.parametrize("steps", [0, -3, 2.0, True, None])
def test_flow_sigmas_bad_steps(steps):
    with pytest.raises(ValueError, match="steps"):
        flow_sigmas(steps)


@pytest.mark.parametrize("shift", [0.0, -1.0, math.nan, math.inf, "3"])
def test_flow_sigmas_bad_shift(shift):
    with pytest.raises(ValueError, match="shift"):
        flow_sigmas(4, shift)


@pytest.mark.parametrize("steps,shift", [(10, 1e15), (2, 1e17), (1000, 1e15)])
def test_flow_sigmas_refuses_a_shift_whose_sigmas_coincide(steps, shift):
    """A shift this far from 1 rounds neighbouring sigmas to 1.0: the error names shift and steps, not a list of
    steps + 1 sigmas from the plan's check (what generate(shift=1e15) raised before)."""
    with pytest.raises(ValueError, match=re.escape(f"shift {shift!r} is too far from 1 for {steps} steps")):
        flow_sigmas(steps, shift)
    assert len(flow_sigmas(2, 1e15)) == 3  # the same shift with fewer steps is a valid schedule


def test_x0_from_velocity():
    torch.manual_seed(0)
    x0, eps = torch.randn(3, 5, dtype=F64), torch.randn(3, 5, dtype=F64)
    sigma = torch.rand(3, 1, dtype=F64)
    x = (1 - sigma) * x0 + sigma * eps
    torch.testing.assert_close(x0_from_velocity(x, eps - x0, sigma), x0, rtol=0, atol=1e-14)
    torch.testing.assert_close(x0_from_velocity(x, eps - x0, 0.0), x, rtol=0, atol=0)


# --------------------------------------------------------------------------- 2. order 1 is Euler


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_order1_without_corrector_is_euler(shift):
    torch.manual_seed(1)
    a = torch.randn(6, 6, dtype=F64) / 3
    c = torch.randn(6, dtype=F64)

    def model(x, sigma):  # a random linear velocity model, as an x0 prediction
        return x0_from_velocity(x, x @ a + sigma * c, sigma)

    sig = flow_sigmas(7, shift)
    x = torch.randn(4, 6, dtype=F64)
    want = euler(sig, x, model)
    for sampler in (UniPCSampler(unipc_plan(sig, order=1, corrector=False)),
                    ReferenceUniPC(sig, order=1, corrector=False)):
        torch.testing.assert_close(sample(sampler, sig, x, model), want, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- 3. accuracy


# Each coordinate has its own data scale s, spread over a band (and its own mu). The error of one
# scale alone crosses zero as the steps change (the final order-1 step to sigma 0, x_N = m_{N-1},
# shrinks towards mu while the earlier steps overshoot), which makes single-(mu, s) ratios erratic
# (an error can even grow from 10 to 20 steps); the max over a band is steadier. Measured max abs
# errors (256 coordinates, eps ~ N(0, 1); printed by the test with -s), Euler vs UniPC-2 + UniC:
#   s in [0.5, 0.8], shift 1:  10 steps 2.51e-1 vs 3.24e-2 (7.7x)   20: 1.29e-1 vs 1.21e-2 (10.7x)   40: 6.57e-2 vs 3.14e-3
#   s in [0.5, 0.8], shift 3:  10 steps 4.12e-1 vs 2.39e-1 (1.7x)   20: 2.15e-1 vs 3.15e-2 (6.8x)    40: 1.10e-1 vs 1.04e-2
#   s in [1.5, 2.5], shift 1:  10 steps 8.87e-1 vs 4.51e-2 (19.7x)  20: 4.59e-1 vs 1.07e-2 (43x)     40: 2.33e-1 vs 2.49e-3
#   s in [1.5, 2.5], shift 3:  10 steps 7.72e-1 vs 1.03e-1 (7.5x)   20: 3.98e-1 vs 3.63e-2 (11.0x)   40: 2.02e-1 vs 9.36e-3
# UniPC's 10 -> 20 drop is 2.7x, 7.6x, 4.2x, 2.8x (pre-asymptotic: both ends of the schedule take
# order-1 steps, so the asymptotic rate is 2, i.e. 4x, reached by 40 -> 80: 4.3x, 2.5x, 4.2x, 4.3x);
# 10 -> 40 is 10x to 23x (Euler: 3.8x). At shift 3 and s < 1 the last step, from sigma 0.25 and
# the same for both solvers, dominates at 10 steps: the gap to Euler is smallest there.
GAUSS_CASES = {  # (s band, shift): min Euler/UniPC error ratio at 10 and at 20 steps
    ((0.5, 0.8), 1.0): (5.0, 7.0),
    ((0.5, 0.8), 3.0): (1.3, 4.5),
    ((1.5, 2.5), 1.0): (12.0, 25.0),
    ((1.5, 2.5), 3.0): (5.0, 7.0),
}


def gaussian_errors(band: tuple[float, float], shift: float, steps: int, order: int = 2) -> tuple[float, float]:
    """Max abs errors of Euler and of UniPC (with corrector) against the exact ODE solution."""
    n = 256
    g = torch.Generator().manual_seed(7)
    s = torch.linspace(*band, n, dtype=F64)
    mu = torch.empty(n, dtype=F64).uniform_(-1.0, 1.0, generator=g)
    eps = torch.randn(n, dtype=F64, generator=g)

    def model(x, sigma):
        return gaussian_x0(x, sigma, mu, s)

    exact = mu + s * eps  # the probability-flow ODE maps eps to mu + s eps
    sig = flow_sigmas(steps, shift)
    e_euler = (euler(sig, eps, model) - exact).abs().max().item()
    e_unipc = (sample(UniPCSampler(unipc_plan(sig, order=order)), sig, eps, model) - exact).abs().max().item()
    return e_euler, e_unipc


@pytest.mark.parametrize("case", list(GAUSS_CASES), ids=lambda c: f"s{c[0][0]}-{c[0][1]}_shift{c[1]:g}")
def test_gaussian_unipc2_beats_euler_and_converges(case):
    band, shift = case
    min_ratio10, min_ratio20 = GAUSS_CASES[case]
    (eu10, un10), (eu20, un20), (eu40, un40) = (gaussian_errors(band, shift, n) for n in (10, 20, 40))
    print(f"\ns in {band}, shift {shift:g}: Euler {eu10:.2e} {eu20:.2e} {eu40:.2e} | "
          f"UniPC-2 {un10:.2e} {un20:.2e} {un40:.2e} (10, 20, 40 steps)")
    assert eu10 / eu20 == pytest.approx(2.0, rel=0.1) and eu20 / eu40 == pytest.approx(2.0, rel=0.1)  # Euler: order 1
    assert eu10 / un10 >= min_ratio10
    assert eu20 / un20 >= min_ratio20
    assert un10 / un20 >= 2.3  # measured 2.7 .. 7.6
    assert un20 / un40 >= 2.5  # measured 3.0 .. 4.3
    assert un10 / un40 >= 8.0  # measured 10 .. 23 (order 2: 16; Euler 3.8)


def test_gaussian_exact_for_constant_data():
    """s = 0: the x0 prediction is the constant mu; every order integrates that exactly."""
    mu = torch.linspace(-2, 2, 9, dtype=F64)
    eps = torch.randn(9, dtype=F64, generator=torch.Generator().manual_seed(0))
    sig = flow_sigmas(6, 3.0)
    for order in (1, 2, 3):
        for corrector in (False, True):
            out = sample(UniPCSampler(unipc_plan(sig, order, corrector)), sig, eps, lambda x, _s: mu + 0 * x)
            torch.testing.assert_close(out, mu, rtol=0, atol=1e-14)


@pytest.mark.parametrize("s", [0.7, 1.5])
def test_convergence_orders_on_an_interior_schedule(s):
    """Away from the singular ends (sigma 0.95 -> 0.05, no lower_order_final) UniPC-p with UniC
    converges with order p + 1 for p = 1, 2 and order 1 without it is first order; measured log2 error
    ratios at 40 -> 80 steps (s 0.7 / 1.5): o1 0.99 / 0.99, o1+c 1.94 / 1.98, o2+c 2.92 / 2.93,
    o3+c 3.81 / 3.88 (this checks the rho solves; without the corrector the order-1 first step
    caps orders 2 and 3 at 2). o3+c's ~3.8 is not its limit: its first step (UniP-1 + UniC-1) is
    third order locally, so with many more steps the rate falls towards 3 (at s 1.5 it fell from 3.88 to 3.68
    between 40 and 1280 steps); the bounds hold at these counts, and the next test pins each order alone."""
    mu, sd = torch.tensor([0.5], dtype=F64), torch.tensor([s], dtype=F64)
    a, b = 0.95, 0.05
    x_a = torch.tensor([0.7], dtype=F64)

    def rho(sg):
        return math.sqrt((1 - sg) ** 2 * s * s + sg * sg)

    exact = (1 - b) * 0.5 + rho(b) / rho(a) * (0.7 - (1 - a) * 0.5)  # the exact flow from x_a at sigma a

    def err(order, corrector, n):
        sig = [a + (b - a) * i / n for i in range(n + 1)]
        sampler = UniPCSampler(unipc_plan(sig, order, corrector, lower_order_final=False))
        return abs(sample(sampler, sig, x_a, lambda x, sg: gaussian_x0(x, sg, mu, sd)).item() - exact)

    for (order, corrector), (lo, hi) in {(1, False): (0.9, 1.1), (1, True): (1.75, 2.3),
                                         (2, True): (2.65, 3.3), (3, True): (3.5, 4.4)}.items():
        rate = math.log2(err(order, corrector, 40) / err(order, corrector, 80))
        assert lo <= rate <= hi, (order, corrector, rate)


def test_local_truncation_order_of_each_predictor_and_corrector():
    """One step of each coefficient set of a plan, fed the exact ODE solution (x_s and every m_k on
    the exact trajectory, and for UniC the exact m_t): UniP-p's local error is O(h^(p+1)) and
    UniC-q's O(h^(q+2)). The global rates above mix the warm-up's lower orders into each run (order
    3 without the corrector is second order there); this pins the six sets one by one, at sigma 0.5
    of a schedule uniform in sigma (so the r_k are not the uniform-lambda -1, -2). Measured log2
    error ratios at 40 -> 80 steps: UniP-1/2/3 1.99, 3.01, 4.16; UniC-1/2/3 3.00, 3.99, 4.99. A wrong b_3
    (3! taken as 4, in both forms: only UniC-3 solves a 3 x 3 system) passes every other test of this file
    and fails here (UniC-3 at 4.43)."""
    n = 32
    g = torch.Generator().manual_seed(0)
    s = torch.linspace(0.5, 2.0, n, dtype=F64)
    mu = torch.empty(n, dtype=F64).uniform_(-1.0, 1.0, generator=g)
    x_a = torch.randn(n, dtype=F64, generator=g)
    a, b = 0.9, 0.1

    def x_exact(sg):  # the probability-flow ODE through x_a at sigma a (see the interior test above)
        rho = torch.sqrt((1 - sg) ** 2 * s * s + sg * sg)
        rho_a = torch.sqrt((1 - a) ** 2 * s * s + a * a)
        return (1 - sg) * mu + rho / rho_a * (x_a - (1 - a) * mu)

    def m_exact(sg):
        return gaussian_x0(x_exact(sg), sg, mu, s)

    def errors(order, steps):
        sig = [a + (b - a) * k / steps for k in range(steps + 1)]
        plan = unipc_plan(sig, order, corrector=True, lower_order_final=False)
        i = steps // 2  # the step from sigma 0.5, whatever the count
        c_x, w = plan[i].predictor  # x_{i+1} from x_i and m_i, m_{i-1}, ..
        pred = c_x * x_exact(sig[i]) + sum(wk * m_exact(sig[i - k]) for k, wk in enumerate(w))
        c_x, w = plan[i + 1].corrector  # x_{i+1} again from x_i and m_{i+1}, m_i, ..
        corr = c_x * x_exact(sig[i]) + sum(wk * m_exact(sig[i + 1 - k]) for k, wk in enumerate(w))
        assert len(plan[i].predictor[1]) == order and len(plan[i + 1].corrector[1]) == order + 1
        want = x_exact(sig[i + 1])
        return (pred - want).abs().max().item(), (corr - want).abs().max().item()

    for order in (1, 2, 3):
        (p40, c40), (p80, c80) = errors(order, 40), errors(order, 80)
        rate_p, rate_c = math.log2(p40 / p80), math.log2(c40 / c80)
        assert order + 1 - 0.25 <= rate_p <= order + 1 + 0.35, (order, "UniP", rate_p)
        assert order + 2 - 0.25 <= rate_c <= order + 2 + 0.35, (order, "UniC", rate_c)


# --------------------------------------------------------------------------- 4. plan == reference


def nonlinear_model(dtype):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(16, 16, generator=g) / 4).to(dtype)
    b = (torch.randn(16, generator=g) / 4).to(dtype)

    def model(x, sigma):
        return (1 - sigma) * torch.tanh(x @ w + b) + 0.3 * sigma * x

    return model


def analytic_model(dtype):
    mu = torch.linspace(-1, 1, 16).to(dtype)
    s = torch.linspace(0.4, 2.5, 16).to(dtype)
    return lambda x, sigma: gaussian_x0(x, sigma, mu, s)


@pytest.mark.parametrize("model_name", ["analytic", "nonlinear"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (F64, 1e-12)], ids=["fp32", "fp64"])
def test_sampler_matches_reference(model_name, dtype, tol):
    model = (analytic_model if model_name == "analytic" else nonlinear_model)(dtype)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    worst = 0.0
    for steps, shift in ((12, 3.0), (5, 1.0), (2, 1.0)):
        sig = flow_sigmas(steps, shift)
        for order in (1, 2, 3):
            for corrector in (False, True):
                for lof in (False, True):
                    fast = sample(UniPCSampler(unipc_plan(sig, order, corrector, lof)), sig, x, model)
                    ref = sample(ReferenceUniPC(sig, order, corrector, lof), sig, x, model)
                    assert fast.dtype == ref.dtype == dtype
                    err = rel_err(fast, ref)
                    worst = max(worst, err)
                    assert err <= tol, (steps, shift, order, corrector, lof, err)
    print(f"\n{model_name} {dtype}: worst relative difference {worst:.1e}")


def test_sampler_matches_reference_on_a_schedule_not_starting_at_one():
    """sigma_0 < 1 (no lambda = -inf): the general path of both forms."""
    sig = [0.999] + flow_sigmas(9, 3.0)[1:]
    model = nonlinear_model(F64)
    x = torch.randn(4, 16, dtype=F64, generator=torch.Generator().manual_seed(6))
    for order in (1, 2, 3):
        fast = sample(UniPCSampler(unipc_plan(sig, order)), sig, x, model)
        ref = sample(ReferenceUniPC(sig, order), sig, x, model)
        assert rel_err(fast, ref) <= 1e-12


def test_host_solver_pivots_on_the_largest_entry():
    """The plans' small systems are solved on the host by Gaussian elimination with partial pivoting: a zero or
    tiny leading entry is no singular system, and the answers agree with LAPACK's (torch.linalg.solve)."""
    from vlaperf.models.unipc import _solve

    systems = [
        ([[0.0, 1.0], [-1.0, 1.0]], [1.0, 0.0]),  # a zero first pivot, the other row's entry negative
        ([[1e-20, 1.0], [1.0, 1.0]], [1.0, 2.0]),  # a tiny first pivot: without a row swap x_0 is lost
        ([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0], [-3.0, 1.0, 4.0]], [1.0, 2.0, 3.0]),
        ([[1.0, 1.0, 1.0], [-0.5, 1.0, 2.0], [0.25, 1.0, 4.0]], [0.3, -0.2, 0.7]),  # Vandermonde, as in a plan
    ]
    for a, b in systems:
        want = torch.linalg.solve(torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64))
        got = torch.tensor(_solve(a, b), dtype=F64)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="singular UniPC system"):
        _solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 1.0])


def test_plan_shape_and_orders():
    sig = flow_sigmas(6)
    plan = unipc_plan(sig, order=3)
    assert len(plan) == 6
    assert [st.sigma for st in plan] == sig[:-1] and [st.sigma_next for st in plan] == sig[1:]
    assert plan[0].corrector is None and all(st.corrector is not None for st in plan[1:])
    # predictor order p uses p outputs, the corrector of step i (step i-1's order q) q + 1
    assert [len(st.predictor[1]) for st in plan] == [1, 2, 3, 3, 2, 1]
    assert [len(st.corrector[1]) for st in plan[1:]] == [2, 3, 4, 4, 3]
    assert [len(st.predictor[1]) for st in unipc_plan(sig, 3, lower_order_final=False)] == [1, 2, 3, 3, 3, 1]
    assert all(st.corrector is None for st in unipc_plan(sig, corrector=False))


# --------------------------------------------------------------------------- 5. the ends of the schedule


def test_plan_coefficients_finite_everywhere():
    for steps in range(1, 8):
        for shift in (1.0, 3.0):
            sig = flow_sigmas(steps, shift)
            for order in (1, 2, 3):
                for corrector in (False, True):
                    for lof in (False, True):
                        coefs = all_coefficients(unipc_plan(sig, order, corrector, lof))
                        assert all(math.isfinite(c) for c in coefs), (steps, shift, order, corrector, lof)


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("lof", [True, False])
def test_last_step_returns_the_x0_prediction(order, lof):
    sig = flow_sigmas(6, 3.0)
    plan = unipc_plan(sig, order, lower_order_final=lof)
    assert plan[-1].predictor == (0.0, (1.0,))  # the limit at sigma 0: sigma_t / sigma_s = 0, alpha_t (1 - e^-h) = 1
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 8, generator=g)
    for sampler in (UniPCSampler(plan), ReferenceUniPC(sig, order, lower_order_final=lof)):
        for i in range(len(plan)):
            m = torch.randn(3, 8, generator=g)
            x = sampler.step(i, x, m)
        assert torch.equal(x, m)


def test_first_corrector_limit():
    """Step 1 corrects step 0 (from sigma 1, h = inf): with rho = 1/2 and B(h) -> -1 that is
    x_1 = sigma_1 x_0 + alpha_1 (m_0 + m_1) / 2, the trapezoid in sigma."""
    sig = flow_sigmas(5)
    c = unipc_plan(sig)[1].corrector
    a1 = 1 - sig[1]
    assert c[0] == pytest.approx(sig[1], abs=1e-15)
    assert c[1] == pytest.approx((a1 / 2, a1 / 2), abs=1e-15)


@pytest.mark.parametrize("order", [2, 3])
def test_sigma_one_is_the_limit_of_sigma_below_one(order):
    """The explicit limit at sigma_0 = 1 (the output there drops out of the multistep terms):
    plans for sigma_0 = 1 - d approach it as d -> 0 (slowly: lambda_0 ~ log d)."""
    base = flow_sigmas(8, 3.0)
    at_one = all_coefficients(unipc_plan(base, order))
    dists = []
    for d in (1e-2, 1e-4, 1e-8, 1e-15):
        near = all_coefficients(unipc_plan([1.0 - d] + base[1:], order))
        dists.append(max(abs(a - b) for a, b in zip(at_one, near)))
    assert all(a > b for a, b in itertools.pairwise(dists)), dists
    assert dists[-1] < dists[0] / 10, dists


# --------------------------------------------------------------------------- 6. capture / tracing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_step_makes_no_host_sync_and_graph_captures_on_cuda():
    sig = flow_sigmas(10, 3.0)
    plan = unipc_plan(sig, order=3)
    dev = torch.device("cuda")
    x0 = torch.randn(8, 64, device=dev)

    def run(sampler, x):
        for i in range(len(plan)):
            x = sampler.step(i, x, torch.tanh(x) * (1 - sig[i]))
        return x

    want = run(UniPCSampler(plan), x0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(UniPCSampler(plan), x0)  # raises on any synchronizing call
    finally:
        torch.cuda.set_sync_debug_mode("default")

    # the whole loop captured in one CUDA graph and replayed on new input
    sampler, static_in = UniPCSampler(plan), x0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(sampler, static_in)  # warm up off the default stream, as capture wants
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run(sampler, static_in)
    x1 = torch.randn(8, 64, device=dev)
    static_in.copy_(x1)
    graph.replay()
    torch.testing.assert_close(static_out, run(UniPCSampler(plan), x1), rtol=0, atol=0)
    torch.testing.assert_close(run(UniPCSampler(plan), x0), want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampler_matches_reference_on_cuda():
    sig = flow_sigmas(12, 3.0)
    model = nonlinear_model(torch.float32)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5))
    cpu = sample(UniPCSampler(unipc_plan(sig, 3)), sig, x, model)

    def cuda_model(x, sigma):
        return model(x.cpu(), sigma).cuda()

    for order in (1, 2, 3):
        fast = sample(UniPCSampler(unipc_plan(sig, order)), sig, x.cuda(), cuda_model)
        ref = sample(ReferenceUniPC(sig, order), sig, x.cuda(), cuda_model)
        assert fast.is_cuda and ref.is_cuda
        assert rel_err(fast.cpu(), ref.cpu()) <= 1e-6
    assert rel_err(fast.cpu(), cpu) <= 1e-6


def test_step_traces_under_torch_compile_fullgraph():
    """fullgraph=True: the loop of steps (with the sampler's history) traces without a graph
    break. aot_eager traces through AOTAutograd like inductor but skips its C++ compile (which
    takes ~20 s on a CPU)."""
    torch._dynamo.reset()
    sig = flow_sigmas(4, 3.0)
    plan = unipc_plan(sig, order=3)

    def run(sampler, x):
        for i in range(len(plan)):
            x = sampler.step(i, x, torch.tanh(x) * (1 - sig[i]))
        return x

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(UniPCSampler(plan), x), run(UniPCSampler(plan), x), rtol=0, atol=0)
    step = torch.compile(UniPCSampler(plan).step, fullgraph=True, backend="aot_eager")
    y = x
    for i in range(len(plan)):
        y = step(i, y, torch.tanh(y) * (1 - sig[i]))
    torch.testing.assert_close(y, run(UniPCSampler(plan), x), rtol=0, atol=0)


# --------------------------------------------------------------------------- 7. bad input


@pytest.mark.parametrize("order", [0, 4, -1, 2.0, True])
def test_bad_order(order):
    with pytest.raises(ValueError, match="order must be an integer in 1..3"):
        unipc_plan(flow_sigmas(4), order=order)
    with pytest.raises(ValueError, match="order must be an integer in 1..3"):
        ReferenceUniPC(flow_sigmas(4), order=order)


@pytest.mark.parametrize("sigmas,msg", [([1.0], "at least 2"), ([], "at least 2"),
                                        ([1.0, 0.5, 0.5, 0.0], "strictly decreasing"),
                                        ([0.0, 0.5, 1.0], "strictly decreasing"),
                                        ([1.5, 0.5, 0.0], r"\[0, 1\]"), ([1.0, math.nan, 0.0], r"\[0, 1\]")])
def test_bad_sigmas(sigmas, msg):
    with pytest.raises(ValueError, match=msg):
        unipc_plan(sigmas)
    with pytest.raises(ValueError, match=msg):
        ReferenceUniPC(sigmas)


def test_bad_plan():
    with pytest.raises(ValueError, match="at least one step"):
        UniPCSampler([])
    a, b = unipc_plan(flow_sigmas(4)), unipc_plan(flow_sigmas(6))
    with pytest.raises(ValueError, match="do not chain"):
        UniPCSampler(a[:2] + b[2:])  # a plan spliced from two schedules of other lengths
    with pytest.raises(ValueError, match="plan\\[0\\] has a corrector"):
        UniPCSampler(a[1:])
    with pytest.raises(TypeError, match="not a UniPCStep"):
        UniPCSampler([(1.0, 0.0)])
    # step 1 has two outputs (m_1, m_0): a third weight (the predictor's or the corrector's) would read past them
    from dataclasses import replace

    plan = unipc_plan(flow_sigmas(6), order=3)
    st = plan[1]
    assert len(st.predictor[1]) == len(st.corrector[1]) == 2
    for bad in (replace(st, predictor=(st.predictor[0], (*st.predictor[1], 0.1))),
                replace(st, corrector=(st.corrector[0], (*st.corrector[1], 0.1)))):
        with pytest.raises(ValueError, match=r"plan\[1\] uses more outputs than exist at step 1"):
            UniPCSampler([plan[0], bad, *plan[2:]])


@pytest.mark.parametrize("form", ["plan", "reference"])
def test_bad_step_index(form):
    sig = flow_sigmas(4)
    sampler = UniPCSampler(unipc_plan(sig)) if form == "plan" else ReferenceUniPC(sig)
    x = torch.zeros(2, 3)
    for i in (-1, 4, 10):
        with pytest.raises(ValueError, match=r"step index must be an integer in 0\.\.3"):
            sampler.step(i, x, x)
    sampler.step(0, x, x)
    with pytest.raises(ValueError, match="expected step 1"):
        sampler.step(2, x, x)  # skipping a step would use the wrong history
    sampler.step(1, x, x)
    sampler.step(0, x, x)  # step 0 starts a new call
    sampler.reset()
    with pytest.raises(ValueError, match="expected step 0"):
        sampler.step(1, x, x)
