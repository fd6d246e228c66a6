"""vlaperf's engine inside a LeRobot or openpi pi0 / pi0.5 policy object.

    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from vlaperf.compare.accelerate import accelerate_lerobot

    policy = PI0Policy.from_pretrained("lerobot/pi0_libero").to("cuda").eval()
    fast = accelerate_lerobot(policy, levers="best")   # the same object, now sampling with vlaperf
    action = policy.select_action(batch)               # LeRobot's pre-processing, queue and eval loop as before
    fast.checks                                         # each input shape's first call, checked against LeRobot
    fast.restore()                                      # LeRobot's own sample_actions again

    policy = openpi.policies.policy_config.create_trained_policy(train_config, pytorch_checkpoint_dir)
    fast = accelerate_openpi(policy)                   # openpi's Policy.infer, now sampling with vlaperf

    run_lerobot_eval(["--policy.path=lerobot/pi0_libero", "--env.type=libero"])  # `vlaperf lerobot-eval`

What is replaced: only the sampling call. For LeRobot, the core model's `sample_actions` (`policy.model`), the
one call `predict_action_chunk` (and with it `select_action`) makes after its pre-processing: its tokenizer and
normalisation processors, image resizing and [-1, 1] mapping, empty-camera padding and action queue run
unchanged, except that the policy's `eval()`, which `predict_action_chunk` calls first, walks the module tree only
when something is in training mode (3.8 ms a call saved on an H100's host; see `LeRobotAccelerator.install`). For
openpi, the Policy's `_sample_actions` (the model's `sample_actions`, bound when the Policy was
built) or, given the model alone, its `sample_actions`: openpi's transforms, its `Observation` and its own
preprocessing (`_preprocess_observation`) run unchanged. An evaluation script needs no other change.

The engine's model is built from the peer's own state dict with vlaperf's strict loader, in the layout openpi
uses for the dtype (under bfloat16 LeRobot keeps SigLIP and the projector in float32, vlaperf in bfloat16). The
sizes are read from the peer's module configs, so a model of any size the peer built loads.

Checked, not assumed: unless `check=False`, the first call of every new input shape (batch, camera slots and
which of them hold an image, the prompt bucket, the step count) also runs the peer's own eager `sample_actions`
on the same inputs and noise, and raises `NotEquivalent` instead of answering if vlaperf's actions are further
from the peer's than vlaperf's tolerance for the dtype (`vlaperf.check.REL_L2_TOLERANCE`). Each check is kept
in `checks`. A new shape is also where the engine captures a new CUDA graph, so the check's call lands where the
first call is slow anyway.

Noise: where the caller gives none, it is drawn with the peer's own `sample_noise`, so a seeded run draws what
it drew before. Each call reads the masks to the host once (one small device-to-host copy): the peer's inputs
carry no host-side record of which cameras are empty or how long the prompt is, and the engine's plan (which
slots to embed, how many prompt tokens to keep) is made on the host.

Real-time chunking: with LeRobot's `rtc_config.enabled`, a call given the previous chunk's leftover
(`prev_chunk_left_over`, `inference_delay`, `execution_horizon`, as `predict_action_chunk` passes them) is guided
toward it inside the engine's loop (vlaperf.models.pi0.Guidance), with LeRobot's own prefix weights
(`rtc_processor.get_prefix_weights`) and the paper's guidance weight per step clamped at `max_guidance_weight`; a
guided call is checked against LeRobot's own RTC call once per input shape, as any other. Not supported: RTC's
debug tracking (`rtc_config.debug`), which records each step's internals; it is refused when the policy is
accelerated. `restore()` hands the call back to the peer, as it was (a `torch.compile`d call included).

Memory: the peer's weights stay where they are (its training path and the checks use them); the engine's model
is a second copy in vlaperf's layout, held once: where the engine fuses projections, the model's own copies of
those weights are freed (`released_bytes`), since the accelerator never runs vlaperf's reference path.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vlaperf.compare import action_metrics
from vlaperf.compare.lerobot import lerobot_model_config, policy_dtype, vlaperf_from_lerobot
from vlaperf.inputs import Observation
from vlaperf.models.pi0 import Guidance, rtc_step_weights

RTC_ARGUMENTS = ("inference_delay", "prev_chunk_left_over", "execution_horizon")


class NotEquivalent(RuntimeError):
    """vlaperf's actions for an input shape were further from the peer's than the tolerance allows. `check`: that
    check's record (the shape, max_abs, rel_l2, tolerance, passed), as kept in the accelerator's `checks`, so that
    a caller can record the numbers without parsing the message."""

    def __init__(self, message: str, check: dict | None = None):
        super().__init__(message)
        self.check = check


@dataclass(eq=False)
class Accelerator:
    """vlaperf's engine installed as a peer's sampling call: `target.<attribute>` (an instance attribute, which
    shadows the class's method) is this object's `sample_actions` while installed. What `restore()` puts back is
    what was there: an instance attribute of the peer's own (a `torch.compile`d sample_actions) or the class's
    method. The checks compare against `reference`, the peer's eager method, never a compiled one (a check must not
    wait minutes for a compile, and eager is what a compiled call approximates)."""

    target: Any  # the object whose attribute is replaced
    attribute: str
    model: Any  # vlaperf's Pi0Model holding the peer's weights
    engine: Any  # vlaperf's Engine over it
    check: bool
    reference: Any = None  # the peer's eager sampling call, for the checks
    checks: list[dict] = field(default_factory=list)  # one per input shape checked against the peer
    peer: str = "LeRobot"
    released_bytes: int = 0  # vlaperf's reference copies freed where the engine holds fused ones
    _previous: Any = None  # the instance attribute the peer had there, if any
    _passed: set = field(default_factory=set)
    _lock: Any = field(default_factory=threading.Lock)
    _zero_state: dict = field(default_factory=dict)

    @property
    def levers(self) -> str:
        return self.engine.name

    def install(self) -> None:
        """Sample with vlaperf (again, after `restore()`)."""
        current = self.target.__dict__.get(self.attribute)
        if current == self.sample_actions:
            return
        if isinstance(getattr(current, "__self__", None), Accelerator):
            raise ValueError("already accelerated; call restore() on that accelerator first")
        self._previous = current
        setattr(self.target, self.attribute, self.sample_actions)

    def restore(self) -> None:
        """The peer's own call again, as it was before `install()`; `install()` puts vlaperf's back."""
        if self.target.__dict__.get(self.attribute) != self.sample_actions:
            return
        if self._previous is None:
            delattr(self.target, self.attribute)
        else:
            setattr(self.target, self.attribute, self._previous)

    def sample_actions(self, *args, **kwargs):
        raise NotImplementedError

    def _run(self, images, img_masks, tokens, token_mask, state, noise, num_steps: int, reference_call,
             guidance: Guidance | None = None):
        """The engine's actions for the peer's core inputs; on a shape's first call, checked against
        `reference_call(noise)` (the peer's own actions for the same inputs and that noise)."""
        cfg = self.model.config
        B, device = tokens.shape[0], tokens.device
        if state is None:  # pi0.5 reads its state from the prompt; the engine's input still has the slot
            state = self._zero_state.get((B, device))
            if state is None:
                state = self._zero_state[(B, device)] = torch.zeros(B, cfg.action_dim, device=device)
        obs = _observation(images, img_masks, tokens, token_mask, state.float())
        key = (tuple(obs.images.shape), obs.host_image_valid, obs.host_prompt_len, tokens.shape[1], int(num_steps),
               guidance is not None)
        with self._lock:
            if not self.check or key in self._passed:
                return self._engine_actions(obs, noise, num_steps, guidance)
            theirs = reference_call(noise.clone())
            ours = self._engine_actions(obs, noise, num_steps, guidance)
            metrics = action_metrics(ours, theirs.float(), self.model.dtype)
            record = {"batch": B, "image_slots": obs.images.shape[1], "images_valid": list(obs.host_image_valid),
                      "prompt_len": obs.host_prompt_len, "prompt_slots": tokens.shape[1], "num_steps": int(num_steps),
                      "guided": guidance is not None,
                      **{k: metrics[k] for k in ("max_abs", "rel_l2", "tolerance", "passed")}}
            self.checks.append(record)
            if not metrics["passed"]:
                raise NotEquivalent(f"vlaperf's {self.levers} is not equivalent to {self.peer}'s sample_actions for "
                                    f"this input shape: rel L2 {metrics['rel_l2']:.3g} > tolerance "
                                    f"{metrics['tolerance']:.3g} (max abs {metrics['max_abs']:.3g}); no actions "
                                    "returned. Try fewer levers, or restore() the accelerator", check=record)
            self._passed.add(key)
            return ours

    def _engine_actions(self, obs: Observation, noise: Tensor, num_steps: int, guidance: Guidance | None) -> Tensor:
        actions = self.engine.sample_actions(obs, noise, num_steps, guidance)
        # With `megakernel`, a grid barrier that gave up means wrong actions: its flag is read here (a sync, which the
        # caller's copy of the actions to the host makes anyway), so no wrong chunk reaches a robot
        self.engine.raise_on_kernel_fault()
        return actions


@dataclass(eq=False)
class LeRobotAccelerator(Accelerator):
    """`accelerate_lerobot`'s: installed as the core model's `sample_actions` (`policy.model`)."""

    policy: Any = None
    _prefix_weights: dict = field(default_factory=dict)  # (delay, execution horizon, schedule, device) -> (H,)
    _step_weights: dict = field(default_factory=dict)  # (num_steps, max guidance weight, device) -> (num_steps,)

    # LeRobot's predict_action_chunk begins with self.eval(), which walks the whole module tree on every call: 824
    # modules for pi0, 3.8 ms of an accelerated 18.2 ms call on an H100's host, more than the accelerator's own
    # conversion and LeRobot's image preprocessing together (benchmarks/lerobot_predict_overhead_probe.py, session
    # 47). While installed, the policy's eval() walks the tree only when the policy or its core model is in
    # training mode (train() was called since), and is otherwise the no-op it would have been. A train() on a
    # deeper submodule alone is not seen: switch modes on the policy, as LeRobot does.
    def install(self) -> None:
        super().install()
        if "eval" not in vars(self.policy) and self.target.__dict__.get(self.attribute) == self.sample_actions:
            self.policy.eval = self._eval

    def restore(self) -> None:
        super().restore()
        if vars(self.policy).get("eval") == self._eval:
            del vars(self.policy)["eval"]

    def _eval(self):
        policy = self.policy
        if policy.training or self.target.training:
            return type(policy).eval(policy)
        return policy

    # LeRobot calls pi0's core as (images, img_masks, lang_tokens, lang_masks, state, noise=, num_steps=, **rtc)
    # and pi0.5's as (images, img_masks, tokens, masks, noise=, num_steps=, **rtc).
    @torch.no_grad()
    def sample_actions(self, images, img_masks, lang_tokens, lang_masks, *args, noise=None, num_steps=None, **kwargs):
        cfg = self.model.config
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
        B, device = lang_tokens.shape[0], lang_tokens.device
        if noise is None:  # LeRobot's own draw, so a seeded run draws what it drew before
            noise = self.policy.model.sample_noise((B, cfg.action_horizon, cfg.action_dim), device)
        state = given.get("state")
        inputs = (images, img_masks, lang_tokens, lang_masks) + ((state,) if not cfg.pi05 else ())
        guidance = self._guidance(B, num_steps, device, **kwargs)
        return self._run(images, img_masks, lang_tokens, lang_masks, state, noise, num_steps,
                         lambda n: self.reference(*inputs, noise=n, num_steps=num_steps, **kwargs), guidance)

    def _guidance(self, B: int, num_steps: int, device: torch.device, inference_delay=None, prev_chunk_left_over=None,
                  execution_horizon=None) -> Guidance | None:
        """LeRobot's real-time chunking for this call as a Guidance, or None where LeRobot would not guide: RTC
        off in the policy's config, or no previous chunk given (the first chunk of an episode)."""
        core = self.policy.model
        rtc_config = getattr(self.policy.config, "rtc_config", None)
        if prev_chunk_left_over is None or rtc_config is None or not rtc_config.enabled:
            return None
        cfg = self.model.config
        H, A = cfg.action_horizon, cfg.action_dim
        prev = prev_chunk_left_over
        if isinstance(prev, Tensor) and prev.dim() == 2:
            prev = prev[None]
        if not isinstance(prev, Tensor) or prev.dim() != 3 or prev.shape[0] not in (1, B) or prev.shape[1] > H \
                or prev.shape[2] > A:
            got = tuple(prev.shape) if isinstance(prev, Tensor) else type(prev).__name__
            raise ValueError(f"prev_chunk_left_over: expected a tensor (B={B} or 1, T <= {H}, A <= {A}) or (T, A), "
                             f"got {got}")
        if isinstance(inference_delay, bool) or not isinstance(inference_delay, int) or inference_delay < 0:
            raise ValueError(f"inference_delay: expected an integer >= 0 with prev_chunk_left_over, got "
                             f"{inference_delay!r}")
        horizon = rtc_config.execution_horizon if execution_horizon is None else int(execution_horizon)
        horizon = min(horizon, prev.shape[1])  # as LeRobot: nothing to hold beyond the leftover
        target = torch.zeros(B, H, A, dtype=torch.float32, device=device)
        target[:, : prev.shape[1], : prev.shape[2]] = prev.to(device, torch.float32)
        key = (inference_delay, horizon, str(rtc_config.prefix_attention_schedule), device)
        if key not in self._prefix_weights:  # LeRobot's own schedule (linear, exponential, ones, zeros)
            weights = core.rtc_processor.get_prefix_weights(inference_delay, horizon, H)
            self._prefix_weights[key] = weights.to(device, torch.float32)
        steps_key = (num_steps, float(rtc_config.max_guidance_weight), device)
        if steps_key not in self._step_weights:
            self._step_weights[steps_key] = rtc_step_weights(num_steps, rtc_config.max_guidance_weight, device)
        return Guidance(target, self._prefix_weights[key], self._step_weights[steps_key])


@dataclass(eq=False)
class OpenpiAccelerator(Accelerator):
    """`accelerate_openpi`'s: installed as openpi's Policy's `_sample_actions` or as PI0Pytorch's `sample_actions`."""

    openpi_model: Any = None

    @torch.no_grad()
    def sample_actions(self, device, observation, noise=None, num_steps=10):
        m, cfg = self.openpi_model, self.model.config
        # openpi's own preprocessing (resize with padding where needed, masks defaulting to valid), as its call does
        images, img_masks, tokens, token_mask, state = m._preprocess_observation(observation, train=False)
        B = tokens.shape[0]
        if noise is None:  # openpi's own draw
            noise = m.sample_noise((B, cfg.action_horizon, cfg.action_dim), tokens.device)
        return self._run(images, img_masks, tokens, token_mask, state, noise, num_steps,
                         lambda n: self.reference(device, observation, noise=n, num_steps=num_steps))


def _observation(images: list[Tensor], img_masks: list[Tensor], tokens: Tensor, token_mask: Tensor,
                 state: Tensor) -> Observation:
    """A peer's core inputs (LeRobot's, or openpi's after its preprocessing: a list of (B, 3, H, W) images in
    [-1, 1], a list of (B,) masks, the prompt and its mask, the state) as vlaperf's Observation, with the host-side
    record of its masks read in one device-to-host copy."""
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
        raise ValueError("lang_masks (openpi: tokenized_prompt_mask): a prompt has padding before a valid token; "
                         "vlaperf's engine keeps the first tokens, so prompts must be padded on the right (as LeRobot's "
                         "and openpi's tokenizers pad them)")
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
    if core is None or not callable(getattr(type(core), "sample_actions", None)):
        raise TypeError(f"policy: expected LeRobot's PI0Policy or PI05Policy (a `model` with `sample_actions`), got "
                        f"{type(policy).__name__}")
    _refuse_twice(core, "sample_actions", "policy")
    rtc = getattr(policy.config, "rtc_config", None)
    if rtc is not None and getattr(rtc, "debug", False):
        raise ValueError("policy.config.rtc_config.debug: RTC's debug tracking records each denoise step's internals, "
                         "which vlaperf's engine (one CUDA graph a call) does not expose; set debug=False")
    released = 0
    if engine is None:
        cfg = lerobot_model_config(policy)
        engine = Engine(vlaperf_from_lerobot(policy, cfg, policy_dtype(policy)), levers)
        released = engine.release_reference_weights()  # the checks compare against LeRobot, never vlaperf's reference
    fast = LeRobotAccelerator(core, "sample_actions", engine.model, engine, check, released_bytes=released,
                              reference=type(core).sample_actions.__get__(core), policy=policy)
    fast.install()
    return fast


def accelerate_openpi(policy_or_model, levers: str = "best", check: bool = True) -> OpenpiAccelerator:
    """Make openpi's PyTorch pi0 / pi0.5 sample with vlaperf's engine of `levers`: given openpi's `Policy` (as
    `create_trained_policy` returns it, for a PyTorch checkpoint), its `_sample_actions`; given a `PI0Pytorch`,
    its `sample_actions`. openpi's input transforms, its `Observation`, its preprocessing (resize with padding,
    masks) and its output transforms run unchanged. Each new input shape is checked once against openpi's own
    eager `sample_actions`, as `accelerate_lerobot` does. Returns the accelerator (`checks`, `restore()`)."""
    from vlaperf.compare.openpi import openpi_config, vlaperf_from_openpi
    from vlaperf.engine import Engine

    model = getattr(policy_or_model, "_model", policy_or_model)
    is_policy = model is not policy_or_model
    if is_policy and not getattr(policy_or_model, "_is_pytorch_model", False):
        raise TypeError("policy: an openpi Policy around a JAX model; vlaperf accelerates openpi's PyTorch model "
                        "(a PyTorch checkpoint, is_pytorch=True)")
    if not callable(getattr(type(model), "sample_actions", None)) or not hasattr(model, "_preprocess_observation"):
        raise TypeError(f"policy_or_model: expected openpi's Policy or its PI0Pytorch, got "
                        f"{type(policy_or_model).__name__}")
    target, attribute = (policy_or_model, "_sample_actions") if is_policy else (model, "sample_actions")
    _refuse_twice(target, attribute, "policy_or_model")
    engine = Engine(vlaperf_from_openpi(model, openpi_config(model)), levers)
    released = engine.release_reference_weights()  # the checks compare against openpi, never vlaperf's reference
    fast = OpenpiAccelerator(target, attribute, engine.model, engine, check, released_bytes=released,
                             reference=type(model).sample_actions.__get__(model), peer="openpi", openpi_model=model)
    fast.install()
    return fast


def run_lerobot_eval(lerobot_args: list[str], levers: str = "best", check: bool = True) -> list[LeRobotAccelerator]:
    """LeRobot's own `lerobot-eval` run with `lerobot_args`, its pi0 / pi0.5 policy accelerated: the `make_policy`
    the eval script calls is wrapped for the run, so the policy it builds gets `accelerate_lerobot` before the first
    episode. The rest is LeRobot's own: environments, processors, episodes, videos, its eval_info.json. Returns the
    accelerators made (their `checks`)."""
    import importlib

    from vlaperf.compare.lerobot import LeRobotUnavailable, import_lerobot

    from vlaperf.engine.levers import Levers

    Levers.parse(levers)  # a wrong lever list now, not after LeRobot has built its environments and policy
    import_lerobot(pi05=False)  # LeRobot itself first, with the message that says how to install it
    try:
        script = importlib.import_module("lerobot.scripts.lerobot_eval")
    except Exception as e:  # noqa: BLE001 - e.g. its dataset extra, which the policies alone do not need
        raise LeRobotUnavailable(f"LeRobot's eval script (lerobot.scripts.lerobot_eval) is not importable here: "
                                 f"{type(e).__name__}: {e}") from e
    made: list[LeRobotAccelerator] = []
    build = script.make_policy

    def make_policy(*args, **kwargs):
        policy = build(*args, **kwargs)
        kind = getattr(policy, "name", None)  # LeRobot's policy classes name their type: "pi0", "pi05", "act", ...
        if kind not in ("pi0", "pi05"):
            raise ValueError(f"--policy: vlaperf accelerates LeRobot's pi0 and pi0.5 policies, not "
                             f"{kind or type(policy).__name__}")
        if getattr(policy.config, "use_amp", False):
            raise ValueError("--policy.use_amp: LeRobot would run the policy under torch.autocast, which vlaperf's "
                             "engine (in the policy's own dtype) does not take; run without it")
        made.append(accelerate_lerobot(policy, levers, check))
        return policy

    argv = sys.argv
    script.make_policy, sys.argv = make_policy, ["lerobot-eval", *lerobot_args]
    try:
        script.main()
    finally:
        script.make_policy, sys.argv = build, argv
    return made


def _refuse_twice(target, attribute: str, name: str) -> None:
    if isinstance(getattr(target.__dict__.get(attribute), "__self__", None), Accelerator):
        raise ValueError(f"{name}: already accelerated; call restore() on its accelerator first")


__all__ = ["NotEquivalent", "Accelerator", "LeRobotAccelerator", "OpenpiAccelerator", "accelerate_lerobot",
           "accelerate_openpi", "run_lerobot_eval"]
