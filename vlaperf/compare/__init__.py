"""Compare with peers: the same pi0 / pi0.5 weights and inputs in vlaperf and in another
implementation (LeRobot 0.6, openpi's PyTorch port), and checkpoint conversion between their
file layouts. docs/compare.md is the user guide.

    vlaperf.compare.convert   convert_checkpoint(src, dst, from_layout, to_layout, preset)
    vlaperf.compare.lerobot   build LeRobot's PI0Policy / PI05Policy, copy weights, compare, time
    vlaperf.compare.openpi    compare against a user's openpi `PI0Pytorch` object
    vlaperf.compare.accelerate  accelerate_lerobot / accelerate_openpi: vlaperf's engine inside their policy objects
    vlaperf.compare.commands  `vlaperf compare`, `vlaperf convert` and `vlaperf lerobot-eval`

This module holds what they share: the equivalence metrics (overall and per action
dimension), the observation in openpi's attribute layout, and the model config read from an
openpi-layout model's own module configs (LeRobot's pi0 is a port of openpi's). Nothing here
imports LeRobot or openpi.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from vlaperf.check import REL_L2_TOLERANCE, compare
from vlaperf.inputs import IMAGE_SLOTS, Observation


def action_metrics(actions: Tensor, reference: Tensor, dtype: torch.dtype) -> dict:
    """How far `actions` are from `reference` (both (B, H, A)): vlaperf.check.compare overall
    (max_abs, rel_l2, tolerance, passed), plus the same two numbers per action dimension.

    Per dimension d: max |a - r| over batch and horizon, and ||a[..., d] - r[..., d]|| /
    ||r[..., d]||. Every dimension the model outputs is reported, padded ones included (both
    models compute them from the same weights, so they must agree too); `worst_dim` is the
    dimension with the largest relative error.
    """
    if actions.shape != reference.shape:
        raise ValueError(f"action shapes differ: {tuple(actions.shape)} vs reference {tuple(reference.shape)}")
    out = compare(actions, reference, dtype)
    a, r = actions.double().flatten(0, -2), reference.double().flatten(0, -2)  # (B*H, A)
    diff = a - r
    max_abs = diff.abs().amax(dim=0)
    rel = diff.norm(dim=0) / r.norm(dim=0).clamp_min(1e-30)
    out["per_dim"] = {"max_abs": [float(x) for x in max_abs], "rel_l2": [float(x) for x in rel]}
    finite = torch.isfinite(rel)
    out["worst_dim"] = int(torch.where(finite, rel, torch.inf).argmax()) if rel.numel() else None
    out["dtype"] = str(dtype).replace("torch.", "")
    return out


def comparison_steps(steps, default: int) -> int:
    """The denoise steps a comparison runs: the workload's unless given, checked before any peer runs (openpi's
    and LeRobot's loops are a `while` on the time, so a count below 1 would never end there)."""
    from vlaperf.models.pi0 import check_num_steps

    return check_num_steps(default if steps is None else steps, "steps")


def comparison_engine(model, levers: str | None):
    """The engine variant compared beside vlaperf's reference (None for the reference alone), built before the
    peer runs: a wrong lever list is refused at once, not after the peer's call (minutes where it compiles)."""
    from vlaperf.cli import CliError, make_engine

    if not levers or levers in ("reference", "none"):
        return None
    try:
        return make_engine(model, levers)
    except CliError as e:
        raise ValueError(str(e)) from None


def timed_first_call(fn, device, first_calls: dict | None, name: str):
    """fn()'s result; with `first_calls`, its synchronized wall seconds stored there under `name`. The comparison's
    calls are each path's first in the process (the engine's compile and graph capture included), so a timing
    that follows reports them as the first calls: its own warm-up's first call is then a warm one."""
    from vlaperf.timing import synchronize

    if first_calls is None:
        return fn()
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    first_calls[name] = time.perf_counter() - start
    return out


def compare_vlaperf(model, levers: str | None, engine, obs: Observation, noise: Tensor, steps: int, theirs: Tensor,
                    peer: str, first_calls: dict | None = None) -> tuple[dict, dict]:
    """vlaperf's reference (and `engine`, the variant `levers` from comparison_engine, if any) against a peer's
    actions on the same observation and noise. Returns (equivalence per variant, actions); with `first_calls`, each
    vlaperf call's seconds go there under its actions' key (timed_first_call)."""
    dtype = model.dtype
    device = obs.state.device
    ours = timed_first_call(lambda: model.sample_actions(obs, noise, steps), device, first_calls, "vlaperf_reference")
    equivalence = {"reference": action_metrics(ours, theirs.float(), dtype)}
    actions = {peer: theirs, "vlaperf_reference": ours}
    if engine is not None:
        fast = timed_first_call(lambda: engine.sample_actions(obs, noise, steps), device, first_calls,
                                "vlaperf_" + levers)
        equivalence[levers] = action_metrics(fast, theirs.float(), dtype)
        actions["vlaperf_" + levers] = fast
    return equivalence, actions


def _rope_base(hf_config) -> float:
    """transformers 5 keeps the RoPE base in `rope_parameters`, earlier releases in `rope_theta`."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(hf_config, "rope_theta", 10_000.0))


def _gemma_config(hf_config):
    from vlaperf.models.pi0 import GemmaConfig

    c = hf_config
    return GemmaConfig(width=c.hidden_size, depth=c.num_hidden_layers, mlp_dim=c.intermediate_size,
                       num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                       vocab_size=c.vocab_size, eps=float(c.rms_norm_eps), rope_base=_rope_base(c))


def config_from_modules(core, name: str, pi05: bool, action_dim: int, horizon: int, max_token_len: int):
    """vlaperf's Pi0Config for an openpi-layout model `core` (openpi's PI0Pytorch, LeRobot's port of it), its sizes
    read from its modules' own transformers configs (PaliGemma's text and vision configs, the expert's), so a model
    of any size its owner built, a reduced one included, gets the config that matches its weights; the action and
    prompt sizes, which those configs do not hold, are given."""
    from vlaperf.models.pi0 import Pi0Config, VisionConfig

    pwe = core.paligemma_with_expert
    text, vision = pwe.paligemma.config.text_config, pwe.paligemma.config.vision_config
    tower = VisionConfig(width=vision.hidden_size, depth=vision.num_hidden_layers, mlp_dim=vision.intermediate_size,
                         num_heads=vision.num_attention_heads, patch_size=vision.patch_size,
                         image_size=vision.image_size, eps=float(vision.layer_norm_eps))
    return Pi0Config(name, tower, _gemma_config(text), _gemma_config(pwe.gemma_expert.config), pi05=pi05,
                     action_dim=action_dim, action_horizon=horizon, max_token_len=max_token_len)


def tolerance_for(dtype: torch.dtype) -> float:
    return REL_L2_TOLERANCE[dtype]


@dataclass
class OpenpiObservation:
    """An observation with the attributes openpi's PyTorch `sample_actions` reads.

    openpi's `preprocess_observation_pytorch` reads `images` and `image_masks` (dicts keyed
    base_0_rgb / left_wrist_0_rgb / right_wrist_0_rgb), `state`, `tokenized_prompt`,
    `tokenized_prompt_mask`, and passes `token_ar_mask` / `token_loss_mask` through (None for
    pi0 and pi0.5). Images are float (B, 3, H, W) in [-1, 1]; openpi resizes them with
    padding only if they are not already 224 x 224.
    """

    images: dict[str, Tensor]
    image_masks: dict[str, Tensor]
    state: Tensor
    tokenized_prompt: Tensor
    tokenized_prompt_mask: Tensor
    token_ar_mask: Tensor | None = None
    token_loss_mask: Tensor | None = None


def to_openpi_observation(obs: Observation) -> OpenpiObservation:
    """vlaperf's Observation (image slots stacked on axis 1) -> openpi's attribute layout."""
    slots = obs.images.shape[1]
    if slots != len(IMAGE_SLOTS):
        raise ValueError(f"openpi expects {len(IMAGE_SLOTS)} image slots {IMAGE_SLOTS}, the observation has {slots}")
    return OpenpiObservation(
        images={name: obs.images[:, s] for s, name in enumerate(IMAGE_SLOTS)},
        image_masks={name: obs.image_mask[:, s] for s, name in enumerate(IMAGE_SLOTS)},
        state=obs.state,
        tokenized_prompt=obs.tokens,
        tokenized_prompt_mask=obs.token_mask,
    )


def from_openpi_observation(observation) -> Observation:
    """openpi's attribute layout -> vlaperf's Observation (absent masks mean valid, as in openpi)."""
    missing = [k for k in IMAGE_SLOTS if k not in observation.images]
    if missing:
        raise ValueError(f"images dict missing keys {missing}: expected {IMAGE_SLOTS}, got {list(observation.images)}")
    B = observation.state.shape[0]
    device = observation.state.device
    masks = [observation.image_masks.get(k, torch.ones(B, dtype=torch.bool, device=device)) for k in IMAGE_SLOTS]
    return Observation(
        images=torch.stack([observation.images[k] for k in IMAGE_SLOTS], dim=1),
        image_mask=torch.stack(masks, dim=1),
        tokens=observation.tokenized_prompt,
        token_mask=observation.tokenized_prompt_mask,
        state=observation.state,
    )


__all__ = ["action_metrics", "tolerance_for", "config_from_modules", "OpenpiObservation", "to_openpi_observation", "from_openpi_observation"]
