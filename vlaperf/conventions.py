"""A checkpoint's input and output conventions: what its training pipeline did to the robot's data
around the model, which serving must repeat for the actions to mean what they meant in training.

Beside the tokenizer and the normalization statistics (`vlaperf.normalize`), openpi's and LeRobot's
training configs differ in four ways that change the actions a real checkpoint returns:

- delta actions: some checkpoints were trained on actions relative to the state (openpi's pi0_libero,
  with its "extra delta transform", and its ALOHA configs for the joints); the served actions are the
  model's plus the state, on the dimensions of a mask (openpi's AbsoluteActions, after unnormalizing);
- ALOHA's "adapt to pi": openpi's ALOHA checkpoints see the joints of the arms with some signs
  flipped and the grippers in an angular space; the state is mapped in, the actions mapped back;
- pi0.5's state in the prompt: openpi's pi05_libero keeps it out (its prompt is pi0's), its other
  pi0.5 configs and LeRobot's pi0.5 put the discretised state into the prompt (LeRobot 0.4 after
  padding it to 32 dimensions);
- the action horizon: checkpoints were trained with 10 (pi05_libero, pi0_droid), 15 (pi05_droid) or
  50 (the others) actions a chunk; the suffix must have as many action tokens.

Some configs also name a default prompt, used when an observation carries none (openpi's
InjectDefaultPrompt). `Conventions` holds all this; `CONVENTIONS` names the ones of the public configs
that fit vlaperf's workloads (LIBERO, ALOHA and DROID layouts). "none" is the model's own units: random
weights, benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Conventions:
    name: str
    description: str
    family: str | None = None  # "pi0" or "pi05": the model it was trained with (None: any)
    layout: str | None = None  # "libero", "aloha" or "droid": the observation layout (None: any)
    # Dimensions whose actions are relative to the state: the state is added back after unnormalizing
    delta_action_mask: tuple[bool, ...] = ()
    aloha_adapt_to_pi: bool = False  # openpi's ALOHA joint flips and gripper conversions
    state_in_prompt: bool = True  # pi0.5 only: the discretised state in the prompt
    state_prompt_pad_to: int | None = None  # pi0.5: pad the state with zeros to this many dims before binning
    # pi0's prompt (no state in it): "openpi": the task cleaned (stripped, '_' and newlines as spaces), BOS + text +
    # the newline token; "lerobot": BOS + the task as given with a newline at its end (LeRobot's pi0 processor)
    prompt_style: str = "openpi"
    action_horizon: int | None = None  # the chunk the checkpoint was trained with (None: the preset's)
    # LeRobot's chunk is each checkpoint's own (its config.json's chunk_size): conventions that leave it to the
    # checkpoint give the library's default here, served where neither that file nor --action-horizon says one
    default_action_horizon: int | None = None
    default_prompt: str | None = None  # the prompt of an observation without one (None: the prompt is required)
    # How an image not at the model's size is resized: "openpi": PIL's antialiased bilinear, rounded to uint8,
    # black padding (openpi's resize_with_pad); "lerobot": torch's bilinear without antialiasing on the float
    # pixels, not rounded, black padding (LeRobot 0.5+'s resize_with_pad_torch in its policies'
    # _preprocess_images); "lerobot0.4": as "lerobot", but padded with -1 on the [0, 1] pixels, -3 once mapped to
    # SigLIP's [-1, 1] (LeRobot 0.4's copy of that function assumed [-1, 1] input)
    image_resize: str = "openpi"

    def chunk(self, trained: int | None = None) -> int | None:
        """The chunk these conventions serve: their training config's (openpi's), else the checkpoint's own
        (`trained`, LeRobot's config.json) or their library's default; None: the model's."""
        if self.action_horizon is not None:
            return self.action_horizon
        if self.default_action_horizon is None:
            return None
        return trained if trained is not None else self.default_action_horizon

    def fits(self, pi05: bool, layout: str) -> str | None:
        """Why these conventions do not fit a model / workload (None: they do)."""
        family = "pi05" if pi05 else "pi0"
        if self.family is not None and self.family != family:
            return f"conventions {self.name!r} are for {self.family} checkpoints; the model is {family}"
        if self.layout is not None and self.layout != layout:
            return f"conventions {self.name!r} are for the {self.layout} layout; the workload's is {layout}"
        return None

    # ---------------------------------------------------------------- the state, in

    def state_to_model(self, state: np.ndarray) -> np.ndarray:
        """(D,) robot state -> the space the model was trained in (before normalization), float64."""
        x = np.asarray(state, dtype=np.float64).copy()
        if self.aloha_adapt_to_pi:
            x = x * ALOHA_JOINT_SIGNS[: x.shape[-1]]
            x[..., ALOHA_GRIPPERS] = aloha_gripper_to_angular(x[..., ALOHA_GRIPPERS])
        return x

    # ------------------------------------------------------------- the actions, out

    def actions_to_robot(self, actions: np.ndarray, model_state: np.ndarray) -> np.ndarray:
        """(B, H, A) unnormalized actions and the (B, D) state of `state_to_model` -> the robot's actions,
        float32: the state added back on the delta dims, then ALOHA's space undone."""
        out = np.asarray(actions, dtype=np.float64)
        if self.delta_action_mask:
            mask = np.asarray(self.delta_action_mask, dtype=bool)
            k = len(mask)
            out = out.copy()
            out[..., :k] += np.where(mask, model_state[..., :k], 0.0)[..., None, :]
        if self.aloha_adapt_to_pi:
            out = out * ALOHA_JOINT_SIGNS[: out.shape[-1]]
            out[..., ALOHA_GRIPPERS] = aloha_gripper_from_angular(out[..., ALOHA_GRIPPERS])
        return out.astype(np.float32)

    def changes_actions(self) -> bool:
        return bool(self.delta_action_mask) or self.aloha_adapt_to_pi


# ALOHA (two arms of 6 joints and a gripper): the joints openpi's runtime counts the other way round
ALOHA_JOINT_SIGNS = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], dtype=np.float64)
ALOHA_GRIPPERS = [6, 13]
# The constants of openpi's ALOHA gripper conversions (from the ALOHA and Interbotix robot code):
_PUPPET_GRIPPER_POSITION = (0.01844, 0.05800)  # linear position, open .. closed
_GRIPPER_ARM_LENGTH, _GRIPPER_HORN_RADIUS = 0.036, 0.022
_PI_GRIPPER_RADIANS = (0.5476, 1.6296)  # pi's normalized gripper range, encoder counts 2405 .. 3110
_PUPPET_GRIPPER_JOINT = (-0.6213, 1.4910)  # ALOHA's gripper joint, open .. close


def aloha_gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA's linear gripper reading in [0, 1] -> pi's normalized angular gripper."""
    lo, hi = _PUPPET_GRIPPER_POSITION
    linear = value * (hi - lo) + lo
    r, a = _GRIPPER_HORN_RADIUS, _GRIPPER_ARM_LENGTH
    # the horn's angle for that opening: the law of cosines of the gripper's linkage
    angle = np.arcsin(np.clip((r * r + linear * linear - a * a) / (2.0 * r * linear), -1.0, 1.0))
    lo, hi = _PI_GRIPPER_RADIANS
    return (angle - lo) / (hi - lo)


def aloha_gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """pi's gripper action (radians past its zero) -> ALOHA's gripper joint in [0, 1]."""
    lo, hi = _PUPPET_GRIPPER_JOINT
    return (value + _PI_GRIPPER_RADIANS[0] - lo) / (hi - lo)


def _mask(*spans: int) -> tuple[bool, ...]:
    """openpi's make_bool_mask: positive n -> n True, negative n -> |n| False."""
    out: list[bool] = []
    for n in spans:
        out += [n > 0] * abs(n)
    return tuple(out)


NONE = Conventions("none", "the model's own units: no delta actions, no ALOHA conversions (random weights, benchmarks)")

CONVENTIONS: dict[str, Conventions] = {c.name: c for c in (
    NONE,
    Conventions("openpi:pi0_libero", "openpi pi0_libero: the first 6 actions relative to the state (its extra delta "
                "transform), the gripper absolute, 50 actions a chunk", family="pi0", layout="libero",
                delta_action_mask=_mask(6, -1), action_horizon=50),
    Conventions("openpi:pi05_libero", "openpi pi05_libero: absolute actions, the state kept out of the prompt (pi0's "
                "prompt), 10 actions a chunk", family="pi05", layout="libero", state_in_prompt=False,
                action_horizon=10),
    *(Conventions(f"openpi:{name}", f"openpi {name}: ALOHA adapted to pi's space, the joints relative to the state, "
                  "the grippers absolute, 50 actions a chunk" + (f", default prompt {prompt!r}" if prompt else ""),
                  family="pi05" if name.startswith("pi05") else "pi0", layout="aloha",
                  delta_action_mask=_mask(6, -1, 6, -1), aloha_adapt_to_pi=True, action_horizon=50,
                  default_prompt=prompt)
      for name, prompt in (("pi0_aloha", None), ("pi0_aloha_towel", "fold the towel"),
                           ("pi0_aloha_tupperware", "open the tupperware and put the food on the plate"),
                           ("pi0_aloha_pen_uncap", "uncap the pen"), ("pi05_aloha", None),
                           ("pi05_aloha_pen_uncap", "uncap the pen"))),
    Conventions("openpi:pi0_aloha_sim", "openpi pi0_aloha_sim: ALOHA adapted to pi's space, absolute actions, 50 "
                "actions a chunk, default prompt 'Transfer cube'", family="pi0", layout="aloha", aloha_adapt_to_pi=True,
                action_horizon=50, default_prompt="Transfer cube"),
    Conventions("openpi:pi0_droid", "openpi pi0_droid: DROID's joint velocities and gripper, absolute, 10 actions "
                "a chunk", family="pi0", layout="droid", action_horizon=10),
    Conventions("openpi:pi05_droid", "openpi pi05_droid: DROID's joint velocities and gripper, absolute, the state "
                "in the prompt, 15 actions a chunk", family="pi05", layout="droid", action_horizon=15),
    Conventions("lerobot:pi0", "LeRobot pi0: absolute actions, the prompt as given (BOS + text + newline), the "
                "checkpoint's chunk (config.json; LeRobot's default 50 without one)", family="pi0",
                prompt_style="lerobot", default_action_horizon=50, image_resize="lerobot"),
    Conventions("lerobot:pi05", "LeRobot 0.5+ pi0.5: absolute actions, the state in the prompt, the checkpoint's "
                "chunk (config.json; 50 without one)", family="pi05", default_action_horizon=50,
                image_resize="lerobot"),
    Conventions("lerobot0.4:pi05", "LeRobot 0.4 pi0.5: as lerobot:pi05, the prompt's state padded to 32 dims",
                family="pi05", default_action_horizon=50, state_prompt_pad_to=32,
                image_resize="lerobot0.4"),
)}


def conventions_for(pi05: bool, layout: str) -> list[str]:
    """The names of the conventions (not "none") that fit a model family and observation layout."""
    return [c.name for c in CONVENTIONS.values() if c is not NONE and c.fits(pi05, layout) is None]


def get_conventions(name: str | Conventions | None) -> Conventions:
    if isinstance(name, Conventions):
        return name
    if name is None:
        return NONE
    if name not in CONVENTIONS:
        raise ValueError(f"unknown conventions {name!r}; expected one of: {', '.join(CONVENTIONS)}")
    return CONVENTIONS[name]
