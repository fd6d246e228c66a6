"""vlaperf against LeRobot 0.6's pi0 / pi0.5: same weights, same inputs, same noise.

    from vlaperf.compare.lerobot import compare_lerobot, time_lerobot
    run = compare_lerobot("libero-pi0", device="cuda", dtype=torch.bfloat16)
    run["equivalence"]["reference"]        # vlaperf's reference vs LeRobot: max_abs, rel_l2, per_dim ...
    timing = time_lerobot(run)               # LeRobot eager (+ compiled) vs vlaperf, interleaved

What it drives, as read in LeRobot 0.6.1's source (policies/pi0/modeling_pi0.py,
pi05/modeling_pi05.py, pi_gemma.py, common/):
  - `PI0Policy(PI0Config(...))` / `PI05Policy(PI05Config(...))` build the model from the
    config with transformers' random init; no download (only `from_pretrained` fetches).
  - The policy's pre-processor (tokenizer, normalisation) is not used: it loads the
    PaliGemma tokenizer from the Hub. The comparison calls the core model's
    `policy.model.sample_actions(images, img_masks, lang_tokens, lang_masks, state,
    noise=..., num_steps=...)` (pi0.5: no `state`, the state goes into the prompt), which is
    what `predict_action_chunk` calls after pre-processing. Inputs at that level: `images` a
    list (one per camera) of float (B, 3, H, W) in [-1, 1] (the policy maps [0, 1] camera
    frames to that); `img_masks` a list of (B,) bool; tokens (B, L) int64 and mask (B, L)
    bool; state (B, max_state_dim) float32; noise (B, chunk_size, max_action_dim) float32.
    It returns all max_action_dim dims (the policy slices them afterwards).
  - Weights: LeRobot's parameters get vlaperf's deterministic random init (by name, so
    both models would get the same values anyway), the LM head is set to the embedding
    (LeRobot's transformers-5 model keeps them as two tensors), and LeRobot's own
    `state_dict()` is then loaded into vlaperf's model with the strict
    `vlaperf.checkpoints.load_state`: every name and shape must match one to one.
    With a checkpoint instead (`compare_lerobot(checkpoint=...)`, `vlaperf compare --checkpoint`),
    the file is read once and both models load its tensors strictly, each in its own dtypes.

Compared as shipped: under dtype="bfloat16" LeRobot keeps the whole SigLIP tower, the
projector and every RMSNorm weight in float32 and computes image features in float32,
where vlaperf follows openpi (SigLIP encoder and projector in bfloat16, patch and position
embeddings and norm weights in float32). LeRobot forces eager attention. So bfloat16 runs
differ by that precision choice, not only by rounding order; float32 runs must agree to
1e-4 relative L2.

Size: LeRobot's config only knows the full gemma_2b + gemma_300m variants and a fixed
SigLIP So400m. `reduced=True` builds a smaller LeRobot model (for CPU tests) by patching,
for the duration of the constructor only, the module's `get_gemma_config` and its
`CONFIG_MAPPING["paligemma"]` (smaller SigLIP). LeRobot hard-codes the projector's output
width (2048), 8 attention heads and the SigLIP MLP width (4304), so the reduced model keeps
those; see `Reduced`.

LeRobot 0.6 needs Python >= 3.12. Nothing here imports it until a function runs.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from vlaperf.checkpoints import (EMBED, LEROBOT_PREFIX, LM_HEAD, CheckpointError, load_read_tensors, load_state,
                                 read_model_tensors)
from vlaperf.compare import (action_metrics, comparison_engine, comparison_steps, compare_vlaperf, config_from_modules,
                             timed_first_call)
from vlaperf.inputs import IMAGE_SLOTS, Observation, random_noise, random_observation
from vlaperf.models.pi0 import (
    GEMMA_2B,
    GEMMA_300M,
    GemmaConfig,
    Pi0Config,
    Pi0Model,
    VisionConfig,
    default_dtype,
    empty_model,
    get_config,
    init_random_,
)
from vlaperf.workloads import Workload, get_workload

LEROBOT_MISSING = "LeRobot 0.6 is not importable here (needs Python >= 3.12 and `pip install lerobot==0.6.1`; docs/compare.md has the GPU machine's wheels)"
TESTED_VERSION = "0.6.1"

# Hard-coded in LeRobot 0.6.1's PaliGemmaWithExpertModel / compute_layer_complete.
LEROBOT_PROJECTION_DIM = 2048
LEROBOT_HEADS = 8
LEROBOT_VISION_MLP = 4304
LEROBOT_VOCAB = 257152


class LeRobotUnavailable(ImportError):
    """LeRobot (0.6, with transformers) cannot be imported in this environment."""


def import_lerobot(pi05: bool) -> SimpleNamespace:
    """LeRobot's config class, policy class and modeling module for pi0 or pi0.5.

    Raises LeRobotUnavailable (message starting with LEROBOT_MISSING) if any of it fails to
    import, whatever the reason (not installed, Python < 3.12 syntax errors, a missing
    dependency)."""
    try:
        if pi05:
            from lerobot.policies.pi05 import configuration_pi05 as conf
            from lerobot.policies.pi05 import modeling_pi05 as modeling

            config_cls, policy_cls = conf.PI05Config, modeling.PI05Policy
        else:
            from lerobot.policies.pi0 import configuration_pi0 as conf
            from lerobot.policies.pi0 import modeling_pi0 as modeling

            config_cls, policy_cls = conf.PI0Config, modeling.PI0Policy
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable here"
        raise LeRobotUnavailable(f"{LEROBOT_MISSING}: {type(e).__name__}: {e}") from e
    return SimpleNamespace(config_cls=config_cls, policy_cls=policy_cls, modeling=modeling, version=lerobot_version())


def lerobot_available() -> bool:
    try:
        import_lerobot(pi05=False)
    except LeRobotUnavailable:
        return False
    return True


def lerobot_version() -> str | None:
    try:
        return importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Reduced:
    """A LeRobot-buildable pi0 / pi0.5 small enough for a CPU test.

    Kept from the full model (LeRobot hard-codes them): PaliGemma width 2048 (projector
    output), 8 query heads and 1 key/value head, SigLIP MLP width 4304, vocabulary 257152
    (so the token embedding alone is 527M parameters, ~2 GB in float32)."""

    depth: int = 2
    head_dim: int = 32
    backbone_mlp: int = 256
    expert_width: int = 64
    expert_mlp: int = 128
    vision_width: int = 64
    vision_depth: int = 1
    vision_heads: int = 2


def matching_config(workload: Workload, reduced: Reduced | None = None) -> Pi0Config:
    """The vlaperf model config that equals what LeRobot builds for `workload`.

    Full size: the workload's pi0 / pi05 preset, with the workload's horizon and action dim.
    Reduced: the `Reduced` sizes with the workload's pi0/pi0.5 kind, image size, action dim,
    horizon and prompt length."""
    base = get_config(workload.preset)
    if reduced is None:
        if base.vision != VisionConfig(image_size=base.vision.image_size) or (base.backbone, base.expert) != (GEMMA_2B, GEMMA_300M):
            raise ValueError(f"LeRobot builds only the full pi0 / pi0.5 (PaliGemma gemma_2b + gemma_300m expert); workload "
                             f"{workload.id!r} uses preset {workload.preset!r}: compare it with reduced=True (--reduced)")
        return replace(base, action_horizon=workload.horizon, action_dim=workload.action_dim)
    r = reduced
    vision = VisionConfig(width=r.vision_width, depth=r.vision_depth, mlp_dim=LEROBOT_VISION_MLP, num_heads=r.vision_heads,
                          patch_size=base.vision.patch_size, image_size=base.vision.image_size)
    backbone = GemmaConfig(width=LEROBOT_PROJECTION_DIM, depth=r.depth, mlp_dim=r.backbone_mlp, num_heads=LEROBOT_HEADS,
                           num_kv_heads=1, head_dim=r.head_dim, vocab_size=LEROBOT_VOCAB)
    expert = replace(backbone, width=r.expert_width, mlp_dim=r.expert_mlp)
    name = "lerobot-reduced-" + ("pi05" if base.pi05 else "pi0")
    return Pi0Config(name, vision, backbone, expert, pi05=base.pi05, action_dim=workload.action_dim,
                     action_horizon=workload.horizon, max_token_len=workload.prompt_slots)


def _lerobot_dtype(dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return "bfloat16"
    if dtype == torch.float32:
        return "float32"
    raise ValueError(f"LeRobot's pi0 runs in bfloat16 or float32, not {dtype}")


def policy_dtype(policy) -> torch.dtype:
    """The dtype LeRobot's config built the policy in ("bfloat16" or "float32")."""
    name = getattr(policy.config, "dtype", "float32")
    if name not in ("bfloat16", "float32"):
        raise ValueError(f"policy.config.dtype: {name!r}, expected 'bfloat16' or 'float32'")
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def lerobot_config(lr: SimpleNamespace, cfg: Pi0Config, device: torch.device, dtype: torch.dtype, steps: int):
    """LeRobot's PI0Config / PI05Config for a model equal to `cfg` (sizes aside, see `Reduced`)."""
    R = cfg.vision.image_size
    return lr.config_cls(
        dtype=_lerobot_dtype(dtype),
        device=str(device),
        chunk_size=cfg.action_horizon,
        n_action_steps=cfg.action_horizon,
        max_state_dim=cfg.action_dim,  # vlaperf pads the state to the action dim, as openpi does
        max_action_dim=cfg.action_dim,
        num_inference_steps=steps,
        image_resolution=(R, R),
        tokenizer_max_length=cfg.max_token_len,
        compile_model=False,  # time_lerobot compiles the way LeRobot's compile_model does
    )


class _SmallVision:
    """Stands in for transformers' CONFIG_MAPPING inside LeRobot's modeling module while it
    builds a reduced model: "paligemma" gets a smaller SigLIP config, everything else passes
    through."""

    def __init__(self, base, vision: dict):
        self._base, self._vision = base, vision

    def __getitem__(self, key):
        factory = self._base[key]
        if key != "paligemma":
            return factory
        return lambda **kw: factory(vision_config=dict(self._vision), **kw)


@contextlib.contextmanager
def _sizes(modeling, cfg: Pi0Config, reduced: bool):
    if not reduced:
        yield
        return
    checks = {"PaliGemma width": (cfg.backbone.width, LEROBOT_PROJECTION_DIM), "query heads": (cfg.backbone.num_heads, LEROBOT_HEADS),
              "SigLIP MLP width": (cfg.vision.mlp_dim, LEROBOT_VISION_MLP), "vocabulary": (cfg.backbone.vocab_size, LEROBOT_VOCAB)}
    bad = [f"{what} {have} (LeRobot needs {need})" for what, (have, need) in checks.items() if have != need]
    if bad:
        raise ValueError("LeRobot cannot build this reduced size: " + "; ".join(bad))
    sizes = {"gemma_2b": cfg.backbone, "gemma_300m": cfg.expert}

    def get_gemma_config(variant: str):
        g = sizes[variant]
        return modeling.GemmaConfig(width=g.width, depth=g.depth, mlp_dim=g.mlp_dim, num_heads=g.num_heads,
                                    num_kv_heads=g.num_kv_heads, head_dim=g.head_dim)

    v = cfg.vision
    vision = {"model_type": "siglip_vision_model", "hidden_size": v.width, "num_hidden_layers": v.depth,
              "num_attention_heads": v.num_heads, "intermediate_size": v.mlp_dim, "patch_size": v.patch_size,
              "image_size": v.image_size, "layer_norm_eps": v.eps, "vision_use_head": False}
    with mock.patch.object(modeling, "get_gemma_config", get_gemma_config), \
            mock.patch.object(modeling, "CONFIG_MAPPING", _SmallVision(modeling.CONFIG_MAPPING, vision)):
        yield


def build_lerobot(cfg: Pi0Config, device: torch.device | str, dtype: torch.dtype, steps: int = 10, reduced: bool = False):
    """LeRobot's PI0Policy / PI05Policy equal in shape to `cfg`, transformers' random init, eval mode."""
    lr = import_lerobot(cfg.pi05)
    device = torch.device(device)
    config = lerobot_config(lr, cfg, device, dtype, steps)
    with _sizes(lr.modeling, cfg, reduced), torch.device(device):
        policy = lr.policy_cls(config)
    return policy.eval()


# ----------------------------------------------------------------------- weights


def lerobot_state_to_model_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """LeRobot policy state dict -> vlaperf/openpi names (strip `model.`; the embedding wins
    over the unused LM head, as LeRobot's loader does). Keys without the prefix are kept as
    they are, so the strict load reports them as unexpected."""
    named = {k[len(LEROBOT_PREFIX):] if k.startswith(LEROBOT_PREFIX) else k: v for k, v in state.items()}
    if EMBED in named:
        named[LM_HEAD] = named[EMBED]
    return named


@torch.no_grad()
def randomize_lerobot_(policy, seed: int = 0) -> None:
    """vlaperf's deterministic random init (`init_random_`) on LeRobot's parameters, with the
    LM head equal to the embedding. LeRobot's transformers-5 model keeps the two as separate
    tensors; they are tied for the init (so the parameter set, and with it every value,
    is exactly what `build_model(cfg, seed=seed)` gives vlaperf's model) and untied again
    afterwards (a copy), leaving LeRobot's module layout as shipped."""
    paligemma = policy.model.paligemma_with_expert.paligemma
    embed = paligemma.model.language_model.embed_tokens
    head = getattr(paligemma, "lm_head", None)
    if head is not None:
        head.weight = embed.weight
    try:
        init_random_(policy.model, seed)
    finally:
        if head is not None:
            head.weight = torch.nn.Parameter(embed.weight.detach().clone(), requires_grad=embed.weight.requires_grad)


def vlaperf_from_lerobot(policy, cfg: Pi0Config, dtype: torch.dtype) -> Pi0Model:
    """A vlaperf model holding LeRobot's weights, loaded strictly from LeRobot's state_dict,
    in vlaperf's (openpi's) dtype layout for `dtype`. Built on the meta device and
    materialised uninitialised: the strict load then writes every parameter."""
    device = next(policy.parameters()).device
    model = empty_model(cfg, device, dtype)
    try:
        load_state(model, lerobot_state_to_model_names(policy.state_dict()))
    except CheckpointError as e:
        raise CheckpointError(f"LeRobot's state dict does not match vlaperf's model one to one: {e}") from None
    return model.eval().requires_grad_(False)


@torch.no_grad()
def load_into_lerobot_(policy, named: dict[str, Tensor]) -> None:
    """A checkpoint's tensors under openpi's names (`vlaperf.checkpoints.read_model_tensors`) into LeRobot's
    policy, strictly: every tensor of LeRobot's state dict gets the one of its name less `model.`, cast to
    LeRobot's own dtype for it (float32 SigLIP, projector and norms under bfloat16, as its loader leaves them);
    its untied LM head gets the embedding, which wins in LeRobot's loader too. A name on either side without
    its match is a CheckpointError naming it."""
    theirs = policy.state_dict()
    state, missing = {}, []
    for key in theirs:
        name = key[len(LEROBOT_PREFIX):] if key.startswith(LEROBOT_PREFIX) else None
        source = EMBED if name == LM_HEAD else name
        if source not in named:
            missing.append(key)
            continue
        if named[source].shape != theirs[key].shape:
            raise CheckpointError(f"{key}: the checkpoint's {source} has shape {tuple(named[source].shape)}, LeRobot's "
                                  f"tensor {tuple(theirs[key].shape)}")
        state[key] = named[source]
    unused = sorted(set(named) - {k[len(LEROBOT_PREFIX):] for k in state} - {EMBED, LM_HEAD})  # one tensor
    if missing or unused:
        raise CheckpointError(f"the checkpoint does not match LeRobot's model one to one: LeRobot's {missing[:5]} have "
                              f"no tensor in it, its {unused[:5]} no place in LeRobot's model")
    policy.load_state_dict(state, strict=True)  # copy_ into LeRobot's own parameters: their dtypes stay


# --------------------------------------------------------------------------- runs


def lerobot_inputs(obs: Observation, pi05: bool) -> tuple:
    """vlaperf Observation -> the positional inputs of LeRobot's core `sample_actions`."""
    S = obs.images.shape[1]
    images = [obs.images[:, s].float() for s in range(S)]
    masks = [obs.image_mask[:, s] for s in range(S)]
    args = (images, masks, obs.tokens, obs.token_mask)
    return args if pi05 else args + (obs.state.float(),)


def run_lerobot(policy, obs: Observation, noise: Tensor, num_steps: int, sample=None) -> Tensor:
    """Actions (B, H, A) float32 from LeRobot's core model (or `sample`, a compiled copy of
    its sample_actions). The noise is cloned: LeRobot's loop does not write it, but a
    compiled variant might reuse buffers."""
    fn = sample or policy.model.sample_actions
    return fn(*lerobot_inputs(obs, _is_pi05(policy)), noise=noise.clone(), num_steps=num_steps)


def predict_batch(obs: Observation) -> dict[str, Tensor]:
    """`obs` as the batch LeRobot's `predict_action_chunk` takes after its processors: each camera slot that holds
    an image as a [0, 1] frame under `observation.images.<slot>`, the padded state, the prompt's tokens and mask.

    A slot masked in every sample is left out, as a robot without that camera sends none, and LeRobot pads it
    back as a masked image. LeRobot puts those after the present cameras and marks every present camera valid in
    every sample, so the empty slots must be the last ones and each slot's mask the same across the batch."""
    mask = obs.image_mask.cpu()
    valid = mask.any(0).tolist()
    present = sum(valid)
    if valid != [True] * present + [False] * (len(valid) - present) or not (mask == mask[:1]).all():
        raise ValueError(f"obs.image_mask: LeRobot's predict_action_chunk pads absent cameras after the present "
                         f"ones and marks each present camera valid in every sample; this mask "
                         f"({mask.int().tolist()}) has an empty slot before a present one, or differs between samples")
    batch = {f"observation.images.{IMAGE_SLOTS[s]}": (obs.images[:, s].float() + 1) / 2 for s in range(present)}
    batch.update({"observation.state": obs.state.float(), "observation.language.tokens": obs.tokens,
                  "observation.language.attention_mask": obs.token_mask})
    return batch


def set_predict_features(policy, obs: Observation) -> None:
    """The input and output features `predict_action_chunk` reads, for the batch `predict_batch(obs)` builds (a
    policy built from a bare config, as `build_lerobot` builds it, has none): the three camera slots, the padded
    state, and every padded action dimension as the output."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    R = obs.images.shape[-1]
    slots = IMAGE_SLOTS[:obs.images.shape[1]]
    features = {f"observation.images.{slot}": PolicyFeature(FeatureType.VISUAL, (3, R, R)) for slot in slots}
    features["observation.state"] = PolicyFeature(FeatureType.STATE, (obs.state.shape[1],))
    policy.config.input_features = features
    policy.config.output_features = {"action": PolicyFeature(FeatureType.ACTION, (policy.config.max_action_dim,))}


def _is_pi05(policy) -> bool:
    return not hasattr(policy.model, "state_proj")


def lerobot_model_config(policy) -> Pi0Config:
    """The vlaperf model config of a built LeRobot PI0Policy / PI05Policy: sizes from its modules' configs, the
    chunk size, padded action dim and prompt length from its policy config."""
    c = policy.config
    pi05 = _is_pi05(policy)
    if not pi05 and c.max_state_dim != c.max_action_dim:
        raise ValueError(f"policy.config.max_state_dim: {c.max_state_dim}, expected the max_action_dim "
                         f"({c.max_action_dim}): vlaperf's pi0 pads the state to the action dim, as openpi does")
    size = policy.model.paligemma_with_expert.paligemma.config.vision_config.image_size
    if tuple(c.image_resolution) != (size, size):
        raise ValueError(f"policy.config.image_resolution: {tuple(c.image_resolution)}, expected the SigLIP tower's "
                         f"square {size} x {size}")
    return config_from_modules(policy.model, "lerobot-" + ("pi05" if pi05 else "pi0"), pi05, c.max_action_dim,
                               c.chunk_size, c.tokenizer_max_length)


@dataclass
class LeRobotRun:
    """Everything a comparison built, kept for timing: LeRobot's policy, vlaperf's model, the
    inputs, and the equivalence results."""

    workload: Workload
    config: Pi0Config
    policy: Any
    model: Pi0Model
    obs: Observation
    noise: Tensor
    steps: int
    device: torch.device
    dtype: torch.dtype
    levers: str | None  # the requested engine spec ("best", "a,b,c"), None for the reference only
    engine: Any  # vlaperf's Engine for it, or None
    reduced: bool
    result: dict

    def __getitem__(self, key):  # run["equivalence"] reads like the result dict
        return self.result[key]


def compare_lerobot(workload: str | Workload = "libero-pi0", device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                    seed: int = 0, steps: int | None = None, reduced: bool | Reduced = False,
                    levers: str | None = "best", checkpoint: str | os.PathLike | None = None) -> LeRobotRun:
    """Build LeRobot's policy and vlaperf's model with the same weights, run both on the same
    random observation and noise, and measure how far vlaperf's reference (and its `levers`
    engine, unless None) is from LeRobot. See the module doc for what is compared.

    The weights are vlaperf's random init of `seed` unless `checkpoint` names a checkpoint (any layout
    `vlaperf.checkpoints.load_checkpoint` reads) of the workload's model: the file is read once and each side
    loads its tensors strictly, cast to its own dtypes; `seed` then seeds the observation and noise only.

    result["equivalence"] = {"reference": metrics, levers: metrics} with metrics from
    vlaperf.compare.action_metrics (LeRobot's actions are the reference side); the engine's
    full lever list is result["levers"]["label"]."""
    wl = get_workload(workload) if isinstance(workload, str) else workload
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    steps = comparison_steps(steps, wl.steps)
    shrink = reduced if isinstance(reduced, Reduced) else (Reduced() if reduced else None)
    cfg = matching_config(wl, shrink)
    t0 = time.perf_counter()
    policy = build_lerobot(cfg, device, dtype, steps, reduced=shrink is not None)
    loaded = None
    if checkpoint is None:
        randomize_lerobot_(policy, seed)
        model = vlaperf_from_lerobot(policy, cfg, dtype)
    else:
        model = empty_model(cfg, device, dtype)
        named, loaded = read_model_tensors(checkpoint, {k: v.shape for k, v in model.state_dict().items()}, cfg.pi05)
        load_read_tensors(model, named, loaded)  # the strict check first: a file of another model is named as such
        model = model.eval().requires_grad_(False)
        load_into_lerobot_(policy, named)
        del named
    build_s = time.perf_counter() - t0
    engine = comparison_engine(model, levers)  # before LeRobot's call: a wrong lever list at once
    obs = random_observation(wl, cfg, device, seed=seed)
    noise = random_noise(wl, cfg, device, seed=seed)

    first_calls: dict[str, float] = {}  # each path's first call in the process: time_lerobot reports these
    theirs = timed_first_call(lambda: run_lerobot(policy, obs, noise, steps), device, first_calls, "lerobot")
    equivalence, actions = compare_vlaperf(model, levers, engine, obs, noise, steps, theirs, "lerobot", first_calls)
    result = {
        "against": "lerobot",
        "lerobot_version": lerobot_version(),
        "lerobot_version_tested": TESTED_VERSION,
        "model": cfg.name,
        "reduced": shrink is not None,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
        "steps": steps,
        "seed": seed,
        "weights": ({"source": "random", "seed": seed} if loaded is None else
                    {"source": "checkpoint", **{k: loaded[k] for k in ("path", "layout", "tensors", "file_dtypes")}}),
        "build_s": build_s,
        "levers": {"spec": levers, "label": engine.name} if engine else None,
        "equivalence": equivalence,
        "passed": all(m["passed"] for m in equivalence.values()),
        "first_call_s": first_calls,
        "as_shipped": [
            "LeRobot keeps SigLIP, the projector and RMSNorm weights in float32 under bfloat16 and computes image features "
            "in float32; vlaperf follows openpi (SigLIP and projector in bfloat16)",
            "LeRobot forces eager attention",
            "LeRobot's core sample_actions is called directly (no tokenizer / normalisation pre-processor)",
        ],
        "actions": actions,
    }
    return LeRobotRun(wl, cfg, policy, model, obs, noise, steps, device, dtype, levers if engine else None, engine,
                      shrink is not None, result)


# ------------------------------------------------------------------------- timing


def time_lerobot(run: LeRobotRun, warmup: int = 10, iters: int = 50, lerobot_compile: str | None = "max-autotune",
                 progress: bool = True, accelerated: bool = False, rtc: bool = False) -> dict:
    """Latency of LeRobot as shipped (eager; and compiled the way its `compile_model=True`
    does, with `lerobot_compile` as its compile_mode, None to skip) against vlaperf's
    reference and its engine, interleaved in one process (vlaperf.timing.interleaved), same
    inputs. Ratios are speedups over LeRobot eager (>1 = faster than LeRobot).

    `accelerated`: also LeRobot's own `predict_action_chunk` (its image pre-processing included) on the same
    observation, as shipped ("lerobot_predict") and with `accelerate_lerobot` installed around the run's engine
    ("vlaperf_in_lerobot_predict"); the accelerator's checks and the two outputs' distance are in
    result["accelerated"]. `rtc` (with `accelerated`): the same two again with LeRobot's real-time chunking on and
    a previous chunk's leftover given ("lerobot_predict_rtc", "vlaperf_in_lerobot_predict_rtc"; RTC_TIMING has the
    leftover, the delay and LeRobot's RTC settings), their distance in result["accelerated"]["rtc"].
    Where the accelerator's own check refuses to answer (`NotEquivalent`, on the accelerated row's set-up call), that
    row is not timed and result["accelerated"]["refused"] records it: {"row", "message", "check"} (the check's
    record: shape, max_abs, rel_l2, tolerance). The rows set up before it are timed as usual, with LeRobot's (and
    vlaperf's core) rows, so the file still holds what was measured; no row is set up after it (the RTC rows after
    a refused plain row: the accelerator already failed on this observation).

    A LeRobot compile that fails is reported (compile_error) and that variant left out.
    LeRobot's compile_model also sets torch.set_float32_matmul_precision("high"); it is set
    here for the whole timing (it changes float32 matmuls only) and restored afterwards."""
    from vlaperf.timing import interleaved

    fns: dict[str, Any] = {"lerobot": lambda: run_lerobot(run.policy, run.obs, run.noise, run.steps)}
    compiled_info: dict[str, Any] = {"mode": lerobot_compile}
    previous_precision = torch.get_float32_matmul_precision()
    try:
        if lerobot_compile:
            torch.set_float32_matmul_precision("high")
            compiled = torch.compile(run.policy.model.sample_actions, mode=lerobot_compile)
            try:
                t0 = time.perf_counter()
                out = run_lerobot(run.policy, run.obs, run.noise, run.steps, sample=compiled)
                if run.device.type == "cuda":
                    torch.cuda.synchronize(run.device)
                compiled_info["compile_s"] = time.perf_counter() - t0
                compiled_info["vs_eager"] = action_metrics(out, run.result["actions"]["lerobot"], run.dtype)
                fns["lerobot_compiled"] = lambda: run_lerobot(run.policy, run.obs, run.noise, run.steps, sample=compiled)
            except Exception as e:  # noqa: BLE001 - a failing peer compile is a finding, not a crash
                compiled_info["compile_error"] = f"{type(e).__name__}: {str(e)[:500]}"
        fns["vlaperf_reference"] = lambda: run.model.sample_actions(run.obs, run.noise, run.steps)
        if run.engine is not None:
            fns["vlaperf_" + run.levers] = lambda: run.engine.sample_actions(run.obs, run.noise, run.steps)
        if accelerated:
            accelerated_info = _predict_variants(run, fns, rtc)
        # the fast rows' timed calls each follow an untimed call of their own: in the round they sit after an eager
        # one, whose host work left them 0.4-1.3 ms slower than in a loop of their own calls (perf-notes, session 49)
        settled = [name for name in fns if name not in EAGER_ROWS]
        timing = interleaved(fns, device=run.device, warmup=warmup, iters=iters, baseline="lerobot", progress=progress,
                             settle=settled)
    finally:
        torch.set_float32_matmul_precision(previous_precision)
    # Each row's first call in the process, not the interleaved warm-up's (a warm call there: the comparison, the
    # compile and the accelerated rows' set-up made the first ones; the warm-up's stays in timing["interleaved"])
    firsts = dict(run.result.get("first_call_s") or {})
    if "compile_s" in compiled_info:
        firsts["lerobot_compiled"] = compiled_info["compile_s"]
    if accelerated:
        firsts.update(accelerated_info["first_call_s"])
    summary = {}
    for name, v in timing["variants"].items():
        r = timing["ratios"][name]
        summary[name] = {
            "wall_ms_median": v["timers"]["wall_ms"]["median"],
            "cuda_event_ms_median": v["timers"]["cuda_event_ms"]["median"] if v["timers"]["cuda_event_ms"] else None,
            "speedup_vs_lerobot_wall": r["wall_ms"]["speedup"],
            "speedup_vs_lerobot_event": r["cuda_event_ms"]["speedup"] if r["cuda_event_ms"] else None,
            "significant": r["wall_ms"]["significant"],
            "first_call_s": firsts.get(name, v["first_call_s"]),
        }
    out = {"summary": summary, "lerobot_compile": compiled_info, "interleaved": timing, "settled": settled}
    if accelerated:
        out["accelerated"] = accelerated_info
    return out


# The rows that run eagerly (hundreds of ms of host work a call) and are timed as they come in the round; every
# other row is settled (timing.interleaved's `settle`)
EAGER_ROWS = ("lerobot", "vlaperf_reference", "lerobot_predict", "lerobot_predict_rtc")

# What `time_lerobot(rtc=True)` gives LeRobot's RTC: LeRobot's RTCConfig defaults (linear schedule, max guidance
# weight 10, execution horizon 10) and a leftover as its RTC loop would hand over mid-episode: the second half of
# the previous chunk not yet executed, 3 of its actions executed while the new chunk is computed.
RTC_TIMING = {"inference_delay": 3, "leftover_from": 0.5}


def _rtc_config_class():
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    return RTCConfig


def _predict_variants(run: LeRobotRun, fns: dict, rtc: bool = False) -> dict:
    """Add LeRobot's `predict_action_chunk` as shipped and accelerated to `fns` (and with RTC guidance: `rtc`);
    their first calls and distances. An accelerated row whose set-up call the accelerator's check refused is left
    out of `fns` and recorded as "refused" (see time_lerobot)."""
    from vlaperf.compare.accelerate import NotEquivalent, accelerate_lerobot

    if run.engine is None:
        raise ValueError("accelerated: the comparison has no vlaperf engine to accelerate LeRobot's policy with "
                         "(levers 'reference'); give it levers")
    set_predict_features(run.policy, run.obs)
    batch = predict_batch(run.obs)
    fast = accelerate_lerobot(run.policy, engine=run.engine)
    fast.restore()  # vlaperf's call is installed only inside its own timed calls: the others call LeRobot's

    def shipped():
        return run.policy.predict_action_chunk(batch, noise=run.noise.clone(), num_steps=run.steps)

    def accelerated():
        fast.install()
        try:
            return run.policy.predict_action_chunk(batch, noise=run.noise.clone(), num_steps=run.steps)
        finally:
            fast.restore()

    firsts, outs = {}, {}

    def first(name, fn):
        t0 = time.perf_counter()
        outs[name] = fn()
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        firsts[name] = time.perf_counter() - t0
        fns[name] = fn

    def refusal(name, fn) -> dict | None:
        """`first(name, fn)`; where the accelerator's check refuses to answer, its record instead (the row is then
        neither timed nor compared): a refusal is a finding of the run, and the rows already measured stay."""
        try:
            first(name, fn)
        except NotEquivalent as e:
            return {"row": name, "message": str(e), "check": e.check}
        return None

    first("lerobot_predict", shipped)
    refused = refusal("vlaperf_in_lerobot_predict", accelerated)
    info = {"levers": fast.levers, "checks": fast.checks, "first_call_s": firsts}
    if refused is None:
        info["vs_lerobot_predict"] = action_metrics(outs["vlaperf_in_lerobot_predict"], outs["lerobot_predict"],
                                                    run.dtype)
    info["vs_lerobot_core"] = action_metrics(outs["lerobot_predict"], run.result["actions"]["lerobot"], run.dtype)
    if refused is not None:
        info["refused"] = refused
    if not rtc or refused is not None:
        return info
    # RTC on only inside its own rows (LeRobot reads config.rtc_config.enabled at each call), so the other rows
    # time LeRobot's loop as shipped, without RTC's per-step wrapper
    policy = run.policy
    policy.config.rtc_config = _rtc_config_class()(enabled=False)
    policy.init_rtc_processor()
    settings = policy.config.rtc_config
    H = policy.config.chunk_size
    start = int(H * RTC_TIMING["leftover_from"])
    kwargs = {"inference_delay": RTC_TIMING["inference_delay"], "prev_chunk_left_over": outs["lerobot_predict"][:, start:],
              "execution_horizon": None}  # None: LeRobot's config's

    def guided(install: bool):
        def call():
            settings.enabled = True
            if install:
                fast.install()
            try:
                return policy.predict_action_chunk(batch, noise=run.noise.clone(), num_steps=run.steps, **kwargs)
            finally:
                settings.enabled = False
                fast.restore()
        return call

    first("lerobot_predict_rtc", guided(False))
    refused = refusal("vlaperf_in_lerobot_predict_rtc", guided(True))
    info["rtc"] = {"inference_delay": kwargs["inference_delay"], "leftover_len": H - start,
                   "execution_horizon": settings.execution_horizon, "max_guidance_weight": settings.max_guidance_weight,
                   "schedule": str(getattr(settings.prefix_attention_schedule, "value",
                                           settings.prefix_attention_schedule))}
    if refused is None:
        info["rtc"]["vs_lerobot_predict_rtc"] = action_metrics(outs["vlaperf_in_lerobot_predict_rtc"],
                                                               outs["lerobot_predict_rtc"], run.dtype)
    else:
        info["refused"] = refused
    # LeRobot's guided row answered either way: how far its guidance moved the chunk is measured
    info["rtc"]["guidance_moves"] = action_metrics(outs["lerobot_predict_rtc"], outs["lerobot_predict"],
                                                   run.dtype)["rel_l2"]
    return info


__all__ = ["LEROBOT_MISSING", "LeRobotUnavailable", "Reduced", "LeRobotRun", "import_lerobot", "lerobot_available",
           "matching_config", "build_lerobot", "randomize_lerobot_", "vlaperf_from_lerobot", "load_into_lerobot_",
           "compare_lerobot", "time_lerobot", "run_lerobot", "predict_batch", "set_predict_features",
           "lerobot_model_config", "policy_dtype"]
