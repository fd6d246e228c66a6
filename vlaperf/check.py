"""Equivalence of an engine variant against the reference path.

Same weights, same observation, same noise; fresh random inputs for every seed (the fast
path must compute the same function on any valid input, not on one lucky draw). Metrics
on the actions: max absolute error and relative L2 error ||fast - ref|| / ||ref||.

Tolerances (on relative L2, per dtype):
  float32  1e-4   only reordering of float32 sums (fused matmuls, SDPA, batched images)
  bfloat16 3e-2   bf16 operands round at ~4e-3 per op; ten Euler steps of an 18+18-layer
                  network compound that. Measured on tiny: ~1e-3 to 8e-3 for the levers.
NaN or inf never passes.
"""

from __future__ import annotations

import torch

from vlaperf.inputs import random_noise, random_observation
from vlaperf.workloads import Workload

REL_L2_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-2}


def compare(actions: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> dict:
    """max_abs and rel_l2 of `actions` against `reference` (NaN where either holds a NaN or inf; result files
    write them as null), the tolerance of `dtype`, and whether each side is finite: a non-finite reference
    means broken weights or inputs, not a wrong variant."""
    a, r = actions.double(), reference.double()
    finite, reference_finite = bool(torch.isfinite(a).all()), bool(torch.isfinite(r).all())
    both = finite and reference_finite
    max_abs = float((a - r).abs().max()) if both else float("nan")
    rel_l2 = float((a - r).norm() / r.norm().clamp_min(1e-30)) if both else float("nan")
    tol = REL_L2_TOLERANCE[dtype]
    return {"max_abs": max_abs, "rel_l2": rel_l2, "tolerance": tol, "passed": both and rel_l2 <= tol,
            "finite": finite, "reference_finite": reference_finite}


@torch.no_grad()
def check_equivalence(model, engine, workload: Workload, seeds=(0, 1), num_steps: int | None = None,
                      rtc=None) -> dict:
    """Worst case over `seeds` of the variant's error against `model.sample_actions`. With `rtc` (an RtcConfig:
    the variant serves real-time chunking) each seed's guided call too, as a server runs it (`rtc_guidance`), and
    the result says "guided": true."""
    steps = num_steps or workload.steps
    device = model.action_in_proj.weight.device
    results = []
    for seed in seeds:
        obs = random_observation(workload, model.config, device, seed=100 + seed)
        noise = random_noise(workload, model.config, device, seed=100 + seed)
        ref = model.sample_actions(obs, noise, steps)
        out = engine.sample_actions(obs, noise, steps)
        if out.shape != ref.shape:
            raise AssertionError(f"variant {engine.name} returned shape {tuple(out.shape)}, reference {tuple(ref.shape)}")
        results.append(compare(out, ref, model.dtype))
        if rtc is not None:
            guidance = rtc_guidance(ref, rtc, steps)
            guided_ref = model.sample_actions(obs, noise, steps, guidance)
            results.append(compare(engine.sample_actions(obs, noise, steps, guidance), guided_ref, model.dtype))
    # The worst seed: a failing one first (NaN included), else the largest error.
    worst = dict(max(results, key=lambda r: (not r["passed"], r["rel_l2"] if r["rel_l2"] == r["rel_l2"] else float("inf"))))
    worst.update({"dtype": str(model.dtype).replace("torch.", ""), "seeds": len(seeds), "variant": engine.name})
    if rtc is not None:
        worst["guided"] = True
    return worst


# The call that real-time chunking's checks and `bench --rtc` run: the previous chunk's first RTC_EXECUTED actions
# executed when the observation was taken, RTC_DELAY more while the chunk is computed.
RTC_EXECUTED, RTC_DELAY = 3, 2


def rtc_executed(horizon: int) -> int:
    """The executed actions of that call for a chunk of `horizon`: RTC_EXECUTED, at most half the chunk."""
    return min(RTC_EXECUTED, horizon // 2)


def rtc_guidance(previous: torch.Tensor, rtc, num_steps: int):
    """The guidance of a call that follows `previous` (B, H, A) as a robot does: RTC_EXECUTED of its actions
    executed when the observation was taken (at most half the chunk) and RTC_DELAY more during the call, so the
    leftover is previous[:, executed:] with per-row weights, the (B, H) form a server batches."""
    from vlaperf.models.pi0 import Guidance, rtc_prefix_weights, rtc_step_weights

    B, H, A = previous.shape
    executed = rtc_executed(H)
    target = torch.zeros(B, H, A, dtype=torch.float32, device=previous.device)
    target[:, : H - executed] = previous[:, executed:].float()
    weights = rtc_prefix_weights(RTC_DELAY, min(rtc.execution_horizon, H - executed), H, rtc.schedule)
    return Guidance(target, weights.to(previous.device).expand(B, H).contiguous(),
                    rtc_step_weights(num_steps, rtc.max_guidance_weight, previous.device))


@torch.no_grad()
def check_wam_equivalence(model, engine, workload, seeds=(0, 1)) -> dict:
    """Worst case over `seeds` of a world-action engine variant against `model.generate`, on
    the actions and on the predicted video (both must pass)."""
    from vlaperf.models.wam import random_wam_inputs

    kw = workload.sampling()
    results = []
    for seed in seeds:
        obs, noise = random_wam_inputs(model.config, workload.batch, model.device, model.dtype, seed=100 + seed)
        ref_a, ref_v = model.generate(obs, noise, **kw)
        out_a, out_v = engine.generate(obs, noise, **kw)
        for name, out, ref in (("actions", out_a, ref_a), ("video", out_v, ref_v)):
            if out.shape != ref.shape:
                raise AssertionError(f"variant {engine.name} returned {name} of shape {tuple(out.shape)}, reference {tuple(ref.shape)}")
        a, v = compare(out_a, ref_a, model.dtype), compare(out_v, ref_v, model.dtype)
        results.append({**a, "video_rel_l2": v["rel_l2"], "video_max_abs": v["max_abs"], "passed": a["passed"] and v["passed"]})

    def badness(r):
        worst = max(r["rel_l2"], r["video_rel_l2"])
        return (not r["passed"], worst if worst == worst else float("inf"))

    worst = dict(max(results, key=badness))
    worst.update({"dtype": str(model.dtype).replace("torch.", ""), "seeds": len(seeds), "variant": engine.name,
                  "sparsity": workload.sparsity})
    return worst
