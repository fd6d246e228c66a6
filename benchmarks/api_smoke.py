"""The session's API checks on the GPU, in the dtypes the CPU tests do not run (bf16): a pi0 policy call
through `best`, a checkpoint saved and loaded with an engine built after the load, and the world-action
policy (float32 noise beside a bf16 observation) through its engine. Prints one line per check; exits 1
on the first failure.

    python benchmarks/api_smoke.py                                   (the GPU: libero-pi0, wam-761)
    python benchmarks/api_smoke.py --device cpu --workload tiny --wam-workload wam-tiny --levers exact
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

from vlaperf.checkpoints import load_checkpoint, save_checkpoint
from vlaperf.engine import Engine
from vlaperf.engine.wam import WamEngine
from vlaperf.inputs import make_example, random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.models.wam import build_wam
from vlaperf.policy import Policy, WamPolicy, make_wam_example
from vlaperf.workloads import get_wam_workload, get_workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--wam-workload", default="wam-761")
    p.add_argument("--levers", default="graph", help="the engines after the load and the world-action engine's")
    args = p.parse_args()
    dev = args.device
    w = get_workload(args.workload)
    model = build_model(w.preset, dev, seed=0)
    engine = Engine(model, "best")
    out = Policy(model, engine.sample_actions, w).infer(make_example(w))["actions"]
    print(f"pi0 policy, {engine.name}, {model.dtype}: actions {out.shape} {out.dtype}, finite {np.isfinite(out).all()}")
    with tempfile.TemporaryDirectory() as d:
        path = save_checkpoint(build_model(w.preset, dev, seed=1), d)
        stale = Engine(model, args.levers)
        load_checkpoint(model, path)
        try:
            stale.sample_actions(random_observation(w, model.config, dev), random_noise(w, model.config, dev), 2)
            raise SystemExit("an engine built before the load ran")
        except RuntimeError as e:
            print(f"engine built before the load: refused ({str(e)[:60]}...)")
        fresh = Engine(model, args.levers)
        obs, noise = random_observation(w, model.config, dev), random_noise(w, model.config, dev)
        rel = ((fresh.sample_actions(obs, noise, 10) - model.sample_actions(obs, noise, 10)).norm()
               / model.sample_actions(obs, noise, 10).norm()).item()
        print(f"engine built after the load: rel L2 to the reference {rel:.2e}")
        if not rel < 3e-2:
            raise SystemExit(1)
    ww = get_wam_workload(args.wam_workload)
    wam = build_wam(ww.preset, dev, seed=0)
    wam_engine = WamEngine(wam, args.levers)
    acts = WamPolicy(wam, wam_engine.generate, ww).infer(make_wam_example(ww))["actions"]
    print(f"world-action policy, {args.levers}, {wam.dtype}: actions {acts.shape} {acts.dtype}, finite {np.isfinite(acts).all()}")
    if not (np.isfinite(out).all() and np.isfinite(acts).all()):
        raise SystemExit(1)
    print("api smoke: ok")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
