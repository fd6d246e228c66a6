"""Model inputs: the Observation type, random observations per workload, and the openpi
LIBERO / ALOHA / DROID numpy-dict layouts that a policy server receives (policy mode).

Shapes (axis letters as in vlaperf.models.pi0):
    images      (B, S, 3, R, R) float, in [-1, 1]   R = the model's image size (224)
    image_mask  (B, S) bool                          False = slot absent (all-zero image)
    tokens      (B, L) int64                         L = prompt slots (max_token_len)
    token_mask  (B, L) bool                          True for the valid (leading) tokens
    state       (B, A) float32                       robot state zero-padded to the action dim
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.models.pi0 import Pi0Config
from vlaperf.workloads import Workload

# openpi's camera slot names, in the order the model embeds them.
IMAGE_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


@dataclass
class Observation:
    images: Tensor
    image_mask: Tensor
    tokens: Tensor
    token_mask: Tensor
    state: Tensor
    # Host-side copies of what the masks say, filled by whoever built the observation on the
    # host. The engine plans the prefix from these without reading the device masks (a
    # device-to-host read would be a sync per call). None = unknown: the engine reads the
    # masks once per call and says so. They are trusted, not checked (that would be the sync):
    # a slot marked False here is skipped even where image_mask says True.
    host_image_valid: tuple[bool, ...] | None = None  # per slot: valid in any sample
    host_prompt_len: int | None = None  # longest valid prompt in the batch

    def to(self, device: torch.device | str) -> "Observation":
        moved = (t.to(device, non_blocking=True) for t in self.tensors())
        return Observation(*moved, host_image_valid=self.host_image_valid, host_prompt_len=self.host_prompt_len)

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.images, self.image_mask, self.tokens, self.token_mask, self.state)

    @property
    def batch(self) -> int:
        return self.state.shape[0]


# ------------------------------------------------------------------------ tokenizer


class Tokenizer(Protocol):
    """Anything that turns a prompt string into token ids. vlaperf ships a stand-in
    (`WordHashTokenizer`) and `PaligemmaTokenizer` (the real sentencepiece model, for real
    checkpoints). A tokenizer may also have `encode_with_state(task, state)` for pi0.5, whose
    prompt carries the discretised state; without it the transform builds that text and calls
    `encode`."""

    def encode(self, text: str) -> list[int]: ...


def clean_task(task: str) -> str:
    """The task as openpi's tokenizer (and LeRobot 0.5+'s pi0.5 processor) puts it in the prompt: stripped, '_' and
    newlines as spaces."""
    return task.strip().replace("_", " ").replace("\n", " ")


class PaligemmaTokenizer:
    """PaliGemma's sentencepiece model (`paligemma_tokenizer.model`, which openpi fetches beside its
    checkpoints) with openpi's prompt conventions: the task cleaned (stripped; '_' and newlines as
    spaces), BOS first; pi0 ends with the newline token, pi0.5's prompt is "Task: <task>, State: <bins>;
    \\nAction: " (the normalized state in 256 bins over [-1, 1]). `style="lerobot"`: pi0's prompt as
    LeRobot's processor builds it (the task as given, a newline at its end; `vlaperf.conventions`). Needs
    `pip install sentencepiece` (`vlaperf[tokenizer]`)."""

    def __init__(self, model_file: str | Path, style: str = "openpi"):
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("PaligemmaTokenizer needs sentencepiece: pip install sentencepiece "
                              "(or vlaperf[tokenizer])") from None
        path = Path(model_file)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer model {str(path)!r}: no such file (PaliGemma's "
                                    "paligemma_tokenizer.model)")
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise ValueError(f"tokenizer model {str(path)!r}: not a sentencepiece model ({e})") from None
        self.vocab_size = self.sp.vocab_size()
        self.source = str(path)
        if style not in ("openpi", "lerobot"):
            raise ValueError(f"style: expected 'openpi' or 'lerobot', got {style!r}")
        self.style = style  # pi0's prompt (vlaperf.conventions.Conventions.prompt_style)

    @staticmethod
    def clean(task: str) -> str:
        return clean_task(task)

    def encode(self, text: str) -> list[int]:
        if self.style == "lerobot":
            return self.sp.encode(text if text.endswith("\n") else text + "\n", add_bos=True)
        return self.sp.encode(self.clean(text), add_bos=True) + self.sp.encode("\n")

    def encode_with_state(self, task: str, state: np.ndarray) -> list[int]:
        return self.sp.encode(pi05_prompt(self.clean(task), state), add_bos=True)


class WordHashTokenizer:
    """Deterministic stand-in for the PaliGemma tokenizer (which cannot be downloaded here).

    Lower-cases, splits into words and punctuation, and maps each piece to an id by a
    stable hash; prepends BOS and ends with a newline token like PaliGemma prompts do.
    Same text -> same ids on every machine; token counts are realistic (one per word),
    but the ids mean nothing to a trained model.
    """

    BOS, NEWLINE = 2, 108

    def __init__(self, vocab_size: int):
        if vocab_size < 256:
            raise ValueError(f"vocab_size must be >= 256, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        pieces = re.findall(r"\w+|[^\w\s]", text.lower().strip())
        ids = [self.BOS]
        for piece in pieces:
            digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
            ids.append(256 + int.from_bytes(digest, "little") % (self.vocab_size - 256))
        return ids + [self.NEWLINE]


def tokenize_prompt(tokenizer: Tokenizer, prompt: str, slots: int, vocab_size: int | None = None,
                    state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask, each (slots,), right-padded with 0; too long prompts are cut (as openpi does). With
    `state` (pi0.5), the prompt carries it: the tokenizer's `encode_with_state`, or the same text through
    `encode`. With `vocab_size`, an id outside [0, vocab_size) is a ValueError naming the tokenizer (the
    embedding would fail later, on CUDA as a device-side assert that ends the process)."""
    if state is None:
        ids = tokenizer.encode(prompt)
    elif hasattr(tokenizer, "encode_with_state"):
        ids = tokenizer.encode_with_state(prompt, state)
    else:
        ids = tokenizer.encode(pi05_prompt(clean_task(prompt), state))  # as PaligemmaTokenizer cleans it
    ids = list(ids[:slots])
    if vocab_size is not None:
        bad = next((i for i in ids if not isinstance(i, (int, np.integer)) or not 0 <= i < vocab_size), None)
        if bad is not None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__}: encode({prompt[:40]!r}) gave the id {bad!r}, "
                             f"expected integers in [0, {vocab_size}) (the model's vocabulary)")
    tokens = np.zeros(slots, dtype=np.int64)
    mask = np.zeros(slots, dtype=bool)
    tokens[: len(ids)] = ids
    mask[: len(ids)] = True
    return tokens, mask


def pi05_prompt(task: str, state: np.ndarray) -> str:
    """pi0.5's prompt text: the task and the discretised (normalized) state, then the action cue."""
    return f"Task: {task}, {state_prompt(state)}\nAction: "


def state_prompt(state: np.ndarray, bins: int = 256) -> str:
    """pi0.5 puts the (normalized) state into the prompt as discretised bins ("State: 12 200 ...;"). Not
    clipped, as openpi and LeRobot do not clip: a value below -1 is bin -1, one above 1 is bin 255."""
    digits = np.digitize(np.asarray(state, dtype=np.float64), np.linspace(-1.0, 1.0, bins + 1)[:-1]) - 1
    return "State: " + " ".join(str(int(d)) for d in digits) + ";"


# ------------------------------------------------------------- random (model mode)


def random_observation(
    workload: Workload,
    config: Pi0Config | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Observation:
    """A random observation with the workload's shapes: valid image slots hold random pixels,
    masked slots hold the all-zero uint8 image (-1 after normalisation, as openpi's LIBERO
    transform produces), prompts have the workload's valid token counts, state is padded."""
    cfg = config or workload.model_config()
    check_fits(workload, cfg)
    gen = torch.Generator().manual_seed(seed)
    B, S, R = workload.batch, workload.image_slots, cfg.vision.image_size
    pixels = torch.randint(0, 256, (B, S, 3, R, R), generator=gen, dtype=torch.uint8)
    valid = torch.tensor(workload.image_valid, dtype=torch.bool)
    pixels[:, ~valid] = 0
    images = pixels.float() / 127.5 - 1.0
    tokens = torch.zeros(B, workload.prompt_slots, dtype=torch.long)
    token_mask = torch.zeros(B, workload.prompt_slots, dtype=torch.bool)
    for b, n in enumerate(workload.prompt_valid):
        tokens[b, :n] = torch.randint(1, cfg.backbone.vocab_size, (n,), generator=gen)
        token_mask[b, :n] = True
    state = torch.zeros(B, cfg.action_dim)
    state[:, : workload.state_dim] = torch.rand(B, workload.state_dim, generator=gen) * 2 - 1
    obs = Observation(images, valid[None].expand(B, S).clone(), tokens, token_mask, state,
                      host_image_valid=tuple(workload.image_valid), host_prompt_len=max(workload.prompt_valid))
    return obs.to(device)


def check_state_fits(workload: Workload, config: Pi0Config) -> None:
    """The robot's state must fit the model's padded state (what the observation transform needs)."""
    if workload.state_dim > config.action_dim:
        raise ValueError(f"workload {workload.id!r} has a {workload.state_dim}-d state, more than model "
                         f"{config.name!r} pads to ({config.action_dim})")


def check_fits(workload: Workload, config: Pi0Config) -> None:
    """The workload's action chunk and state must be the model's (a workload of another preset is a mistake
    that would otherwise surface as a wrong noise shape deep inside the call)."""
    check_state_fits(workload, config)
    if (workload.horizon, workload.action_dim) != (config.action_horizon, config.action_dim):
        raise ValueError(f"workload {workload.id!r} (preset {workload.preset!r}: horizon {workload.horizon}, action dim "
                         f"{workload.action_dim}) does not fit model {config.name!r} (horizon "
                         f"{config.action_horizon}, action dim {config.action_dim})")


def random_noise(workload: Workload, config: Pi0Config | None = None, device="cpu", seed: int = 0) -> Tensor:
    """Fixed initial noise (B, H, A) float32 for reproducible sampling."""
    cfg = config or workload.model_config()
    check_fits(workload, cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(workload.batch, workload.horizon, cfg.action_dim, generator=gen).to(device)


# --------------------------------------------------------- openpi dicts (policy mode)


PROMPTS = (
    "put the black bowl on the plate",
    "open the top drawer of the cabinet and put the bowl inside",
    "pick up the alphabet soup and place it in the basket",
    "turn on the stove",
)


def warmup_prompts(slots: int) -> list[str]:
    """One prompt per static prompt bucket up to `slots` (see vlaperf.engine.prefix), each
    filling its bucket with the stand-in tokenizer (BOS + words + newline), so a server can
    capture / compile every prompt layout before the first client arrives."""
    from vlaperf.engine.prefix import PROMPT_BUCKETS

    sizes = sorted({min(b, slots) for b in PROMPT_BUCKETS if b <= slots} | {slots})
    return [" ".join(["go"] * max(1, n - 2)) for n in sizes]


def make_example(workload: Workload, seed: int = 0, image_size: int = 224) -> dict[str, Any]:
    """One raw observation as an openpi client sends it (unbatched numpy, uint8 images).

    libero: observation/image, observation/wrist_image (H, W, 3 uint8), observation/state (8,),
            prompt.   aloha: images/{cam_high, cam_left_wrist, cam_right_wrist} (3, H, W uint8),
            state (14,), prompt.   droid: observation/exterior_image_1_left, observation/wrist_image_left
            (H, W, 3 uint8), observation/joint_position (7,), observation/gripper_position (1,), prompt.
    """
    rng = np.random.default_rng(seed)
    prompt = PROMPTS[seed % len(PROMPTS)]
    state = rng.uniform(-1, 1, workload.state_dim).astype(np.float32)
    if workload.layout == "libero":
        img = lambda: rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)  # noqa: E731
        return {"observation/image": img(), "observation/wrist_image": img(), "observation/state": state, "prompt": prompt}
    if workload.layout == "droid":
        img = lambda: rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)  # noqa: E731
        return {"observation/exterior_image_1_left": img(), "observation/wrist_image_left": img(),
                "observation/joint_position": state[:-1], "observation/gripper_position": state[-1:], "prompt": prompt}
    if workload.layout == "aloha":
        img = lambda: rng.integers(0, 256, (3, image_size, image_size), dtype=np.uint8)  # noqa: E731
        return {"images": {c: img() for c in ALOHA_CAMERAS}, "state": state, "prompt": prompt}
    raise ValueError(f"unknown observation layout {workload.layout!r}")


class InputError(ValueError):
    """A malformed observation; the message names the field and what was expected."""


def _get(example: dict, key: str) -> Any:
    node: Any = example
    for part in key.split("/") if key.startswith("images/") else [key]:
        if not isinstance(node, dict) or part not in node:
            raise InputError(f"observation is missing key {key!r}")
        node = node[part]
    return node


def _image(value: Any, key: str, channels_first: bool) -> np.ndarray:
    """One camera image as (H, W, 3) uint8 (a view where it can be). Either layout is taken, (H, W, 3) or
    (3, H, W), whichever has the 3 colour channels, as openpi's image parsing does; `channels_first`
    (ALOHA's layout) only decides which one the error names first. Float pixels must be in [0, 1]."""
    layout = "3, H, W) or (H, W, 3" if channels_first else "H, W, 3) or (3, H, W"
    try:
        arr = np.asarray(value)
    except ValueError as e:  # a ragged nested list
        raise InputError(f"{key}: expected a 3-d image array ({layout}) ({e})") from None
    if arr.dtype == object:
        raise InputError(f"{key}: expected a uint8 or float image array, got an object array")
    if arr.ndim != 3:
        got = (type(value).__name__ if arr.ndim == 0 and not isinstance(value, np.ndarray)
               else f"shape {arr.shape}")  # a str, bytes or number: its type says more than shape ()
        batched = (" (one observation's image has no batch axis: a batch is a list of observations)"
                   if arr.ndim == 4 and arr.shape[0] == 1 else "")
        raise InputError(f"{key}: expected a 3-d image ({layout}), got {got}{batched}")
    if arr.shape[0] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(1, 2, 0)
    if arr.shape[-1] != 3:
        raise InputError(f"{key}: expected 3 colour channels ({layout}), got shape {arr.shape}")
    if not (4 <= arr.shape[0] <= 4096 and 4 <= arr.shape[1] <= 4096):
        raise InputError(f"{key}: image size {arr.shape[:2]} out of range [4, 4096]")
    if arr.dtype == np.uint8:
        return arr
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            raise InputError(f"{key}: image holds NaN or inf")
        lo, hi = float(arr.min()), float(arr.max())
        if lo < -FLOAT_PIXEL_SLACK or hi > 1.0 + FLOAT_PIXEL_SLACK:
            raise InputError(f"{key}: float pixels must be in [0, 1], got {lo:.4g}..{hi:.4g} (send uint8 for 0..255)")
        # openpi accepts float images in [0, 1]; convert like its transform does.
        return (np.clip(arr, 0.0, 1.0) * 255).astype(np.uint8)
    hint = " (cast to uint8 for 0..255 pixels)" if np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool else ""
    raise InputError(f"{key}: expected uint8 or float pixels, got dtype {arr.dtype}{hint}")


def _state_part(example: dict, key: str, size: int, scalar_ok: bool = False) -> np.ndarray:
    """A 1-d numeric state field of `size` values (a 0-d value where `scalar_ok`)."""
    raw = _get(example, key)
    try:
        value = np.asarray(raw)
    except ValueError as e:  # a ragged nested list
        raise InputError(f"{key}: expected a 1-d numeric array ({e})") from None
    if scalar_ok and value.ndim == 0:
        value = value[None]
    if value.dtype.kind not in "iuf" or value.ndim != 1:
        raise InputError(f"{key}: expected a 1-d numeric array, got dtype {value.dtype} shape {value.shape}")
    if value.shape[0] != size:
        raise InputError(f"{key}: expected {size} value{'s' * (size != 1)}, got {value.shape[0]}")
    if not np.isfinite(value).all():
        raise InputError(f"{key}: state holds NaN or inf")
    return value


# The camera keys of openpi's LIBERO and DROID clients: the base (exterior) view, then the wrist
LIBERO_CAMERAS = ("observation/image", "observation/wrist_image")
DROID_CAMERAS = ("observation/exterior_image_1_left", "observation/wrist_image_left")
ALOHA_CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")  # the model's three slots, in order
ALOHA_ACCEPTED = ALOHA_CAMERAS + ("cam_low",)  # openpi's AlohaInputs takes cam_low too; pi0 does not use it
# Float pixels this far outside [0, 1] (a resize's overshoot, rounding) are clipped; beyond it they are an error
FLOAT_PIXEL_SLACK = 1e-3
# A prompt longer than this many characters is refused before it is tokenized: the model keeps at most 48 tokens
# (pi0.5: 200), and tokenizing megabytes of text on the inference thread held every other client up for seconds
MAX_PROMPT_CHARS = 4096


def prompt_text(prompt: Any, why_limit: str = "") -> str:
    """An observation's 'prompt' as text: a str, UTF-8 bytes (msgpack's bin, as some clients send strings) or
    a 0-d numpy string array (openpi's own transforms send np.asarray(prompt)); anything else, or more than
    MAX_PROMPT_CHARS characters, is an InputError naming the field."""
    if isinstance(prompt, np.ndarray) and prompt.dtype.kind in "US" and prompt.ndim == 0:
        prompt = prompt.item()
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8", "replace")
    if not isinstance(prompt, str):
        got = f"an array of shape {prompt.shape}" if isinstance(prompt, np.ndarray) else type(prompt).__name__
        raise InputError(f"prompt: expected a string, got {got}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"prompt: {len(prompt)} characters, expected at most {MAX_PROMPT_CHARS}{why_limit}")
    try:
        # a lone surrogate (U+D800..U+DFFF) is no text: a 0-d "<U" array can carry one past msgpack's UTF-8 check,
        # and the tokenizer's encode then failed with UnicodeEncodeError, an InternalError that failed its batch
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"prompt: not valid text ({e.reason}: {prompt[e.start:e.end]!r} at "
                         f"character {e.start})") from None
    return prompt


class ObservationTransform:
    """openpi LIBERO / ALOHA / DROID dicts -> Observation on the device.

    Validates every field (clear errors naming it), resizes with padding to the model's
    image size, normalises to [-1, 1], tokenizes the prompt (plus the discretised state for
    pi0.5), pads the state, and fills absent camera slots with a masked zero image.
    """

    def __init__(self, workload: Workload, config: Pi0Config, tokenizer: Tokenizer | None = None, device="cpu",
                 norm_stats=None, conventions=None):
        """`norm_stats`: a `vlaperf.normalize.NormStats`; the state is normalized with it before it is padded
        (and, for pi0.5, discretised into the prompt), as openpi's Normalize does. `conventions`: a
        `vlaperf.conventions.Conventions` or its name (None: "none"): ALOHA's state mapped into pi's space
        first; whether pi0.5's prompt carries the state, padded to how many dims."""
        from vlaperf.conventions import get_conventions

        check_state_fits(workload, config)
        self.workload, self.config, self.device = workload, config, torch.device(device)
        self.conventions = get_conventions(conventions)
        why = self.conventions.fits(config.pi05, workload.layout)
        if why is not None:
            raise ValueError(why)
        self.tokenizer = tokenizer or WordHashTokenizer(config.backbone.vocab_size)
        style, want = getattr(tokenizer, "style", None), self.conventions.prompt_style
        if style is not None and style != want and not config.pi05 and self.conventions.name != "none":
            # pi0's prompt differs between openpi's and LeRobot's training: a tokenizer built for the other one
            # gave the model prompts it was not trained on, silently
            raise ValueError(f"tokenizer: builds pi0's prompt in {style}'s style; conventions "
                             f"{self.conventions.name!r} were trained with {want}'s (PaligemmaTokenizer(path, "
                             f"style={want!r}), or load_checkpoint_io(..., conventions={self.conventions.name!r}))")
        self.norm_stats = norm_stats
        if norm_stats is not None:
            norm_stats.check_dims(workload.state_dim)
        self._host_buffer: Tensor | None = None  # upload's staging buffer (pinned on CUDA)
        self._staged: torch.cuda.Event | None = None  # the last copy out of it
        self._staging_lock = threading.Lock()  # one caller at a time fills and sends the buffer

    def _slots(self, example: dict) -> tuple[list[np.ndarray], list[bool]]:
        w = self.workload
        if w.layout in ("libero", "droid"):
            keys = DROID_CAMERAS if w.layout == "droid" else LIBERO_CAMERAS
            base = _image(_get(example, keys[0]), keys[0], False)
            wrist = _image(_get(example, keys[1]), keys[1], False)
            # LIBERO and DROID have no right wrist camera: openpi feeds zeros with the mask off.
            return [base, wrist, np.zeros_like(base)], [True, True, False]
        if "images" not in example:
            raise InputError("observation is missing key 'images' (a dict of camera arrays)")
        images = example["images"]
        if not isinstance(images, dict):
            raise InputError(f"images: expected a dict of camera arrays, got {type(images).__name__}")
        # as openpi's AlohaInputs: cam_high is required, the wrists may be absent (zeros, masked off), cam_low is
        # taken and not used by the model, and any other name is refused (a misspelt camera would be dropped)
        unknown = [k for k in images if k not in ALOHA_ACCEPTED]
        if unknown:
            raise InputError(f"images: unknown camera {repr(unknown[0])[:80]}; expected names among {ALOHA_ACCEPTED}")
        if "cam_high" not in images:
            raise InputError(f"images: missing 'cam_high' (required; the wrist cameras may be left out), got "
                             f"{sorted(images)}")
        base = _image(images["cam_high"], "images/cam_high", True)
        out, valid = [base], [True]
        for cam in ALOHA_CAMERAS[1:]:
            present = cam in images
            out.append(_image(images[cam], f"images/{cam}", True) if present else np.zeros_like(base))
            valid.append(present)
        return out, valid

    def _state_key(self) -> str:
        if self.workload.layout == "droid":
            return "observation/joint_position and gripper_position"
        return "observation/state" if self.workload.layout == "libero" else "state"

    def _state(self, example: dict) -> np.ndarray:
        if self.workload.layout == "droid":
            # openpi's DroidInputs: the joints, then the gripper (a scalar or a 1-value array)
            joints = _state_part(example, "observation/joint_position", self.workload.state_dim - 1)
            gripper = _state_part(example, "observation/gripper_position", 1, scalar_ok=True)
            state = np.concatenate([joints, gripper])
        else:
            state = _state_part(example, self._state_key(), self.workload.state_dim)
        with np.errstate(over="ignore"):
            fits_float32 = np.isfinite(state.astype(np.float32)).all()
        if not fits_float32:
            raise InputError(f"{self._state_key()}: state holds values beyond float32's range (|x| > 3.4e38)")
        # float64 of the client's own values, not a float32 copy: openpi normalizes and bins (pi0.5's state in the
        # prompt) what the client sent, and float32 rounding moved a value across a bin edge ~1 call in 3,000
        return state.astype(np.float64)

    def _model_state(self, example: dict) -> tuple[np.ndarray, np.ndarray]:
        """(the state in the model's space before normalization, float64; the state as the model takes it, after
        normalization). A state whose normalization leaves float32's range is an InputError here, which `validate`
        runs too: a server refuses it before it joins a batch, whose call would otherwise fail and be rerun one
        observation at a time."""
        model_state = self.conventions.state_to_model(self._state(example))
        state = model_state if self.norm_stats is None else self.norm_stats.normalize_state64(model_state)
        with np.errstate(over="ignore"):
            finite = np.isfinite(state.astype(np.float32)).all()
        if not finite:
            raise InputError(f"{self._state_key()}: not finite after its normalization (a value far outside the "
                             "checkpoint's statistics)")
        return model_state, state

    def _prompt(self, example: dict) -> str:
        """The task instruction: required, as openpi's transforms require it (send "" for none), unless the
        conventions have a default prompt (openpi's InjectDefaultPrompt: used where the key is absent)."""
        if "prompt" not in example:
            if self.conventions.default_prompt is not None:
                return self.conventions.default_prompt
            raise InputError("prompt: missing; an observation carries its task instruction as 'prompt' (a string; "
                             "'' for none)")
        return prompt_text(example["prompt"], f" (the model keeps {self.workload.prompt_slots} tokens)")

    def validate(self, example: dict) -> None:
        """Check one raw observation (raises InputError naming the field) without building
        tensors: a server checks each request before it joins a batch."""
        if not isinstance(example, dict):
            raise InputError(f"observation must be a dict, got {type(example).__name__}")
        self._slots(example)
        self._model_state(example)
        self._prompt(example)

    def __call__(self, examples: dict | list[dict]) -> Observation:
        return self.preprocess(self.upload(self.host_arrays(examples)))

    # The three phases of __call__, separately callable so the profiler can time each.

    def host_arrays(self, examples: dict | list[dict]) -> "HostBatch":
        """Validate, tokenize and pad on the host: numpy arrays, nothing on the device yet."""
        batch = [examples] if isinstance(examples, dict) else list(examples) if isinstance(examples, (list, tuple)) else None
        if not batch or not all(isinstance(e, dict) for e in batch):
            raise InputError("observation must be a dict (or a non-empty list of dicts)")
        cfg, conv = self.config, self.conventions
        hb = HostBatch([], [], [], [], [], [])
        for i, ex in enumerate(batch):
            try:
                slots, valid = self._slots(ex)
                model_state, state = self._model_state(ex)
                prompt = self._prompt(ex)
            except InputError as e:  # in a list, which observation: "observation/state: ..." alone did not say
                if len(batch) > 1:
                    raise InputError(f"observation [{i}] of {len(batch)}: {e}") from None
                raise
            prompt_state = None
            if cfg.pi05 and conv.state_in_prompt:
                prompt_state = state
                if conv.state_prompt_pad_to and state.shape[0] < conv.state_prompt_pad_to:
                    prompt_state = np.pad(state, (0, conv.state_prompt_pad_to - state.shape[0]))
            ids, mask = tokenize_prompt(self.tokenizer, prompt, self.workload.prompt_slots, cfg.backbone.vocab_size,
                                        prompt_state)
            padded = np.zeros(cfg.action_dim, dtype=np.float32)
            padded[: state.shape[0]] = state  # finite in float32: _model_state checked it
            hb.pixels.append(slots)
            hb.image_valid.append(valid)
            hb.tokens.append(ids)
            hb.token_masks.append(mask)
            hb.states.append(padded)
            hb.model_states.append(model_state)
        return hb

    def upload(self, hb: "HostBatch", extras: tuple[np.ndarray, ...] = ()) -> "DeviceBatch":
        """Host-to-device in one transfer: every array (images still uint8 at their camera size,
        tokens, masks, state) is packed into one staging buffer, pinned on CUDA, and copied at
        once; the device tensors are views into the copy. On the H200 the seven separate
        pageable copies this replaces took 0.32 ms of a libero-pi0 call (session 7). `extras`
        (float32 arrays: real-time chunking's guidance) travel in the same transfer; their device
        views are the batch's `extras`, in order."""
        B, S = len(hb.pixels), len(hb.pixels[0])
        shapes = {a.shape for slots in hb.pixels for a in slots}
        one_shape = len(shapes) == 1
        # Images that arrived channels first (ALOHA's (3, H, W)) are (H, W, 3) views of them here; staging
        # them as they are is a plain copy, where writing them (H, W, 3) was a transposing one (aloha-pi0's
        # upload on the CPU machine: 684 -> 144 us a call), and the device permuted them back anyway.
        chw = one_shape and all(a.transpose(2, 0, 1).flags.c_contiguous for slots in hb.pixels for a in slots)

        def block(dst):  # every image written straight into its place: no stacked host copy
            for b, slots in enumerate(hb.pixels):
                for s, a in enumerate(slots):
                    dst[b, s] = a.transpose(2, 0, 1) if chw else a

        # (shape, dtype, fill) of each region of the staging buffer
        H, W, C = next(iter(shapes))
        regions = ([((B, S, C, H, W) if chw else (B, S, H, W, C), np.dtype(np.uint8), block)] if one_shape else
                   [(a.shape, np.dtype(np.uint8), lambda dst, a=a: dst.__setitem__(..., a))
                    for slots in hb.pixels for a in slots])
        for value in (np.array(hb.image_valid, dtype=np.bool_), np.stack(hb.tokens), np.stack(hb.token_masks),
                      np.stack(hb.states), *extras):
            if value.dtype.type not in _TORCH_DTYPES:
                raise TypeError(f"upload: cannot stage a {value.dtype} array (expected one of "
                                f"{', '.join(np.dtype(t).name for t in _TORCH_DTYPES)})")
            regions.append((value.shape, value.dtype, lambda dst, v=value: dst.__setitem__(..., v)))
        sizes = [int(np.prod(shape)) * dtype.itemsize for shape, dtype, _ in regions]
        offsets, total = [], 0
        for n in sizes:
            total = -(-total // 16) * 16  # every view starts 16-byte aligned
            offsets.append(total)
            total += n
        with self._staging_lock:  # servers call from one thread, but a user's threads may not
            host = self._staging(total)
            flat = host.numpy()
            for (shape, dtype, fill), off, n in zip(regions, offsets, sizes):
                fill(flat[off : off + n].view(dtype).reshape(shape))
            dev = host.to(self.device, non_blocking=True) if self.device.type == "cuda" else host.clone()
            if self.device.type == "cuda":
                self._staged = torch.cuda.Event()
                self._staged.record()  # the next call refills the buffer only after this copy is done
        views = [dev[off : off + n].view(_TORCH_DTYPES[dtype.type]).view(shape)
                 for (shape, dtype, _), off, n in zip(regions, offsets, sizes)]
        if one_shape:
            pixels, rest = views[0], views[1:]
        else:
            it = iter(views[: B * S])
            pixels, rest = [[next(it) for _ in range(S)] for _ in range(B)], views[B * S :]
        image_mask, tokens, token_mask, state, *extra_views = rest
        return DeviceBatch(pixels=pixels, channels_first=chw, image_mask=image_mask, tokens=tokens, token_mask=token_mask,
                           state=state, extras=tuple(extra_views),
                           host_image_valid=tuple(bool(any(v[s] for v in hb.image_valid)) for s in range(S)),
                           host_prompt_len=int(max(m.sum() for m in hb.token_masks)))

    def _staging(self, nbytes: int) -> Tensor:
        """The host staging buffer (pinned on CUDA, grown as needed, reused across calls),
        once the previous call's copy out of it has finished."""
        if self._staged is not None:
            self._staged.synchronize()
        buf = self._host_buffer
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            self._host_buffer = buf
        return buf[:nbytes]

    def preprocess(self, db: "DeviceBatch") -> Observation:
        """On the device: resize with padding to the model's size, normalise to [-1, 1]. Images
        already at the model's size (one (B, S, R, R, 3) block, or (B, S, 3, R, R) when they came
        channels first) skip the per-image path."""
        R = self.config.vision.image_size
        if isinstance(db.pixels, Tensor):
            chw = db.pixels if db.channels_first else db.pixels.permute(0, 1, 4, 2, 3)  # (B, S, 3, H, W)
        if isinstance(db.pixels, Tensor) and tuple(chw.shape[3:]) == (R, R):
            images = chw
        else:
            rows = db.pixels if isinstance(db.pixels, list) else [[x.permute(1, 2, 0) for x in sample] for sample in chw]
            # resized as the checkpoint's library does (Conventions.image_resize: openpi's filter, or LeRobot's)
            style = self.conventions.image_resize
            images = torch.stack([torch.stack([resize_with_pad(a, R, style) for a in slots]) for slots in rows])
        return Observation(images.float() / 127.5 - 1.0, db.image_mask, db.tokens, db.token_mask, db.state,
                           host_image_valid=db.host_image_valid, host_prompt_len=db.host_prompt_len)


_TORCH_DTYPES = {np.uint8: torch.uint8, np.bool_: torch.bool, np.int64: torch.int64, np.float32: torch.float32}


@dataclass
class HostBatch:
    pixels: list  # per sample: per slot uint8 (H, W, 3) arrays
    image_valid: list  # per sample: per slot bool
    tokens: list
    token_masks: list
    states: list  # per sample: the model's state, normalized and padded, float32
    model_states: list  # per sample: the state in the model's space before normalization, float64 (delta actions)


@dataclass
class DeviceBatch:
    pixels: Tensor | list  # uint8 (B, S, H, W, 3) (or (B, S, 3, H, W), channels_first) when every slot has one
    # shape, else per sample per slot (H, W, 3)
    image_mask: Tensor
    tokens: Tensor
    token_mask: Tensor
    state: Tensor
    host_image_valid: tuple[bool, ...]
    host_prompt_len: int
    channels_first: bool = False  # the (B, S, ...) block is (B, S, 3, H, W): the images came channels first
    extras: tuple = ()  # device views of upload's `extras`, in order


def resize_with_pad(image_hwc: Tensor, size: int, style: str = "openpi") -> Tensor:
    """uint8 (H, W, 3) -> (3, size, size): keep aspect ratio, bilinear, pad, as the checkpoint's library does
    (`Conventions.image_resize`).
    "openpi": as openpi's resize_with_pad (PIL's bilinear filter): the sides rounded down, the filter antialiased
    when it shrinks (without it a 480 x 640 camera image differs from openpi's by ~33 of 255 levels on average),
    black padding; uint8.
    "lerobot": as LeRobot's resize_with_pad_torch does to its [0, 1] float images instead: bilinear without
    antialiasing, clamped, not rounded, black padding; float32 in 0..255.
    "lerobot0.4": as "lerobot", padded with -255 (LeRobot 0.4 padded its [0, 1] images with -1)."""
    if style not in ("openpi", "lerobot", "lerobot0.4"):
        raise ValueError(f"image_resize: expected 'openpi', 'lerobot' or 'lerobot0.4', got {style!r}")
    lerobot = style != "openpi"
    img = image_hwc.permute(2, 0, 1)
    H, W = img.shape[1:]
    if (H, W) == (size, size):
        return img.float() if lerobot else img  # float, as the resized slots beside it
    ratio = max(W / size, H / size)
    h, w = max(1, int(H / ratio)), max(1, int(W / ratio))
    resized = F.interpolate(img[None].float(), size=(h, w), mode="bilinear", align_corners=False,
                            antialias=not lerobot)[0].clamp(0, 255)
    pad = -255.0 if style == "lerobot0.4" else 0.0
    out = torch.full((3, size, size), pad, dtype=torch.float32, device=img.device)
    top, left = (size - h) // 2, (size - w) // 2
    out[:, top : top + h, left : left + w] = resized
    return out if lerobot else out.round().to(torch.uint8)
