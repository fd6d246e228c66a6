"""The standard workloads of `shared/design/workloads.md` as data.

Every figure vlaperf reports names one of these ids, so that numbers from different
sessions, machines and implementations can be put side by side. A workload is
model preset + input shapes + sampler settings; weights are random unless a
checkpoint is given.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass


def given_overrides(overrides: dict) -> dict:
    """The overrides that were given (None: keep the workload's), batch and steps checked."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for name in ("batch", "steps"):
        if name in overrides and (not isinstance(overrides[name], int) or overrides[name] < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {overrides[name]!r}")
    return overrides


@dataclass(frozen=True)
class Workload:
    id: str
    preset: str  # model preset name in vlaperf.models.pi0.PRESETS
    batch: int
    image_valid: tuple[bool, ...]  # one entry per image slot; False = all-zero, masked slot
    prompt_slots: int  # padded prompt length (openpi's max_token_len)
    prompt_valid: tuple[int, ...]  # valid prompt tokens per sample (len == batch)
    state_dim: int  # the robot's state dim before padding to the model's max_state_dim
    robot_action_dim: int  # actions are unpadded to this in policy mode
    horizon: int
    action_dim: int  # the model's (padded) action dim
    steps: int
    layout: str  # openpi observation key layout for policy mode: "libero" | "aloha" | "droid"

    @property
    def image_slots(self) -> int:
        return len(self.image_valid)

    def model_config(self):
        """The model config this workload runs: its preset with its action chunk (droid-pi0's 10 actions
        against pi0's 50, for one)."""
        from vlaperf.models.pi0 import get_config

        config = get_config(self.preset)
        return config if config.action_horizon == self.horizon else get_config(self.preset, action_horizon=self.horizon)

    def with_overrides(self, **overrides) -> "Workload":
        """A copy with some knobs changed (batch, steps); keeps per-sample lists consistent."""
        overrides = given_overrides(overrides)
        if not overrides:
            return self
        w = dataclasses.replace(self, **overrides)
        if w.batch != len(w.prompt_valid):
            # Repeat the per-sample prompt lengths cyclically to the new batch size.
            w = dataclasses.replace(
                w, prompt_valid=tuple(self.prompt_valid[i % len(self.prompt_valid)] for i in range(w.batch))
            )
        return w

    def overrides_vs(self, base: "Workload") -> dict:
        """Knobs that differ from `base` (recorded in every result file); the per-sample prompt lengths only
        where they are not what another batch size makes of base's (with_overrides), as that is no choice."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if getattr(self, f.name) != getattr(base, f.name)}
        derived = tuple(base.prompt_valid[i % len(base.prompt_valid)] for i in range(self.batch))
        if "prompt_valid" in out and self.prompt_valid == derived:
            del out["prompt_valid"]
        return out


def _spread(lo: int, hi: int, n: int) -> tuple[int, ...]:
    """n prompt lengths evenly spread over [lo, hi] (batched workloads differ per sample)."""
    if n == 1:
        return (hi,)
    return tuple(round(lo + (hi - lo) * i / (n - 1)) for i in range(n))


# LIBERO: base + left wrist valid; right wrist all zeros with mask False (openpi's LIBERO transform).
_LIBERO_IMAGES = (True, True, False)

WORKLOADS: dict[str, Workload] = {
    w.id: w
    for w in [
        Workload("libero-pi0", "pi0", 1, _LIBERO_IMAGES, 48, (20,), 8, 7, 50, 32, 10, "libero"),
        Workload("libero-pi05", "pi05", 1, _LIBERO_IMAGES, 200, (64,), 8, 7, 10, 32, 10, "libero"),
        Workload("libero-shallow6", "shallow6", 1, _LIBERO_IMAGES, 48, (20,), 8, 7, 50, 32, 10, "libero"),
        Workload("aloha-pi0", "pi0", 1, (True, True, True), 48, (6,), 14, 14, 50, 32, 10, "aloha"),
        Workload("libero-pi0-b4", "pi0", 4, _LIBERO_IMAGES, 48, _spread(12, 28, 4), 8, 7, 50, 32, 10, "libero"),
        Workload("libero-pi0-b8", "pi0", 8, _LIBERO_IMAGES, 48, _spread(12, 28, 8), 8, 7, 50, 32, 10, "libero"),
        Workload("tiny", "tiny", 1, _LIBERO_IMAGES, 16, (6,), 8, 7, 10, 8, 4, "libero"),
        # Beyond the standard list: the layouts of openpi's other public checkpoints, so that they can be served
        # with their conventions (vlaperf.conventions). DROID: the exterior and wrist cameras (the right wrist slot
        # masked, as LIBERO's), 7 joints + the gripper, 8 actions; pi0_droid's chunk is 10, pi05_droid's 15.
        # pi0.5 ALOHA: aloha-pi0's cameras, state and chunk with pi0.5's 200 prompt slots.
        Workload("droid-pi0", "pi0", 1, _LIBERO_IMAGES, 48, (20,), 8, 8, 10, 32, 10, "droid"),
        Workload("droid-pi05", "pi05", 1, _LIBERO_IMAGES, 200, (64,), 8, 8, 15, 32, 10, "droid"),
        Workload("aloha-pi05", "pi05", 1, (True, True, True), 200, (48,), 14, 14, 50, 32, 10, "aloha"),
    ]
}



@dataclass(frozen=True)
class WamWorkload:
    """A world-action-model workload (seed 000): model preset + batch + sampler settings.

    `video_steps` < `steps` is the "early stop" of the video tokens: the video is finished
    after that many model calls and held clean while the actions go on (models/wam.py)."""

    id: str
    preset: str  # model preset name in vlaperf.models.wam.PRESETS
    batch: int
    steps: int  # model calls, the action schedule
    video_steps: int  # the video's schedule (<= steps)
    sparsity: str = "none"  # none | drop_middle | mae_middle
    cfg_scale: float = 0.0  # 0: no guidance (seed 000's cfg=0); > 0 doubles the batch
    shift: float = 3.0  # flow-matching time shift of both schedules

    def with_overrides(self, **overrides) -> "WamWorkload":
        overrides = given_overrides(overrides)
        if not overrides:
            return self
        if "steps" in overrides and "video_steps" not in overrides:
            # keep the early stop's share of the calls (half by default), a half rounded up in integers: Python's
            # round() halves to even, which gave wam-761 at 5 steps 2 video steps (40%) and at 7 steps 4 (57%)
            steps = overrides["steps"]
            overrides["video_steps"] = max(1, (2 * self.video_steps * steps + self.steps) // (2 * self.steps))
        w = dataclasses.replace(self, **overrides)
        from vlaperf.models.wam import check_sampling_args

        check_sampling_args(w.steps, w.video_steps, w.sparsity, w.cfg_scale, w.shift)
        return w

    def sampling(self) -> dict:
        """The keyword arguments of `generate` (model or engine) that this workload fixes."""
        return {"steps": self.steps, "video_steps": self.video_steps, "sparsity": self.sparsity,
                "cfg_scale": self.cfg_scale, "shift": self.shift}

    def overrides_vs(self, base: "WamWorkload") -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(base, f.name)}


# 761 tokens = 6 frames x 120 patches + 1 state + 40 actions; 10 action steps, the video finished
# in 5 (early stop), no guidance: seed 000's `generate(early_stop=True, cfg=0)`.
WAM_WORKLOADS: dict[str, WamWorkload] = {
    w.id: w
    for w in [
        WamWorkload("wam-761", "wam", 1, 10, 5),
        WamWorkload("wam-tiny", "wam-tiny", 1, 4, 2),
    ]
}


def is_wam_workload(workload_id: str | None) -> bool:
    return workload_id in WAM_WORKLOADS


def get_wam_workload(workload_id: str) -> WamWorkload:
    if workload_id not in WAM_WORKLOADS:
        raise ValueError(f"unknown world-action-model workload {workload_id!r}; expected one of: {', '.join(WAM_WORKLOADS)}")
    return WAM_WORKLOADS[workload_id]


def get_workload(workload_id: str) -> Workload:
    if workload_id in WORKLOADS:
        return WORKLOADS[workload_id]
    if workload_id in WAM_WORKLOADS:
        raise ValueError(f"workload {workload_id!r} is a world-action model workload: `vlaperf bench`, `check`, `matrix`, `breakdown`, `scaling`, `syncs`, `doctor` and `serve` "
                         "run it; this command takes a pi0-family workload")
    known = list(WORKLOADS) + list(WAM_WORKLOADS)
    if "," in workload_id and all(w.strip() in known for w in workload_id.split(",")):
        raise ValueError(f"workload {workload_id!r} is a list: only `vlaperf matrix --ray` runs several workloads; "
                         "give one id here")
    near = difflib.get_close_matches(workload_id.lower(), known, n=1, cutoff=0.75)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ValueError(f"unknown workload {workload_id!r}{hint}; expected one of: {', '.join(known)}")
