"""Policy mode: the path a policy server runs per request.

numpy observation dict -> validate/resize/normalise/tokenize -> host-to-device -> sample
-> device-to-host -> numpy actions unpadded to the robot's action dim.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np
import torch

from vlaperf.inputs import ObservationTransform, Tokenizer, check_fits
from vlaperf.models.pi0 import RtcConfig  # also importable from here, beside RtcRequest and ModelChunk
from vlaperf.workloads import Workload


class NonFiniteActions(RuntimeError):
    """The policy computed NaN or inf actions: never handed to a robot. `rows`: the batch rows at fault;
    `actions` and `timing`: the whole batch's, so that a server can still answer the finite rows; `chunks`: the
    batch's `ModelChunk`s and which rows were guided, where the call kept them (real-time chunking), else None."""

    def __init__(self, message: str, rows: list[int] | None = None, actions: np.ndarray | None = None,
                 timing: dict | None = None, chunks: list | None = None, guided: list | None = None):
        super().__init__(message)
        self.rows, self.actions, self.timing, self.chunks, self.guided = rows, actions, timing, chunks, guided

    def __reduce__(self):  # the rows survive pickling (a Ray Serve replica's error reaching the front end)
        return type(self), (str(self), self.rows, self.actions, self.timing, self.chunks, self.guided)


@dataclasses.dataclass(frozen=True)
class ModelChunk:
    """A chunk as the model produced it, kept for real-time chunking's next call: `actions` (H, A) float32 in the
    model's units (normalized, padded to the model's action dim), and `state` (D,) float64, the state it was
    computed from in the model's space before normalization (what delta actions are relative to)."""

    actions: np.ndarray
    state: np.ndarray


@dataclasses.dataclass(frozen=True)
class RtcRequest:
    """One observation's real-time chunking (`Policy.infer(..., rtc=)`): `previous`, the chunk this robot is
    executing (the `ModelChunk` its last call returned); `executed`, how many of its actions had been executed when
    this observation was taken; `delay`, how many more the robot executes while this chunk is computed (they are
    frozen: held to the previous chunk with weight 1). The rest of the previous chunk, up to the execution
    horizon, guides the new one with fading weight."""

    previous: ModelChunk
    executed: int
    delay: int


def finite_actions(actions: np.ndarray, timing: dict | None = None) -> np.ndarray:
    """`actions` (B, ...) as they are, or NonFiniteActions naming the rows that hold NaN or inf."""
    finite_rows = np.isfinite(actions.reshape(actions.shape[0], -1)).all(axis=1)
    if not finite_rows.all():
        raise NonFiniteActions("the actions hold NaN or inf, so they are not returned: check the observation's values "
                               "(e.g. a state far outside the robot's range); if every observation does this, the "
                               "model's weights are at fault", np.flatnonzero(~finite_rows).tolist(), actions, timing)
    return actions


def load_checkpoint_io(tokenizer_file: str | None, norm_stats_path: str | None, config,
                       conventions=None) -> tuple[Any, Any]:
    """A real checkpoint's tokenizer and statistics, as `vlaperf serve --tokenizer --norm-stats` takes
    them: (PaligemmaTokenizer or None, NormStats or None). ValueError (or ImportError: no sentencepiece)
    names what is wrong; the statistics' kind follows the model (quantiles for pi0.5, as openpi's configs);
    the tokenizer's prompt style follows `conventions` (`vlaperf.conventions`)."""
    from vlaperf.conventions import get_conventions
    from vlaperf.inputs import PaligemmaTokenizer
    from vlaperf.normalize import NormStats

    tokenizer = norm_stats = None
    if tokenizer_file is not None and not str(tokenizer_file).strip():
        raise ValueError("tokenizer path: empty (an unset variable?); expected PaliGemma's paligemma_tokenizer.model")
    if tokenizer_file is not None:
        try:
            tokenizer = PaligemmaTokenizer(tokenizer_file, style=get_conventions(conventions).prompt_style)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
        if tokenizer.vocab_size > config.backbone.vocab_size:
            raise ValueError(f"tokenizer {tokenizer_file!r}: {tokenizer.vocab_size} ids, more than the model's "
                             f"vocabulary ({config.backbone.vocab_size})")
    if norm_stats_path is not None:
        norm_stats = NormStats.load(norm_stats_path, quantile=config.pi05)
    return tokenizer, norm_stats


def served_conventions(conventions, norm_stats, workload: Workload):
    """The conventions a policy serves: `conventions` (a `Conventions`), with a LeRobot pipeline's relative
    actions (`norm_stats.relative_actions`) as their delta mask, so the raw state is added back after
    unnormalizing as LeRobot's postprocessor does. ValueError where both would add the state, or the state is
    shorter than the actions."""
    relative = getattr(norm_stats, "relative_actions", None)
    if relative is None:
        return conventions
    if conventions.delta_action_mask or conventions.aloha_adapt_to_pi or conventions.name.startswith("openpi:"):
        why = ("do too (the state would be added twice)" if conventions.delta_action_mask else
               "are openpi's (LeRobot adds back the raw state, in the robot's space)")
        raise ValueError(f"{norm_stats.source}: the pipeline makes the actions relative to the state, and conventions "
                         f"{conventions.name!r} {why}; a LeRobot checkpoint takes lerobot:pi0, lerobot:pi05, "
                         "lerobot0.4:pi05 or none")
    mask = relative.mask(workload.robot_action_dim)
    if workload.state_dim < len(mask):
        raise ValueError(f"{norm_stats.source}: relative actions need a state of at least the {len(mask)} action "
                         f"dims; the workload's state has {workload.state_dim}")
    return dataclasses.replace(conventions, delta_action_mask=mask)


class Policy:
    """`infer(example) -> {"actions": (H, robot_action_dim) float32, "policy_timing": {...}}`.

    `sample` is any `(obs, noise, num_steps) -> actions` function: the reference
    `model.sample_actions` or an `Engine.sample_actions`. Noise is fresh per call unless
    `noise` is given (benchmarks pass a fixed one; it serves calls of its batch size, others
    get fresh noise). `verify`, if given, runs after the actions reach the host and raises if
    they cannot be trusted (`Engine.raise_on_kernel_fault`).
    `norm_stats` (`vlaperf.normalize.NormStats`, a checkpoint's openpi statistics): the state is
    normalized before the model and the actions unnormalized after it; without them (random weights,
    benchmarks) both stay in the model's units. `conventions` (`vlaperf.conventions`, a name or a
    Conventions; None: "none"): what the checkpoint's training did around the model besides, e.g. openpi
    pi0_libero's delta actions, whose state is added back after unnormalizing.
    `rtc` (`vlaperf.models.pi0.RtcConfig`): real-time chunking's settings, for calls that pass `rtc=`.
    """

    def __init__(self, model, sample: Callable, workload: Workload, tokenizer: Tokenizer | None = None,
                 num_steps: int | None = None, noise: torch.Tensor | None = None,
                 verify: Callable[[], None] | None = None, norm_stats=None, conventions=None, rtc=None):
        if not isinstance(workload, Workload):  # a world-action workload failed later on a missing attribute
            raise TypeError(f"workload: expected a pi0-family Workload (vlaperf.workloads.get_workload), got "
                            f"{type(workload).__name__}" + (": serve the world-action model with WamPolicy"
                                                            if type(workload).__name__ == "WamWorkload" else ""))
        check_fits(workload, model.config)
        self.model, self.sample, self.workload, self.verify = model, sample, workload, verify
        self.device = model.action_in_proj.weight.device
        self.norm_stats = norm_stats
        self.transform = ObservationTransform(workload, model.config, tokenizer, self.device, norm_stats, conventions)
        self.conventions = served_conventions(self.transform.conventions, norm_stats, workload)
        trained = self.conventions.action_horizon
        if trained is not None and trained != model.config.action_horizon:
            raise ValueError(f"conventions {self.conventions.name!r} were trained with {trained} actions a chunk; the "
                             f"model has {model.config.action_horizon} (build it with action_horizon={trained}, "
                             f"`vlaperf serve --action-horizon {trained}`)")
        from vlaperf.models.pi0 import check_num_steps

        self.num_steps = check_num_steps(workload.steps if num_steps is None else num_steps,
                                         note=f" (or None: the workload's {workload.steps})")
        self.noise = noise
        if rtc is not None and not isinstance(rtc, RtcConfig):
            raise TypeError(f"rtc: expected a vlaperf.models.pi0.RtcConfig or None, got {type(rtc).__name__}")
        self.rtc = rtc
        self._step_weights: dict = {}  # num_steps -> rtc_step_weights on the device
        self._prefix_weights: dict = {}  # (delay, execution horizon) -> rtc_prefix_weights, (H,) numpy

    def infer(self, example: dict[str, Any] | list[dict[str, Any]],
              rtc: list[RtcRequest | None] | None = None) -> dict[str, Any]:
        """`rtc` (real-time chunking; the policy built with an RtcConfig): one `RtcRequest` or None (no previous
        chunk: unguided) per observation. With it the result also holds "chunks", the `ModelChunk` of each
        observation, which its next call passes back as `RtcRequest.previous`, and "guided", which rows were."""
        t0 = time.perf_counter()
        host = self.transform.host_arrays(example)
        guidance = guided = None
        arrays: tuple = ()
        if rtc is not None:
            arrays, guided = self._guidance(rtc, host.model_states)
        # the guidance's target and weights ride in the observation's one pinned transfer. As two copies of their
        # own from pageable memory, the served guided call cost 0.15 ms more over its unguided call than the
        # graph's guided replay did (H200); with them in the transfer, 0.10 ms (H100; docs/perf-notes.md, session 48)
        uploaded = self.transform.upload(host, extras=arrays)
        if arrays:
            from vlaperf.models.pi0 import Guidance

            guidance = Guidance(*uploaded.extras, self._step_weights[self.num_steps])
        obs = self.transform.preprocess(uploaded)
        noise = self.noise if self.noise is not None and self.noise.shape[0] == obs.batch else None
        t1 = time.perf_counter()
        if guidance is not None:
            actions = self.sample(obs, noise, self.num_steps, guidance=guidance)
        else:
            actions = self.sample(obs, noise, self.num_steps)
        # the whole (contiguous) chunk to the host, then the robot's dims: slicing on the device first
        # costs a copy kernel (H200: 0.039 against 0.021 ms, benchmarks/results/h200/upload_probe_libero-pi0.json)
        chunk = actions.cpu().numpy()
        chunks = None if rtc is None else [ModelChunk(chunk[i].astype(np.float32), np.asarray(s, np.float64))
                                           for i, s in enumerate(host.model_states)]
        out = chunk[..., : self.workload.robot_action_dim].astype(np.float32)
        if self.norm_stats is not None:
            out = self.norm_stats.unnormalize_actions(out)
        if self.conventions.changes_actions():  # openpi's order: unnormalize, absolute actions, ALOHA's space
            out = self.conventions.actions_to_robot(out, np.stack(host.model_states))
        if self.verify is not None:
            self.verify()  # a kernel fault first: it names the cause of what the next check would see
        t2 = time.perf_counter()
        timing = {"transform_ms": (t1 - t0) * 1e3, "sample_and_copy_ms": (t2 - t1) * 1e3, "infer_ms": (t2 - t0) * 1e3}
        try:
            finite_actions(out, timing)
        except NonFiniteActions as e:
            e.chunks, e.guided = chunks, guided
            raise
        result: dict[str, Any] = {"actions": out[0] if isinstance(example, dict) else out, "policy_timing": timing}
        if rtc is not None:
            result["chunks"], result["guided"] = chunks, guided
        return result

    def keep_warm(self, example: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Rerun `infer`'s host stages on `example` (a request already served) and wait for them: the transform, the
        one pinned upload and the device preprocess, not the model. A server calls it while no request waits
        (`vlaperf serve --keep-warm-ms`): after an idle the next call's host stages come back slower, and only
        running them again kept them warm (benchmarks/idle_decay_probe.py's rewarming_host; docs/serving.md). It
        holds the GPU for a few small kernels and one copy, not for a whole call."""
        self.transform.preprocess(self.transform.upload(self.transform.host_arrays(example)))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _guidance(self, rtc: list, model_states: list):
        """((target, weights) as host arrays, or () where no row is guided; [bool] per row) for `infer`'s `rtc`:
        each row's previous chunk from its `executed` position on, re-expressed relative to this observation's
        state where the actions are deltas (as LeRobot re-anchors a relative-action leftover), zero-padded; its
        prefix weights from its delay; rows without a previous chunk (or with nothing of it left) get zero
        weights, so they run unguided in the same call. The step weights are kept on the device per num_steps."""
        from vlaperf.models.pi0 import rtc_prefix_weights, rtc_step_weights

        cfg, B = self.model.config, len(model_states)
        H, A = cfg.action_horizon, cfg.action_dim
        if self.rtc is None:
            raise ValueError("rtc: this policy has no real-time chunking settings (build it with "
                             "rtc=vlaperf.models.pi0.RtcConfig(), `vlaperf serve --rtc`)")
        if not isinstance(rtc, (list, tuple)) or len(rtc) != B:
            raise ValueError(f"rtc: expected a list of {B} RtcRequest-or-None (one per observation), got "
                             f"{len(rtc) if isinstance(rtc, (list, tuple)) else type(rtc).__name__}")
        target = np.zeros((B, H, A), np.float32)
        weights = np.zeros((B, H), np.float32)
        guided = [False] * B
        for i, request in enumerate(rtc):
            if request is None:
                continue
            where = f"rtc[{i}]" if B > 1 else "rtc"
            if not isinstance(request, RtcRequest):
                raise ValueError(f"{where}: expected an RtcRequest or None, got {type(request).__name__}")
            for name in ("executed", "delay"):
                value = getattr(request, name)
                if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= H:
                    raise ValueError(f"{where}.{name}: expected an integer in [0, {H}] (the chunk's horizon), got "
                                     f"{value!r}")
            previous = request.previous
            if not isinstance(previous, ModelChunk) or np.shape(previous.actions) != (H, A):
                got = np.shape(previous.actions) if isinstance(previous, ModelChunk) else type(previous).__name__
                raise ValueError(f"{where}.previous: expected the ModelChunk of a call of this policy, actions "
                                 f"({H}, {A}), got {got}")
            left = H - int(request.executed)
            if left == 0:
                continue
            target[i, :left] = self._reanchored(previous, model_states[i])[int(request.executed):]
            key = (int(request.delay), min(self.rtc.execution_horizon, left))
            if key not in self._prefix_weights:  # a handful of (delay, horizon) pairs over a server's life
                self._prefix_weights[key] = rtc_prefix_weights(*key, H, self.rtc.schedule).numpy()
            weights[i] = self._prefix_weights[key]
            guided[i] = True
        if not any(guided):
            return (), guided
        if self.num_steps not in self._step_weights:
            self._step_weights[self.num_steps] = rtc_step_weights(self.num_steps, self.rtc.max_guidance_weight,
                                                                  self.device)
        return (target, weights), guided

    def _reanchored(self, previous: ModelChunk, state: np.ndarray) -> np.ndarray:
        """The previous chunk in the model's units, its delta dims made relative to `state` instead of the
        state it was computed from (unchanged where the actions are absolute)."""
        mask = self.conventions.delta_action_mask
        if not mask:
            return previous.actions
        actions = previous.actions.astype(np.float64)
        if self.norm_stats is not None:
            actions = self.norm_stats.unnormalize_actions64(actions)
        k = len(mask)
        actions[:, :k] += np.where(mask, previous.state[:k] - np.asarray(state)[:k], 0.0)
        if self.norm_stats is not None:
            actions = self.norm_stats.normalize_actions64(actions)
        return actions.astype(np.float32)


# ------------------------------------------------------------------ the world-action model

WAM_KEYS = ("observation/context_latent", "observation/state", "prompt")


def example_request(workload: Workload, seed: int = 0) -> dict[str, Any] | list[dict[str, Any]]:
    """What an openpi client sends for one call of `workload`: one raw example (batch 1) or a list of `batch` of
    them, seeds `seed`, `seed + 1`, ... (`make_example`'s 224 px images). Every policy-mode figure times it."""
    from vlaperf.inputs import make_example

    examples = [make_example(workload, seed=seed + i) for i in range(workload.batch)]
    return examples[0] if workload.batch == 1 else examples


def served_call(model, sample: Callable, workload: Workload, noise: torch.Tensor, seed: int = 0,
                verify: Callable[[], None] | None = None, rtc=None,
                previous: torch.Tensor | None = None) -> Callable[[], dict[str, Any]]:
    """One served call to time (policy mode): a Policy around `sample` with the fixed `noise` answering
    `example_request(workload, seed)`: the transform, the copies to the device, the model call and the actions back
    on the host. `verify` as Policy's: a server checks the step kernel's barriers after every call. `rtc` (an
    RtcConfig) with `previous` (B, H, A): each observation's guided call of real-time chunking, following its row
    of `previous` as check.rtc_guidance does (the host-side guidance and its copies to the device timed too)."""
    policy = Policy(model, sample, workload, num_steps=workload.steps, noise=noise, verify=verify, rtc=rtc)
    request = example_request(workload, seed)
    if rtc is None:
        return lambda: policy.infer(request)
    from vlaperf.check import RTC_DELAY, rtc_executed

    if previous is None:
        raise ValueError("previous: the chunk an RTC call follows, (B, H, A); got None")
    H = model.config.action_horizon
    state = np.zeros(workload.state_dim)  # what delta actions are relative to: none here (conventions "none")
    asks = [RtcRequest(ModelChunk(row.float().cpu().numpy(), state), rtc_executed(H), RTC_DELAY)
            for row in previous]
    return lambda: policy.infer(request, rtc=asks)


def make_wam_example(workload, seed: int = 0) -> dict[str, Any]:
    """One raw world-action observation as a client sends it (unbatched numpy): the observed
    frame's latent patches (context_frames, P, C) float32 (a video VAE encodes them from the
    camera image; vlaperf has none, so clients send latents), the state (state_dim,) float32
    and the instruction."""
    from vlaperf.models.wam import get_config

    cfg = get_config(workload.preset)
    rng = np.random.default_rng(seed)
    return {
        "observation/context_latent": rng.standard_normal((cfg.context_frames, cfg.patches, cfg.patch_channels), np.float32),
        "observation/state": rng.standard_normal(cfg.state_dim, np.float32),
        "prompt": "put the bowl on the plate",
    }


class HashTextEncoder:
    """A deterministic stand-in for the text encoder (umT5-XXL class), which cannot be downloaded
    here: a prompt -> (text_tokens, text_dim) float32 embedding seeded by a stable hash of its
    words. Shapes and costs are real; the values mean nothing to a trained model. Pass your own
    (any callable prompt -> array of that shape) to WamPolicy. Embeddings are cached per prompt,
    as a server would cache the encoder's output for an episode's instruction."""

    def __init__(self, text_tokens: int, text_dim: int, cache_size: int = 64):
        self.shape = (text_tokens, text_dim)
        self.cache: dict[str, np.ndarray] = {}
        self.cache_size = cache_size

    def __call__(self, prompt: str) -> np.ndarray:
        key = " ".join(prompt.lower().split())
        if key not in self.cache:
            import zlib

            if len(self.cache) >= self.cache_size:
                self.cache.pop(next(iter(self.cache)))
            rng = np.random.default_rng(zlib.crc32(key.encode()))
            self.cache[key] = rng.standard_normal(self.shape, np.float32)
        return self.cache[key]


class WamTransform:
    """World-action dicts -> WamObservation on the device; every field checked first."""

    def __init__(self, cfg, device, dtype, text_encoder=None):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.text_encoder = text_encoder or HashTextEncoder(cfg.text_tokens, cfg.text_dim)

    def _array(self, example: dict, key: str, shape: tuple[int, ...]) -> np.ndarray:
        from vlaperf.inputs import InputError

        if key not in example:
            raise InputError(f"{key}: missing; a world-action observation has {', '.join(WAM_KEYS)}")
        try:
            a = np.asarray(example[key])
        except ValueError as e:  # a ragged nested list
            raise InputError(f"{key}: expected a numeric array of shape {shape} ({e})") from None
        if a.dtype.kind not in "fiu":
            raise InputError(f"{key}: expected numbers, got dtype {a.dtype}")
        if a.shape != shape:
            raise InputError(f"{key}: expected shape {shape}, got {a.shape}")
        if not np.isfinite(a).all():
            raise InputError(f"{key}: holds NaN or inf")
        with np.errstate(over="ignore"):
            a32 = a.astype(np.float32, copy=False)
        if not np.isfinite(a32).all():
            raise InputError(f"{key}: holds values beyond float32's range (|x| > 3.4e38)")
        return a32

    def validate(self, example: dict) -> None:
        from vlaperf.inputs import InputError

        if not isinstance(example, dict):
            raise InputError(f"observation must be a dict, got {type(example).__name__}")
        cfg = self.cfg
        self._array(example, "observation/context_latent", (cfg.context_frames, cfg.patches, cfg.patch_channels))
        self._array(example, "observation/state", (cfg.state_dim,))
        self._prompt(example)

    def _prompt(self, example: dict) -> str:
        """The task instruction, as the pi0 family's transform takes it (str, UTF-8 bytes, a 0-d string array),
        but never empty: unlike pi0's "", the text encoder's embedding of nothing is no condition."""
        from vlaperf.inputs import InputError, prompt_text

        if "prompt" not in example:
            raise InputError(f"prompt: missing; a world-action observation has {', '.join(WAM_KEYS)}")
        prompt = prompt_text(example["prompt"])
        if not prompt.strip():
            raise InputError("prompt: empty; the world-action model is conditioned on its instruction")
        return prompt

    def __call__(self, examples: list[dict]):
        from vlaperf.models.wam import WamObservation

        cfg = self.cfg
        for ex in examples:
            self.validate(ex)
        stack = lambda key, shape: torch.from_numpy(np.stack([self._array(e, key, shape) for e in examples]))  # noqa: E731
        context = stack("observation/context_latent", (cfg.context_frames, cfg.patches, cfg.patch_channels))
        state = stack("observation/state", (cfg.state_dim,))
        text = torch.from_numpy(np.stack([self.text_encoder(self._prompt(e)) for e in examples]))
        to = lambda t: t.to(self.device, self.dtype, non_blocking=True)  # noqa: E731
        return WamObservation(context=to(context), text=to(text), state=to(state))


class WamPolicy:
    """`infer(example or list) -> {"actions": (H, A) or (B, H, A) float32, "policy_timing"}` for a
    world-action model: dicts -> device -> `generate` (the engine's or the reference's) -> numpy.
    Fresh starting noise per call unless `noise` is given (benchmarks pass a fixed one)."""

    def __init__(self, model, generate: Callable, workload, text_encoder=None, noise=None):
        from vlaperf.workloads import WamWorkload

        if not isinstance(workload, WamWorkload):
            raise TypeError(f"workload: expected a WamWorkload (vlaperf.workloads.get_wam_workload), got "
                            f"{type(workload).__name__}" + (": serve the pi0 family with Policy"
                                                            if isinstance(workload, Workload) else ""))
        self.model, self.sample, self.workload = model, generate, workload
        self.device = model.device
        self.num_steps = workload.steps
        self.transform = WamTransform(model.config, self.device, model.dtype, text_encoder)
        self.noise = noise
        self._gen = torch.Generator(device="cpu").manual_seed(0)

    def _noise(self, batch: int):
        from vlaperf.models.wam import WamNoise

        if self.noise is not None and self.noise.actions.shape[0] == batch:
            return self.noise
        cfg = self.model.config
        video = torch.randn(batch, cfg.video_frames, cfg.patches, cfg.patch_channels, generator=self._gen)
        actions = torch.randn(batch, cfg.action_horizon, cfg.action_dim, generator=self._gen)
        return WamNoise(video.to(self.device), actions.to(self.device))

    def infer(self, example: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
        w = self.workload
        t0 = time.perf_counter()
        from vlaperf.inputs import InputError

        examples = [example] if isinstance(example, dict) else list(example) if isinstance(example, (list, tuple)) else []
        if not examples:
            raise InputError("observation must be a dict (or a non-empty list of dicts)")
        obs = self.transform(examples)
        noise = self._noise(len(examples))
        t1 = time.perf_counter()
        actions, _ = self.sample(obs, noise, **w.sampling())
        out = actions.cpu().numpy().astype(np.float32)
        t2 = time.perf_counter()
        timing = {"transform_ms": (t1 - t0) * 1e3, "sample_and_copy_ms": (t2 - t1) * 1e3, "infer_ms": (t2 - t0) * 1e3}
        finite_actions(out, timing)
        return {"actions": out[0] if isinstance(example, dict) else out, "policy_timing": timing}

    def keep_warm(self, example: dict[str, Any] | list[dict[str, Any]]) -> None:
        """As `Policy.keep_warm`: rerun the host stages of `infer` on a request already served (the checks, the text
        encoder, the copies to the device), not the model, and wait for them (`vlaperf serve --keep-warm-ms`)."""
        self.transform([example] if isinstance(example, dict) else list(example))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def warmup_examples(self, batch: int) -> list[dict[str, Any]]:
        """What the server runs before it listens, per warm-up batch size (one graph capture each)."""
        return [make_wam_example(self.workload, seed=i) for i in range(batch)]

    def workload_metadata(self) -> dict[str, Any]:
        """The workload's part of the server's metadata (what clients and loadgen read)."""
        from vlaperf.workloads import get_wam_workload

        cfg, w = self.model.config, self.workload
        return {"workload": w.id, "workload_overrides": w.overrides_vs(get_wam_workload(w.id)),
                "action_horizon": cfg.action_horizon, "robot_action_dim": cfg.action_dim, "action_dim": cfg.action_dim,
                "state_dim": cfg.state_dim, "layout": "wam", "keys": list(WAM_KEYS),
                "context_latent_shape": [cfg.context_frames, cfg.patches, cfg.patch_channels],
                "sampler": {k: getattr(w, k) for k in ("steps", "video_steps", "sparsity", "cfg_scale", "shift")},
                "text_encoder": type(self.transform.text_encoder).__name__}
