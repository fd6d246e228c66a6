"""Policy mode: the path a policy server runs per request.

numpy observation dict -> validate/resize/normalise/tokenize -> host-to-device -> sample
-> device-to-host -> numpy actions unpadded to the robot's action dim.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from vlaperf.inputs import ObservationTransform, Tokenizer
from vlaperf.workloads import Workload


class Policy:
    """`infer(example) -> {"actions": (H, robot_action_dim) float32, "policy_timing": {...}}`.

    `sample` is any `(obs, noise, num_steps) -> actions` function: the reference
    `model.sample_actions` or an `Engine.sample_actions`. Noise is fresh per call unless
    `noise` is given (benchmarks pass a fixed one). `verify`, if given, runs after the actions
    reach the host and raises if they cannot be trusted (`Engine.raise_on_kernel_fault`).
    """

    def __init__(self, model, sample: Callable, workload: Workload, tokenizer: Tokenizer | None = None,
                 num_steps: int | None = None, noise: torch.Tensor | None = None,
                 verify: Callable[[], None] | None = None):
        self.model, self.sample, self.workload, self.verify = model, sample, workload, verify
        self.device = model.action_in_proj.weight.device
        self.transform = ObservationTransform(workload, model.config, tokenizer, self.device)
        self.num_steps = num_steps or workload.steps
        self.noise = noise

    def infer(self, example: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
        t0 = time.perf_counter()
        obs = self.transform(example)
        noise = self.noise if self.noise is not None and self.noise.shape[0] == obs.batch else None
        t1 = time.perf_counter()
        actions = self.sample(obs, noise, self.num_steps)
        out = actions[..., : self.workload.robot_action_dim].cpu().numpy().astype(np.float32)
        if self.verify is not None:
            self.verify()
        t2 = time.perf_counter()
        timing = {"transform_ms": (t1 - t0) * 1e3, "sample_and_copy_ms": (t2 - t1) * 1e3, "infer_ms": (t2 - t0) * 1e3}
        if isinstance(example, dict):
            out = out[0]
        return {"actions": out, "policy_timing": timing}
