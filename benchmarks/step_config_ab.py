"""`best` with one step-kernel tiling (A: an earlier session's) against another (B: today's
defaults, or `--new`), in one process, interleaved: the whole call, not the kernel alone.

Each engine is captured while `expert_step` is wrapped to pass its configuration; the CUDA
graph keeps that launch, so once the wrapper is gone both engines replay side by side. Each
round times one call of each; the ratio of medians says what the kernel change gave the call,
free of the machine-to-machine spread between device calls.

    python benchmarks/step_config_ab.py --base "bn_o=16 ks_o=2 idle_prefetch=0" --json $OUT/step_ab.json
    python benchmarks/step_config_ab.py --base "" --new "k_rotate=1" --json $OUT/step_ab_rotate.json
    python benchmarks/step_config_ab.py --base "" --identity-mod --json $OUT/step_ab_identity_mod.json

--identity-mod (pi0): side B runs pi0's step through pi0.5's modulated path with a table that
changes nothing (scales 1, shifts 0, gates 1; pi0's norm scales stay folded in the weights):
the same layers, through the writers' statistics and the modulated input buffer.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

import torch
from engine_ab import ab_result, finish, interleave  # benchmarks/ (the script's folder is on sys.path)
from step_kernel_once import parse_config

from vlaperf.check import check_equivalence
from vlaperf.engine import Engine
from vlaperf.engine.kernels import expert_step as S
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.timing import require_cuda
from vlaperf.workloads import get_workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--base", required=True, help="side A, as changes to today's defaults: 'name=value ...' ('' = the defaults)")
    p.add_argument("--new", default="", help="side B, as changes to today's defaults (default: the defaults)")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--json", default=None)
    p.add_argument("--identity-mod", action="store_true",
                   help="side B: pi0 through pi0.5's modulated kernel path with an identity table (see the docstring)")
    args = p.parse_args()
    base, new = parse_config(args.base.split()), parse_config(args.new.split())
    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    real = S.expert_step
    S.expert_step = lambda *a, **kw: real(*a, **{**kw, "config": base})  # noqa: E731
    older = Engine(model, "best")
    out_older = older.sample_actions(obs, noise, w.steps)  # compiled and captured with the older tiling
    base_launch = S.last_launch("cuda")  # its fitted fields as resolved (expert_step.fit_config)
    S.expert_step = lambda *a, **kw: real(*a, **{**kw, "config": new})  # noqa: E731
    if args.identity_mod:
        if model.config.pi05:
            raise SystemExit("--identity-mod is for pi0 (pi0.5 has its own table)")
        e = model.config.expert
        qkv_n = (e.num_heads + 2 * e.num_kv_heads) * e.head_dim
        one, zero = (lambda n: torch.ones(n, device="cuda")), (lambda n: torch.zeros(n, device="cuda"))  # noqa: E731
        # per layer: 1 + scale1, shift1 @ Wqkv^T, gate1, 1 + scale2, shift2 @ Wgu^T, gate2 (modulation_table)
        row = torch.cat([one(e.width), zero(qkv_n), one(e.width), one(e.width), zero(2 * e.mlp_dim), one(e.width)])
        identity = row.repeat(e.depth, 1).contiguous()
        S.expert_step = lambda *a, **kw: real(*a, **{**kw, "config": new, "mod": identity})  # noqa: E731
    today = Engine(model, "best")
    out_today = today.sample_actions(obs, noise, w.steps)
    default_launch = S.last_launch("cuda")
    S.expert_step = real
    samples = interleave({"base": lambda: older.sample_actions(obs, noise, w.steps),
                          "defaults": lambda: today.sample_actions(obs, noise, w.steps)}, args.rounds)
    result = ab_result("step-config-ab", w, model, today, samples, "base", "defaults")
    result.update(base_config=asdict(base), default_config=asdict(new), identity_mod=args.identity_mod,
                  base_launch=base_launch, default_launch=default_launch,
                  rel_l2_defaults_vs_base=((out_today - out_older).norm() / out_older.norm()).item(),
                  equivalence_defaults=check_equivalence(model, today, w))
    finish(result, "rel_l2_defaults_vs_base", "equivalence_defaults", args.json)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
