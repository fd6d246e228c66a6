"""vlaperf against openpi's own JAX model on one of openpi's JAX checkpoints: the same weights, the same
observation, the same noise, both in float32 on the CPU; prints how far apart the actions are.

    python benchmarks/openpi_jax_parity.py --openpi-src ~/openpi/src \\
        --checkpoint ~/.cache/openpi/openpi-assets/checkpoints/pi05_libero --workload libero-pi05 --json parity.json

Run it where openpi's JAX stack is installed (its own environment: jax, flax, orbax), with vlaperf and tensorstore
added (`pip install -e ".[openpi-jax]"`). openpi is imported from the checkout given, not copied. The checkpoint
is read twice: by openpi's `restore_params` into its `Pi0` (built from `Pi0Config` with the workload's pi0 / pi0.5,
action horizon and prompt length, and the Gemma variants given: `gemma_2b_lora` / `gemma_300m_lora` for a LoRA
fine-tune), and by `vlaperf.checkpoints.load_checkpoint` into vlaperf's reference model. The observation is
vlaperf's random one for the workload (its masked cameras and padded prompt included), handed to openpi as
openpi's `Observation`. Both compute in float32 (JAX's matmuls at "highest" precision): the actions should
agree to ~1e-5 relative L2; the checked-in fixtures agree to 5e-7 - 2e-6.

--fixture DIR checks one of tests/data/openpi_jax/'s small checkpoints instead (openpi patched to its sizes, as
benchmarks/openpi_jax_fixture.py made it), with the inputs recorded beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openpi_jax_fixture import import_openpi  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--openpi-src", required=True, help="openpi's src folder (holding the openpi package)")
    p.add_argument("--checkpoint", help="an openpi JAX checkpoint folder (holding params/)")
    p.add_argument("--workload", default="libero-pi0", help="vlaperf workload: the model family, horizon, prompt and cameras")
    p.add_argument("--paligemma-variant", default="gemma_2b")
    p.add_argument("--action-expert-variant", default="gemma_300m")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixture", default=None, help="a folder of tests/data/openpi_jax/ instead of --checkpoint")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if (args.checkpoint is None) == (args.fixture is None):
        raise SystemExit("give --checkpoint or --fixture (one of them)")
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_default_matmul_precision", "highest")
    pi0_config, model_lib = import_openpi(args.openpi_src, small=args.fixture is not None)
    from vlaperf.checkpoints import load_checkpoint
    from vlaperf.inputs import IMAGE_SLOTS, Observation, random_noise, random_observation
    from vlaperf.models.pi0 import GemmaConfig, Pi0Config, VisionConfig, build_model
    from vlaperf.workloads import get_workload

    if args.fixture:
        folder = Path(args.fixture)
        c = json.loads((folder / "config.json").read_text())
        cfg = Pi0Config(folder.name, VisionConfig(**c["vision"]), GemmaConfig(**c["backbone"]), GemmaConfig(**c["expert"]),
                        pi05=c["pi05"], action_dim=c["action_dim"], action_horizon=c["action_horizon"],
                        max_token_len=c["max_token_len"])
        lora = "_lora" if c.get("lora") else ""
        variants = ("vlaperf_backbone" + lora, "vlaperf_expert" + lora)
        e = np.load(folder / "expected.npz")
        images = torch.from_numpy(e["pixels"]).float().div(127.5).sub(1.0).permute(0, 1, 4, 2, 3).contiguous()
        obs = Observation(images, torch.from_numpy(e["image_mask"]), torch.from_numpy(e["tokens"]).long(),
                          torch.from_numpy(e["token_mask"]), torch.from_numpy(e["state"]))
        noise, steps, workload = torch.from_numpy(e["noise"]), c["num_steps"], None
    else:
        folder = Path(args.checkpoint)
        w = get_workload(args.workload)
        cfg, variants, steps, workload = w.model_config(), (args.paligemma_variant, args.action_expert_variant), args.steps, w.id
        obs = random_observation(w, cfg, "cpu", seed=args.seed)
        noise = random_noise(w, cfg, "cpu", seed=args.seed)

    model = build_model(cfg, "cpu", torch.float32)
    report = load_checkpoint(model, folder)
    with torch.no_grad():
        ours = model.sample_actions(obs, noise, num_steps=steps)

    openpi_cfg = pi0_config.Pi0Config(dtype="float32", paligemma_variant=variants[0], action_expert_variant=variants[1],
                                      action_dim=cfg.action_dim, action_horizon=cfg.action_horizon,
                                      max_token_len=cfg.max_token_len, pi05=cfg.pi05)
    params = model_lib.restore_params(report["path"] + "/params", restore_type=np.ndarray, dtype=jnp.float32)
    jax_model = openpi_cfg.load(params)
    images = {k: jnp.asarray(obs.images[:, i].permute(0, 2, 3, 1).numpy()) for i, k in enumerate(IMAGE_SLOTS)}
    masks = {k: jnp.asarray(obs.image_mask[:, i].numpy()) for i, k in enumerate(IMAGE_SLOTS)}
    jax_obs = model_lib.Observation(images=images, image_masks=masks, state=jnp.asarray(obs.state.numpy()),
                                    tokenized_prompt=jnp.asarray(obs.tokens.numpy().astype(np.int32)),
                                    tokenized_prompt_mask=jnp.asarray(obs.token_mask.numpy()))
    theirs = torch.from_numpy(np.asarray(jax_model.sample_actions(jax.random.key(0), jax_obs, num_steps=steps,
                                                                  noise=jnp.asarray(noise.numpy())), np.float32))
    rel = ((ours - theirs).norm() / theirs.norm()).item()
    result = {"checkpoint": report["path"], "workload": workload, "variants": list(variants), "steps": steps,
              "lora_merged": report["lora_merged"], "rel_l2": rel, "max_abs": (ours - theirs).abs().max().item(),
              "actions_shape": list(ours.shape), "jax": jax.__version__}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
