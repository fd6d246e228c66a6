"""vlaperf against openpi's PyTorch pi0 / pi0.5 (`PI0Pytorch`): same weights, same inputs.

openpi is not on PyPI and needs its own patched transformers 4.53.2, so vlaperf never builds
it: you construct (and load) openpi's model as you normally do, and hand the object over:

    from openpi.models_pytorch.pi0_pytorch import PI0Pytorch      # your openpi install
    theirs = PI0Pytorch(pi0_config).to("cuda")                     # + safetensors.torch.load_model(...)
    from vlaperf.compare.openpi import compare_openpi
    out = compare_openpi(theirs, "libero-pi0")
    out["equivalence"]["reference"]["rel_l2"]

What happens:
  1. theirs.state_dict() is loaded into a new vlaperf model with the strict
     vlaperf.checkpoints.load_state (names equal openpi's one to one; any missing,
     unexpected or wrongly shaped tensor is an error naming it). Unless you pass `config=`,
     the model config is `openpi_config(theirs)`: sizes from its modules' transformers
     configs, pi05, action_dim, action_horizon and max_token_len from `theirs.config`;
     dtype and device from its backbone weights. vlaperf's dtype layout for a
     dtype is openpi's (`to_bfloat16_for_selected_params`), so the copy is exact.
  2. One random observation of the workload's shapes (vlaperf.inputs) is given to both:
     to openpi as an object with the attributes its `preprocess_observation_pytorch` reads
     (vlaperf.compare.OpenpiObservation: images / image_masks dicts keyed base_0_rgb,
     left_wrist_0_rgb, right_wrist_0_rgb with float (B, 3, 224, 224) images in [-1, 1] and
     (B,) bool masks, state, tokenized_prompt, tokenized_prompt_mask, token_ar_mask=None,
     token_loss_mask=None), calling `theirs.sample_actions(device, observation, noise=noise,
     num_steps=steps)`; to vlaperf as its Observation. Same noise (B, H, action_dim) float32.
  3. Metrics as vlaperf.compare.action_metrics, openpi's actions being the reference side.

openpi's constructor wraps sample_actions in torch.compile (pytorch_compile_mode, default
"max-autotune") unless that is None, so the first call may take minutes.

Tested against a stand-in object, and against openpi's own PI0Pytorch at a reduced size on
the CPU where openpi imports (tests/test_compare_openpi.py; docs/compare.md has the run).
"""

from __future__ import annotations

import dataclasses

import torch

from vlaperf.checkpoints import EMBED, LM_HEAD, CheckpointError, load_state
from vlaperf.compare import (comparison_engine, comparison_steps, compare_vlaperf, config_from_modules,
                             to_openpi_observation)
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import Pi0Config, Pi0Model, empty_model, get_config
from vlaperf.workloads import Workload, get_workload

BACKBONE_Q = "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"
FULL_VARIANTS = ("gemma_2b", "gemma_300m")


def openpi_config(openpi_model) -> Pi0Config:
    """vlaperf's config for an openpi PI0Pytorch. Its sizes come from its modules' own transformers configs (so a
    model openpi built at another size, a reduced or patched Gemma variant included, gets the config its weights
    have); pi05, action_dim, action_horizon and max_token_len from its `config` (openpi's Pi0Config). An object
    without openpi's module tree (one that offers only `state_dict()` and `config`) is mapped by its variant names,
    which must be the full ones."""
    c = getattr(openpi_model, "config", None)
    if c is None:
        raise ValueError("the openpi model has no `config`; pass config= (a vlaperf Pi0Config or preset name)")
    pi05 = bool(getattr(c, "pi05", False))
    if hasattr(openpi_model, "paligemma_with_expert"):
        missing = [k for k in ("action_dim", "action_horizon", "max_token_len") if getattr(c, k, None) is None]
        if missing:
            raise ValueError(f"the openpi model's config has no {', '.join(missing)}; pass config=")
        return config_from_modules(openpi_model, "openpi-" + ("pi05" if pi05 else "pi0"), pi05, c.action_dim,
                                   c.action_horizon, c.max_token_len)
    variants = (getattr(c, "paligemma_variant", "gemma_2b"), getattr(c, "action_expert_variant", "gemma_300m"))
    if variants != FULL_VARIANTS:
        raise ValueError(f"openpi model uses variants {variants}; vlaperf's pi0/pi05 presets are {FULL_VARIANTS} "
                         "(pass config= with matching sizes)")
    overrides = {k: getattr(c, k) for k in ("action_dim", "action_horizon", "max_token_len") if getattr(c, k, None) is not None}
    return get_config("pi05" if pi05 else "pi0", **overrides)


def _model_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    named = dict(state)
    if EMBED in named:  # the embedding is what inference reads; the LM head is tied to it in openpi
        named[LM_HEAD] = named[EMBED]
    return named


def vlaperf_from_openpi(openpi_model, config: Pi0Config, dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> Pi0Model:
    """A vlaperf model with the openpi model's weights (strict load). dtype and device
    default to those of openpi's backbone weights."""
    state = openpi_model.state_dict()
    if BACKBONE_Q not in state:
        raise CheckpointError(f"the openpi model's state dict has no {BACKBONE_Q}: is it a PI0Pytorch?")
    dtype = dtype or state[BACKBONE_Q].dtype
    device = torch.device(device) if device is not None else state[BACKBONE_Q].device
    model = empty_model(config, device, dtype)
    try:
        load_state(model, _model_names(state))
    except CheckpointError as e:
        raise CheckpointError(f"openpi's state dict does not match vlaperf's model one to one: {e}") from None
    return model.eval().requires_grad_(False)


def _workload_for(workload: str | Workload | None, cfg: Pi0Config) -> Workload:
    if workload is None:
        workload = "libero-pi05" if cfg.pi05 else "libero-pi0"
    wl = get_workload(workload) if isinstance(workload, str) else workload
    # The model decides the action shapes; the workload the batch, images and prompt.
    return dataclasses.replace(wl, horizon=cfg.action_horizon, action_dim=cfg.action_dim)


@torch.no_grad()
def compare_openpi(openpi_model, workload: str | Workload | None = None, *, config: Pi0Config | str | None = None,
                   seed: int = 0, steps: int | None = None, levers: str | None = "best") -> dict:
    """Run openpi's model and vlaperf (reference, and the `levers` engine unless None) on the
    same weights, observation and noise. Returns {"equivalence": {"reference": metrics,
    levers: metrics}, "passed", "model", "dtype", "device", "steps", "seed",
    "workload", "actions": {"openpi", "vlaperf_reference", ...}}."""
    if isinstance(config, str):
        cfg = get_config(config)
    else:
        cfg = config or openpi_config(openpi_model)
    model = vlaperf_from_openpi(openpi_model, cfg)
    device, dtype = model.action_in_proj.weight.device, model.dtype
    wl = _workload_for(workload, cfg)
    steps = comparison_steps(steps, wl.steps)
    engine = comparison_engine(model, levers)
    obs = random_observation(wl, cfg, device, seed=seed)
    noise = random_noise(wl, cfg, device, seed=seed)

    theirs = openpi_model.sample_actions(device, to_openpi_observation(obs), noise=noise.clone(), num_steps=steps)
    equivalence, actions = compare_vlaperf(model, levers, engine, obs, noise, steps, theirs, "openpi")
    levers_info = {"spec": levers, "label": engine.name} if engine else None
    return {
        "against": "openpi",
        "model": cfg.name,
        "workload": wl.id,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
        "steps": steps,
        "seed": seed,
        "levers": levers_info,
        "equivalence": equivalence,
        "passed": all(m["passed"] for m in equivalence.values()),
        "actions": actions,
    }


__all__ = ["openpi_config", "vlaperf_from_openpi", "compare_openpi"]
