"""How far a guided engine call is from the reference's guided call, against the same engine's unguided error, on
`tiny` in float32 (the GPU tests' setting), per variant and maximum guidance weight.

Why: on an H100 (session 47) `best`'s guided calls were 4.6e-4 and 6.9e-4 from the reference's (relative L2), over
the tests' 1e-4, while `graph` passed. RTC's step is v' = v (1 - g w t) - g w (target - x_t): an error in the
velocity is scaled by |1 - g w t| (up to g - 1 at the noise, t = 1) and an error in x_t comes back as g w of it, so a
variant's unguided error (TF32x3 heads in `best`) should grow with the guidance weight g, and vanish toward the
unguided error as g goes to 0. A guided error that does not follow g would be a fault of the guided path itself.

    python benchmarks/guidance_error_probe.py [--device cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import Guidance, build_model, get_config, rtc_prefix_weights, rtc_step_weights
from vlaperf.timing import environment_record
from vlaperf.workloads import get_workload

STEPS = 4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="graph;best" if torch.cuda.is_available() else "exact;for_loop,static_kv_cache")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg, wl = get_config("tiny"), get_workload("tiny")
    model = build_model(cfg, args.device, torch.float32, seed=3)
    H = wl.horizon
    rows = []
    for variant in args.variants.split(";"):
        engine = Engine(model, variant)
        for seed in range(args.seeds):
            obs = random_observation(wl, cfg, args.device, seed=seed)
            noise = random_noise(wl, cfg, args.device, seed=seed)
            target = torch.randn(noise.shape, generator=torch.Generator().manual_seed(seed + 5)).to(args.device)
            weights = rtc_prefix_weights(2, 6, H).to(args.device)
            plain = rel(engine.sample_actions(obs, noise, STEPS), model.sample_actions(obs, noise, STEPS))
            for max_weight in (0.0, 1.0, 2.0, 5.0, 10.0):
                steps = rtc_step_weights(STEPS, max_weight, args.device) if max_weight else torch.zeros(STEPS, device=args.device)
                g = Guidance(target, weights, steps)
                err = rel(engine.sample_actions(obs, noise, STEPS, g), model.sample_actions(obs, noise, STEPS, g))
                rows.append({"variant": variant, "seed": seed, "max_weight": max_weight, "unguided_rel_l2": plain,
                             "guided_rel_l2": err, "ratio": err / plain if plain else None})
                print(f"{variant:32s} seed {seed} max weight {max_weight:4.1f}: unguided {plain:.2e} guided {err:.2e}"
                      + (f" ({err / plain:.1f}x)" if plain else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "guidance_error_probe", "steps": STEPS, "rows": rows,
                       "env": environment_record(torch.device(args.device))}, f, indent=1)


if __name__ == "__main__":
    main()
