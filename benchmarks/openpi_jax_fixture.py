"""Make the openpi JAX checkpoint fixture that tests/test_openpi_jax.py checks vlaperf against.

openpi's public checkpoints (pi0_base, pi0_libero, pi05_droid, ...) are JAX parameter trees saved
by orbax (`<checkpoint>/params/`). To test vlaperf's reader of that format and its renaming of
openpi's JAX parameters, this script runs openpi's *own* JAX model:
  - from an openpi source checkout (`--openpi-src .../openpi/src`), in an environment with
    openpi's JAX pins (jax 0.5.3, flax 0.10.2, orbax-checkpoint 0.11.13, tensorstore 0.1.74),
    augmax and torch (openpi's modules import them at the top);
  - at a small size: openpi's Gemma configs swapped for two small ones whose width differs from
    heads x head dim (a renaming that confused the two axes would not load), SigLIP at width 32,
    depth 2, the vocabulary at 1024 tokens;
  - every parameter drawn at random (openpi zero-initialises SigLIP's head, which would hide the
    image path), computing in float32;
  - its params saved with orbax's PyTreeCheckpointer as openpi saves them: pi0 with every leaf
    under nnx's "value" key (a training checkpoint), pi0.5 as a pure dict (a released one), and a
    pi0 LoRA fine-tune (`pi0_lora`: both Gemmas with LoRA on attention and feed-forward, alpha =
    rank as openpi's gemma_2b_lora / gemma_300m_lora, the adapters random too);
  - its `sample_actions` on a fixed batch of two observations (a masked camera, prompts of two
    lengths) with fixed noise, recorded with the inputs in `expected.npz`, and the sizes in
    `config.json`.
Nothing of openpi is copied into this repository: the script imports it from the checkout given.

    python benchmarks/openpi_jax_fixture.py --openpi-src /path/to/openpi/src --out tests/data/openpi_jax
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np

BACKBONE = dict(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=32)
EXPERT = dict(width=48, depth=2, mlp_dim=96, num_heads=4, num_kv_heads=1, head_dim=32)
VISION = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=14)
VOCAB = 1024
ACTION_DIM, HORIZON, TOKENS, BATCH, STEPS = 8, 10, 16, 2, 10


def import_openpi(src: str, small: bool = True):
    """openpi's JAX model modules from the checkout at `src`; `small`: with this fixture's sizes (the Gemma variants
    named vlaperf_*, SigLIP at width 32, a 1024-token vocabulary) patched in; False leaves openpi as it is."""
    sys.path.insert(0, src)
    # openpi.models.model imports its PyTorch model (and through it transformers) at the top; the JAX
    # path never touches it
    stub = types.ModuleType("openpi.models_pytorch.pi0_pytorch")
    sys.modules["openpi.models_pytorch.pi0_pytorch"] = stub
    import openpi.models.gemma as gemma
    import openpi.models.lora as lora
    import openpi.models.pi0_config as pi0_config
    import openpi.models.siglip as siglip
    from openpi.models import model as model_lib

    if not small:
        return pi0_config, model_lib
    original = gemma.get_config
    sizes = {"vlaperf_backbone": BACKBONE, "vlaperf_expert": EXPERT}
    lora_ranks = {"vlaperf_backbone_lora": ("vlaperf_backbone", 4), "vlaperf_expert_lora": ("vlaperf_expert", 6)}

    def get_config(variant):
        if variant in lora_ranks:
            name, rank = lora_ranks[variant]
            adapters = {k: lora.LoRAConfig(rank=rank, alpha=float(rank)) for k in ("attn", "ffn")}
            return gemma.Config(**sizes[name], lora_configs=adapters)
        return gemma.Config(**sizes[variant]) if variant in sizes else original(variant)

    gemma.get_config = get_config
    gemma.PALIGEMMA_VOCAB_SIZE = VOCAB
    siglip_module = siglip._Module

    def small_siglip(num_classes=None, *, variant=None, **kw):
        vision = {**VISION, "patch_size": (VISION["patch_size"],) * 2}
        return siglip_module(num_classes, **{**vision, **kw})

    siglip.Module = small_siglip
    return pi0_config, model_lib


def randomize(model, seed: int):
    """Every parameter drawn at random: N(0, 0.1^2), norm scales and biases included."""
    import flax.nnx as nnx
    import jax

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [0.1 * jax.random.normal(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves, strict=True)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)


def observation(model_lib, rng: np.random.Generator):
    import jax.numpy as jnp

    pixels = rng.integers(0, 256, (BATCH, len(model_lib.IMAGE_KEYS), 224, 224, 3), dtype=np.uint8)
    pixels[:, 2] = 0  # openpi's absent camera (the right wrist): an all-zero image, masked
    images = {k: pixels[:, i].astype(np.float32) / 127.5 - 1.0 for i, k in enumerate(model_lib.IMAGE_KEYS)}
    masks = {k: np.full(BATCH, i != 2) for i, k in enumerate(model_lib.IMAGE_KEYS)}
    tokens = rng.integers(0, VOCAB, (BATCH, TOKENS)).astype(np.int32)
    token_mask = np.zeros((BATCH, TOKENS), bool)
    token_mask[0, :9] = True
    token_mask[1, :5] = True
    state = rng.normal(size=(BATCH, ACTION_DIM)).astype(np.float32)
    obs = model_lib.Observation(
        images={k: jnp.asarray(v) for k, v in images.items()}, image_masks={k: jnp.asarray(v) for k, v in masks.items()},
        state=jnp.asarray(state), tokenized_prompt=jnp.asarray(tokens), tokenized_prompt_mask=jnp.asarray(token_mask))
    arrays = {"pixels": pixels,  # (B, S, 224, 224, 3) uint8; the model saw pixels / 127.5 - 1
              "image_mask": np.stack([masks[k] for k in model_lib.IMAGE_KEYS], axis=1), "tokens": tokens,
              "token_mask": token_mask, "state": state}
    return obs, arrays


def make(name: str, pi05: bool, value_leaves: bool, out: Path, pi0_config, model_lib, seed: int,
         lora: bool = False) -> None:
    import flax.nnx as nnx
    import jax
    import orbax.checkpoint as ocp

    suffix = "_lora" if lora else ""
    config = pi0_config.Pi0Config(dtype="float32", paligemma_variant="vlaperf_backbone" + suffix,
                                  action_expert_variant="vlaperf_expert" + suffix, action_dim=ACTION_DIM,
                                  action_horizon=HORIZON, max_token_len=TOKENS, pi05=pi05)
    model = randomize(config.create(jax.random.key(seed)), seed + 1)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    if value_leaves:
        params = jax.tree.map(lambda a: {"value": a}, params)
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    with ocp.PyTreeCheckpointer() as ckptr:
        ckptr.save((folder / "params").resolve(), {"params": params})

    rng = np.random.default_rng(seed)
    obs, arrays = observation(model_lib, rng)
    noise = rng.normal(size=(BATCH, HORIZON, ACTION_DIM)).astype(np.float32)
    actions = model.sample_actions(jax.random.key(0), obs, num_steps=STEPS, noise=jax.numpy.asarray(noise))
    np.savez_compressed(folder / "expected.npz", noise=noise, actions=np.asarray(actions, np.float32), **arrays)
    (folder / "config.json").write_text(json.dumps(dict(
        pi05=pi05, value_leaves=value_leaves, lora=lora, backbone={**BACKBONE, "vocab_size": VOCAB},
        expert={**EXPERT, "vocab_size": VOCAB}, vision={**VISION, "image_size": 224}, action_dim=ACTION_DIM,
        action_horizon=HORIZON, max_token_len=TOKENS, num_steps=STEPS,
        made_with={"jax": jax.__version__, "orbax-checkpoint": ocp.__version__}), indent=1) + "\n")
    print(f"{name}: actions {np.asarray(actions).shape}, |a| mean {float(np.abs(np.asarray(actions)).mean()):.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--openpi-src", required=True, help="openpi's src folder (holding the openpi package)")
    p.add_argument("--out", default="tests/data/openpi_jax")
    args = p.parse_args()
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    pi0_config, model_lib = import_openpi(args.openpi_src)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    make("pi0", False, True, out, pi0_config, model_lib, seed=0)
    make("pi05", True, False, out, pi0_config, model_lib, seed=1)
    make("pi0_lora", False, False, out, pi0_config, model_lib, seed=2, lora=True)


if __name__ == "__main__":
    main()
