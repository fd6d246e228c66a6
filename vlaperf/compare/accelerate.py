"""vlaperf's engine inside LeRobot's own pi0 / pi0.5 policy object.

    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from vlaperf.compare.accelerate import accelerate_lerobot

    policy = PI0Policy.from_pretrained("lerobot/pi0_libero").to("cuda").eval()
    fast = accelerate_lerobot(policy, levers="best")   # the same object, now sampling with vlaperf
    action = policy.select_action(batch)               # LeRobot's pre-processing, queue and eval loop as before
    fast.checks                                         # each input shape's first call, checked against LeRobot
    fast.restore()                                      # LeRobot's own sample_actions again

What is replaced: only the core model's `sample_actions` (`policy.model.sample_actions`), the one call
LeRobot's `predict_action_chunk` (and with it `select_action`) makes after its pre-processing. LeRobot's
tokenizer and normalisation processors, its image resizing and [-1, 1] mapping, its empty-camera padding and
its action queue run unchanged, so an evaluation script (lerobot-eval, a robot loop) needs no other change.

The engine's model is built from LeRobot's own state dict with vlaperf's strict loader, in the layout
openpi uses for the policy's dtype (under bfloat16: SigLIP and projector in bfloat16, where LeRobot keeps them
in float32). The sizes are read from LeRobot's module configs, so a model of any size LeRobot built loads.

Checked, not assumed: unless `check=False`, the first call of every new input shape (batch, camera slots and
which of them hold an image, the prompt bucket, the step count) also runs LeRobot's own `sample_actions` on
the same inputs and noise, and raises `NotEquivalent` instead of answering if vlaperf's actions are further
from LeRobot's than vlaperf's tolerance for the dtype (`vlaperf.check.REL_L2_TOLERANCE`). Each check is
kept in `checks`. A new shape is also where the engine captures a new CUDA graph, so the check's LeRobot
call lands where the first call is slow anyway.

Noise: where LeRobot's caller gives none, it is drawn with LeRobot's own `sample_noise`, so a seeded run
draws what it drew before. Each call reads the masks to the host once (one small device-to-host copy):
LeRobot's inputs carry no host-side record of which cameras are empty or how long the prompt is, and the
engine's plan (which slots to embed, how many prompt tokens to keep) is made on the host.

Not supported: real-time chunking (LeRobot's RTC guidance, `rtc_config.enabled`) is refused when the policy
is accelerated, and RTC arguments given to a call are refused there; `restore()` hands the call back to LeRobot.

Memory: LeRobot's weights stay where they are (its `forward`, training, and the checks use them); the
engine's model is a second copy in vlaperf's layout.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vlaperf.compare import action_metrics
from vlaperf.compare.lerobot import _is_pi05, vlaperf_from_lerobot
from vlaperf.inputs import Observation
from vlaperf.models.pi0 import GemmaConfig, Pi0Config, VisionConfig

RTC_ARGUMENTS = ("inference_delay", "prev_chunk_left_over", "execution_horizon")


class NotEquivalent(RuntimeError):
    """vlaperf's actions for an input shape were further from LeRobot's than the tolerance allows."""


def _rope_base(hf_config) -> float:
    """transformers 5 keeps the RoPE base in `rope_parameters`, earlier releases in `rope_theta`."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(hf_config, "rope_theta", 10_000.0))


def _gemma(hf_config) -> GemmaConfig:
    c = hf_config
    return GemmaConfig(width=c.hidden_size, depth=c.num_hidden_layers, mlp_dim=c.intermediate_size,
                       num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                       vocab_size=c.vocab_size, eps=float(c.rms_norm_eps), rope_base=_rope_base(c))


def lerobot_model_config(policy) -> Pi0Config:
    """The vlaperf model config of a built LeRobot PI0Policy / PI05Policy, read from its modules' own configs
    (PaliGemma's text and vision configs, the expert's) and its policy config (chunk size, padded action dim,
    prompt length)."""
    c = policy.config
    pwe = policy.model.paligemma_with_expert
    text, vision = pwe.paligemma.config.text_config, pwe.paligemma.config.vision_config
    pi05 = _is_pi05(policy)
    if not pi05 and c.max_state_dim != c.max_action_dim:
        raise ValueError(f"policy.config.max_state_dim: {c.max_state_dim}, expected the max_action_dim "
                         f"({c.max_action_dim}): vlaperf's pi0 pads the state to the action dim, as openpi does")
    image = tuple(c.image_resolution)
    if image != (vision.image_size, vision.image_size):
        raise ValueError(f"policy.config.image_resolution: {image}, expected the SigLIP tower's square "
                         f"{vision.image_size} x {vision.image_size}")
    tower = VisionConfig(width=vision.hidden_size, depth=vision.num_hidden_layers, mlp_dim=vision.intermediate_size,
                         num_heads=vision.num_attention_heads, patch_size=vision.patch_size,
                         image_size=vision.image_size, eps=float(vision.layer_norm_eps))
    name = "lerobot-" + ("pi05" if pi05 else "pi0")
    return Pi0Config(name, tower, _gemma(text), _gemma(pwe.gemma_expert.config), pi05=pi05,
                     action_dim=c.max_action_dim, action_horizon=c.chunk_size, max_token_len=c.tokenizer_max_length)


def policy_dtype(policy) -> torch.dtype:
    """The dtype LeRobot's config built the policy in ("bfloat16" or "float32")."""
    name = getattr(policy.config, "dtype", "float32")
    if name not in ("bfloat16", "float32"):
        raise ValueError(f"policy.config.dtype: {name!r}, expected 'bfloat16' or 'float32'")
    return torch.bfloat16 if name == "bfloat16" else torch.float32


@dataclass
class LeRobotAccelerator:
    """What `accelerate_lerobot` installed on a policy: the engine, its model, and the checks so far."""

    policy: Any
    model: Any  # vlaperf's Pi0Model holding LeRobot's weights
    engine: Any  # vlaperf's Engine over it
    check: bool
    checks: list[dict] = field(default_factory=list)  # one per input shape checked against LeRobot
    _original: Any = None  # LeRobot's own bound sample_actions
    _passed: set = field(default_factory=set)
    _lock: Any = field(default_factory=threading.Lock)
    _zero_state: dict = field(default_factory=dict)

    @property
    def levers(self) -> str:
        return self.engine.name

    def install(self) -> None:
        """Sample with vlaperf again after `restore()` (accelerate_lerobot installs it the first time)."""
        core = self.policy.model
        current = core.__dict__.get("sample_actions")
        if current is not None and current != self.sample_actions:
            raise ValueError("policy: already accelerated by another accelerator; call restore() on that one first")
        core.sample_actions = self.sample_actions  # an instance attribute: it shadows the class's method

    def restore(self) -> None:
        """LeRobot's own `sample_actions` again; `install()` puts vlaperf's back."""
        core = self.policy.model
        if core.__dict__.get("sample_actions") == self.sample_actions:
            del core.sample_actions

    # LeRobot calls pi0's core as (images, img_masks, lang_tokens, lang_masks, state, noise=, num_steps=, **rtc)
    # and pi0.5's as (images, img_masks, tokens, masks, noise=, num_steps=, **rtc).
    @torch.no_grad()
    def sample_actions(self, images, img_masks, lang_tokens, lang_masks, *args, noise=None, num_steps=None, **kwargs):
        cfg = self.model.config
        rtc = sorted(k for k in kwargs if k in RTC_ARGUMENTS and kwargs[k] is not None)
        if rtc:
            raise ValueError(f"{', '.join(rtc)}: real-time chunking (RTC) is not implemented in vlaperf's engine; "
                             "call restore() on the accelerator to sample with LeRobot's own loop")
        unknown = sorted(k for k in kwargs if k not in RTC_ARGUMENTS)
        if unknown:
            raise TypeError(f"sample_actions: unexpected arguments {unknown}")
        positional = ("state", "noise", "num_steps") if not cfg.pi05 else ("noise", "num_steps")
        if len(args) > len(positional):
            raise TypeError(f"sample_actions: {4 + len(args)} positional arguments, expected at most "
                            f"{4 + len(positional)}")
        given = dict(zip(positional, args))
        if "state" not in given and not cfg.pi05:
            raise TypeError("sample_actions: pi0's `state` (B, max_state_dim) is missing")
        noise = given.get("noise", noise)
        num_steps = given.get("num_steps", num_steps)
        if num_steps is None:
            num_steps = self.policy.config.num_inference_steps
        tokens = lang_tokens
        B, device = tokens.shape[0], tokens.device
        if noise is None:  # LeRobot's own draw, so a seeded run draws what it drew before
            noise = self.policy.model.sample_noise((B, cfg.action_horizon, cfg.action_dim), device)
        state = given.get("state")
        if state is None:  # pi0.5 reads its state from the prompt; the engine's input still has the slot
            state = self._zero_state.get((B, device))
            if state is None:
                state = self._zero_state[(B, device)] = torch.zeros(B, cfg.action_dim, device=device)
        obs = _observation(images, img_masks, tokens, lang_masks, state.float())
        key = (tuple(obs.images.shape), obs.host_image_valid, obs.host_prompt_len, tokens.shape[1], int(num_steps))
        with self._lock:
            if not self.check or key in self._passed:
                return self.engine.sample_actions(obs, noise, num_steps)
            original = (images, img_masks, lang_tokens, lang_masks) + ((state,) if not cfg.pi05 else ())
            theirs = self._original(*original, noise=noise.clone(), num_steps=num_steps)
            ours = self.engine.sample_actions(obs, noise, num_steps)
            metrics = action_metrics(ours, theirs.float(), self.model.dtype)
            record = {"batch": B, "image_slots": obs.images.shape[1], "images_valid": list(obs.host_image_valid),
                      "prompt_len": obs.host_prompt_len, "prompt_slots": tokens.shape[1], "num_steps": int(num_steps),
                      **{k: metrics[k] for k in ("max_abs", "rel_l2", "tolerance", "passed")}}
            self.checks.append(record)
            if not metrics["passed"]:
                raise NotEquivalent(f"vlaperf's {self.levers} is not equivalent to LeRobot's sample_actions for "
                                    f"this input shape: rel L2 {metrics['rel_l2']:.3g} > tolerance "
                                    f"{metrics['tolerance']:.3g} (max abs {metrics['max_abs']:.3g}); no actions "
                                    "returned. Try fewer levers, or restore() the accelerator")
            self._passed.add(key)
            return ours


def _observation(images: list[Tensor], img_masks: list[Tensor], tokens: Tensor, token_mask: Tensor,
                 state: Tensor) -> Observation:
    """LeRobot's core inputs (a list of (B, 3, H, W) images in [-1, 1], a list of (B,) masks) as vlaperf's
    Observation, with the host-side record of its masks read in one device-to-host copy."""
    if len(images) != len(img_masks) or not images:
        raise ValueError(f"images / img_masks: {len(images)} images and {len(img_masks)} masks, expected one mask "
                         "per image and at least one image")
    image_mask = torch.stack([m.bool() for m in img_masks], dim=1)
    token_mask = token_mask.bool()
    S = image_mask.shape[1]
    # right padding (as LeRobot's tokenizer pads) is what lets the engine keep the first tokens
    left_padded = (token_mask[:, 1:] & ~token_mask[:, :-1]).any().reshape(1)
    flags = torch.cat([image_mask.any(0), token_mask.any(0), left_padded]).cpu()  # the one read of the call
    if bool(flags[-1]):
        raise ValueError("lang_masks: a prompt has padding before a valid token; vlaperf's engine keeps the first "
                         "tokens, so prompts must be padded on the right (as LeRobot's tokenizer pads them)")
    return Observation(torch.stack(images, dim=1), image_mask, tokens, token_mask, state,
                       host_image_valid=tuple(bool(v) for v in flags[:S]), host_prompt_len=int(flags[S:-1].sum()))


def accelerate_lerobot(policy, levers: str = "best", check: bool = True, engine=None) -> LeRobotAccelerator:
    """Make LeRobot's `policy` (a built PI0Policy / PI05Policy, in eval mode, on its device) sample its actions
    with vlaperf's engine of `levers` ("best": the fastest variant for the device). Returns the accelerator:
    its `checks`, `engine`, `model`, `restore()` and `install()`. See the module doc.

    `engine`: an Engine already built over a vlaperf model that holds this policy's weights (as `vlaperf
    compare` has one), used instead of building a second copy; `levers` is then ignored. The checks against
    LeRobot still run, so an engine of other weights is caught on its first call."""
    from vlaperf.engine import Engine

    core = getattr(policy, "model", None)
    if core is None or not callable(getattr(core, "sample_actions", None)):
        raise TypeError(f"policy: expected LeRobot's PI0Policy or PI05Policy (a `model` with `sample_actions`), got "
                        f"{type(policy).__name__}")
    if "sample_actions" in core.__dict__:
        raise ValueError("policy: already accelerated; call restore() on its accelerator first")
    rtc = getattr(policy.config, "rtc_config", None)
    if rtc is not None and getattr(rtc, "enabled", False):
        raise ValueError("policy.config.rtc_config: real-time chunking is enabled, and vlaperf's engine does not "
                         "implement its guidance")
    if engine is None:
        cfg = lerobot_model_config(policy)
        engine = Engine(vlaperf_from_lerobot(policy, cfg, policy_dtype(policy)), levers)
    fast = LeRobotAccelerator(policy, engine.model, engine, check, _original=core.sample_actions)
    fast.install()
    return fast


__all__ = ["NotEquivalent", "LeRobotAccelerator", "accelerate_lerobot", "lerobot_model_config", "policy_dtype"]
