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


def check_conventions(model, engine, w, dev) -> None:
    """A real checkpoint's serving path on this device: 480 x 640 camera images (resized here, antialiased),
    openpi statistics and pi0_libero's delta actions, through the engine against the reference path."""
    import json

    from vlaperf.inputs import resize_with_pad

    rng = np.random.default_rng(0)
    cam = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    on_device = resize_with_pad(torch.from_numpy(cam).to(dev), 224).cpu()
    on_cpu = resize_with_pad(torch.from_numpy(cam), 224)
    diff = (on_device.int() - on_cpu.int()).abs().max().item()
    print(f"resize 480x640 -> 224 on {dev} against the CPU: max difference {diff} of 255")
    if w.layout != "libero":
        return
    stats = {"norm_stats": {"state": {"mean": [0.1] * w.state_dim, "std": [0.5] * w.state_dim},
                            "actions": {"mean": [0.2] * w.robot_action_dim, "std": [2.0] * w.robot_action_dim}}}
    with tempfile.TemporaryDirectory() as d:
        from pathlib import Path

        from vlaperf.normalize import NormStats

        Path(d, "norm_stats.json").write_text(json.dumps(stats))
        ns = NormStats.load(d, quantile=model.config.pi05)
    ex = make_example(w, seed=3)
    ex["observation/image"] = cam
    ex["observation/wrist_image"] = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    conv = "openpi:pi0_libero" if not model.config.pi05 else "openpi:pi05_libero"
    noise = random_noise(w, model.config, dev)
    fast = Policy(model, engine.sample_actions, w, noise=noise, norm_stats=ns, conventions=conv).infer(ex)["actions"]
    ref = Policy(model, model.sample_actions, w, noise=noise, norm_stats=ns, conventions=conv).infer(ex)["actions"]
    rel = float(np.linalg.norm(fast - ref) / np.linalg.norm(ref))
    print(f"policy with {conv}, statistics and 480x640 images, {engine.name} against the reference: rel L2 {rel:.2e}")
    if diff > 1 or not rel < 3e-2 or not np.isfinite(fast).all():
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--wam-workload", default="wam-761")
    p.add_argument("--levers", default="graph", help="the engines after the load and the world-action engine's")
    args = p.parse_args()
    dev = args.device
    w = get_workload(args.workload)
    model = build_model(w.model_config(), dev, seed=0)
    engine = Engine(model, "best")
    out = Policy(model, engine.sample_actions, w).infer(make_example(w))["actions"]
    print(f"pi0 policy, {engine.name}, {model.dtype}: actions {out.shape} {out.dtype}, finite {np.isfinite(out).all()}")
    check_conventions(model, engine, w, dev)
    with tempfile.TemporaryDirectory() as d:
        path = save_checkpoint(build_model(w.model_config(), dev, seed=1), d)
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
