"""What float8 (e4m3) matmuls would do to the actions, on the CPU: the reference model in float32 against the
same model with every transformer matmul's operands rounded first (emulated: rounded, then multiplied in float32).

  bf16       weights and inputs rounded to bfloat16 (what `best` computes with on a GPU; the yardstick)
  fp8_w      weights rounded to e4m3 with a scale per output row, inputs to bfloat16 (weight-only float8)
  fp8_w_a    weights as fp8_w, inputs to e4m3 with a scale per row (what torch._scaled_mm row-wise computes)

Same weights, observation and noise for all; the relative L2 error of the actions against the float32 reference, as
`vlaperf check` measures it. The heads outside the transformers stay float32, as openpi keeps them. Random weights
by default; `--checkpoint` loads real ones (an openpi or LeRobot model.safetensors, or an openpi JAX folder), whose
outliers random weights do not have: that is the figure to decide on float8 for a policy.

    python benchmarks/fp8_action_error.py --workload libero-pi0 --json fp8_action_error.json
    python benchmarks/fp8_action_error.py --workload libero-pi0 --checkpoint path/to/pi0_libero --device cuda
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from vlaperf.check import compare
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record
from vlaperf.workloads import get_workload

E4M3_MAX = 448.0


def e4m3_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to e4m3 with one scale per row (its largest magnitude maps to e4m3's largest value)."""
    scale = t.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    return (t / scale).to(torch.float8_e4m3fn).float() * scale


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


ROUNDING = {"bf16": (bf16, bf16), "fp8_w": (e4m3_rows, bf16), "fp8_w_a": (e4m3_rows, e4m3_rows)}  # (weights, inputs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="real weights (vlaperf.checkpoints.load_checkpoint); default random")
    p.add_argument("--device", default="cpu", help="where the float32 model runs (a GPU is far faster for the real sizes)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    wl = get_workload(args.workload)
    model = build_model(wl.preset, args.device, torch.float32, seed=args.seed)
    if args.checkpoint:
        from vlaperf.checkpoints import load_checkpoint

        load_checkpoint(model, args.checkpoint)
    obs = random_observation(wl, model.config, args.device, seed=100 + args.seed)
    noise = random_noise(wl, model.config, args.device, seed=100 + args.seed)
    rounded = [m for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name.startswith("paligemma_with_expert.") and "lm_head" not in name]
    plain = nn.Linear.forward
    mode = {"rounding": None}

    def forward(self, x):
        if mode["rounding"] is None or self not in selected:
            return plain(self, x)
        round_w, round_x = mode["rounding"]
        # the weight is rounded on every call (not cached): a cached copy of every weight would double the memory
        return F.linear(round_x(x), round_w(self.weight), self.bias)

    selected = set(rounded)
    nn.Linear.forward = forward
    result = {"schema": SCHEMA, "command": "fp8-action-error", "workload": {"id": args.workload, "overrides": {}},
              "variant": {"levers": [], "label": "reference path, matmul operands rounded", "dtype": "float32",
                          "checkpoint": args.checkpoint},
              "mode": "model", "env": environment_record(args.device), "matmuls_rounded": len(rounded), "rows": []}
    try:
        with torch.no_grad():
            start = time.perf_counter()
            reference = model.sample_actions(obs, noise, wl.steps)
            print(f"float32 reference: {time.perf_counter() - start:.1f} s", flush=True)
            for name, rounding in ROUNDING.items():
                mode["rounding"] = rounding
                actions = model.sample_actions(obs, noise, wl.steps)
                got = compare(actions, reference, torch.bfloat16)  # tolerance: the bf16 one `vlaperf check` applies
                row = {"rounding": name, "rel_l2": got["rel_l2"], "max_abs": got["max_abs"],
                       "bf16_tolerance": got["tolerance"], "within_bf16_tolerance": got["passed"]}
                result["rows"].append(row)
                print(row, flush=True)
    finally:
        nn.Linear.forward = plain
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
