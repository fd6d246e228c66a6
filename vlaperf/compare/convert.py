"""Checkpoint conversion between openpi's and LeRobot's `model.safetensors` layouts, and from
openpi's JAX checkpoints (an orbax `params/` folder, read by `vlaperf.openpi_jax`) to either.

    convert_checkpoint("pi0_openpi/", "pi0_lerobot/", "openpi", "lerobot", "pi0")
    convert_checkpoint("checkpoints/pi05_libero", "pi05_libero_pt/", "openpi-jax", "openpi", "pi05")

Both layouts hold the same tensors under the same names, LeRobot's under a `model.` prefix
(its policy keeps openpi's `PI0Pytorch` as `self.model`). The conversion is strict: every
tensor of the model preset must be there with its exact shape, and nothing else may be; a
mismatch raises vlaperf.checkpoints.CheckpointError naming each offending key (with both
shapes for a wrong shape). Names and shapes are checked against a `Pi0Model` built on the
`meta` device, so no weights are allocated; only the file's tensors are held in memory.
dtypes are kept as stored (openpi's converted files are all bfloat16).

Naming, as read in openpi and LeRobot 0.6.1 source:
  - pi0's time MLP is `action_time_mlp_{in,out}`, pi0.5's is `time_mlp_{in,out}` in both
    layouts. LeRobot's loader also accepts the other name (older files); so does this
    converter, and the report lists each such rename.
  - The token embedding: openpi ties it to the PaliGemma LM head and its file stores the
    tensor once, as `paligemma_with_expert.paligemma.lm_head.weight`. In LeRobot 0.6.1
    (transformers 5.5) the two are separate parameters: LeRobot replaces PaliGemma's inner
    model after transformers tied them, so its `save_pretrained` (safetensors `save_model`)
    stores BOTH `model....paligemma.lm_head.weight` and
    `model....paligemma.model.language_model.embed_tokens.weight`. Its `from_pretrained`
    copies the LM head into the embedding and then loads the file's embedding if present,
    which wins (safetensors hands keys over sorted, and `lm_head` sorts first). Inference
    never reads the LM head. So when a file has both names this converter takes the
    EMBEDDING's value (what both runtimes embed tokens with; after LeRobot fine-tuning only
    the embedding is trained) and reports whether the two differed.
  - Written files store the embedding once, under the LM head's name, in both layouts, as
    openpi does; LeRobot 0.6.1 and openpi both load that.
"""

from __future__ import annotations

import os
import torch

from vlaperf.checkpoints import (
    EMBED,
    LEROBOT_PREFIX,
    LM_HEAD,
    CheckpointError,
    check_finite,
    check_tensors,
    checkpoint_file,
    detect_layout,
    output_file,
    read_tensors,
    to_openpi_names,
    write_safetensors,
)
from vlaperf.models.pi0 import Pi0Config, Pi0Model, get_config

LAYOUTS = ("openpi", "lerobot")
SOURCES = (*LAYOUTS, "openpi-jax")  # what can be read: the layouts, and openpi's JAX checkpoints


def _config(preset: str | Pi0Config) -> Pi0Config:
    if isinstance(preset, Pi0Config):
        return preset
    try:
        return get_config(preset)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def expected_shapes(preset: str | Pi0Config) -> dict[str, torch.Size]:
    """Every state-dict name of the preset's model (openpi names) -> shape, from a meta-device
    model (no memory). The tied embedding appears under both of its names."""
    with torch.device("meta"):
        model = Pi0Model(_config(preset))
    return {k: v.shape for k, v in model.state_dict().items()}


def validate(named: dict[str, torch.Tensor], preset: str | Pi0Config) -> None:
    """Raise CheckpointError listing every missing, unexpected or wrongly shaped tensor
    (openpi names on both sides), then every tensor holding a NaN or inf: a file vlaperf's loader
    would refuse is not written."""
    cfg = _config(preset)
    check_tensors(named, expected_shapes(cfg), cfg)
    check_finite(named)


def _check_layout(tensors: dict[str, torch.Tensor], layout: str) -> None:
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {layout!r}; expected one of {LAYOUTS}")
    if not tensors:
        raise CheckpointError("the checkpoint holds no tensors")
    found = detect_layout(tensors)
    if layout == "openpi" and found == "lerobot":
        n = sum(k.startswith(LEROBOT_PREFIX) for k in tensors)
        raise CheckpointError(f"{n} of its {len(tensors)} keys start with {LEROBOT_PREFIX!r}: this looks like a LeRobot "
                              "checkpoint, not openpi's (convert with --from lerobot)")
    if layout == "lerobot":
        stray = sorted(k for k in tensors if not k.startswith(LEROBOT_PREFIX))
        if stray:
            openpi_like = any(k.startswith("paligemma_with_expert.") for k in tensors)  # not just any file
            hint = (" (no key has it: this looks like an openpi checkpoint, convert with --from openpi)"
                    if found == "openpi" and len(stray) == len(tensors) and openpi_like else "")
            listed = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
            raise CheckpointError(f"LeRobot checkpoint keys lack the {LEROBOT_PREFIX!r} prefix: {listed}{hint}")


def to_model_names(tensors: dict[str, torch.Tensor], layout: str, preset: str | Pi0Config) -> tuple[dict[str, torch.Tensor], dict]:
    """A file's tensors -> openpi names, validated strictly against the preset.

    Returns (named, notes): `named` holds the embedding under both of its names (one tensor);
    notes = {"renamed": [[from, to], ...], "embedding_from": name, "lm_head_differed": bool | None}.
    """
    cfg = _config(preset)
    _check_layout(tensors, layout)
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    # Each key's model name, by vlaperf.checkpoints' own rules (prefix, legacy time-MLP names):
    # the first name to_openpi_names gives a one-tensor dict is that tensor's own.
    targets = {key: next(iter(to_openpi_names({key: t}, layout, cfg.pi05))) for key, t in tensors.items()}
    by_target: dict[str, list[str]] = {}
    for key, target in targets.items():
        by_target.setdefault(target, []).append(key)
    clashes = {t: keys for t, keys in by_target.items() if len(keys) > 1}
    if clashes:
        listed = "; ".join(f"{' and '.join(keys)} -> {t}" for t, keys in sorted(clashes.items()))
        raise CheckpointError(f"several keys of the checkpoint name the same tensor: {listed}")
    renamed = [[key, target] for key, target in targets.items() if key[len(prefix):] != target]
    src_embed, src_head = tensors.get(prefix + EMBED), tensors.get(prefix + LM_HEAD)
    named = to_openpi_names(tensors, layout, cfg.pi05)
    notes = {"renamed": renamed, "embedding_from": None, "lm_head_differed": None}
    if src_embed is not None:
        # The embedding wins over the (unused) LM head, as in LeRobot's loader; see the module doc.
        notes["embedding_from"] = prefix + EMBED
        if src_head is not None:
            notes["lm_head_differed"] = not (src_head.shape == src_embed.shape and torch.equal(src_head, src_embed))
        named[EMBED] = named[LM_HEAD] = src_embed
    elif src_head is not None:
        notes["embedding_from"] = prefix + LM_HEAD
    validate(named, cfg)
    return named, notes


def from_model_names(named: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """openpi names -> the tensors to write in `layout`: the tied embedding once, under the LM
    head's name; LeRobot's keys under `model.`. Tensors are made contiguous, dtypes kept."""
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {layout!r}; expected one of {LAYOUTS}")
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    out = {}
    for key in sorted(named):
        if key == EMBED and LM_HEAD in named:
            continue
        out[prefix + key] = named[key].contiguous()
    return out


def convert_tensors(tensors: dict[str, torch.Tensor], from_layout: str, to_layout: str,
                    preset: str | Pi0Config) -> tuple[dict[str, torch.Tensor], dict]:
    """In-memory conversion; returns (tensors in `to_layout`, report)."""
    if to_layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {to_layout!r}; expected one of {LAYOUTS}")
    named, notes = to_model_names(tensors, from_layout, preset)
    out = from_model_names(named, to_layout)
    report = {"from": from_layout, "to": to_layout, "preset": _config(preset).name, "tensors_in": len(tensors),
              "tensors_out": len(out), "dtypes": sorted({str(t.dtype).replace("torch.", "") for t in out.values()}),
              "numel": sum(t.numel() for k, t in out.items()), **notes}
    return out, report


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, from_layout: str, to_layout: str,
                       preset: str | Pi0Config, overwrite: bool = False) -> dict:
    """Convert `src` (a model.safetensors or a folder holding one) from `from_layout` to
    `to_layout` ("openpi" | "lerobot") and write it to `dst` (a .safetensors path, or a folder
    that gets model.safetensors). Strict about every key, see the module doc. Only the
    safetensors file is written (not LeRobot's config.json or openpi's assets).
    An existing output file is replaced only with `overwrite` (the CLI's --force); the input never is.
    Returns a report: from, to, preset, tensors_in/out, dtypes, numel, renamed,
    embedding_from, lm_head_differed, src, dst.
    """
    if from_layout == "openpi-jax":
        return _convert_jax(src, dst, to_layout, preset, overwrite)
    src_file = checkpoint_file(src)
    dst_file = output_file(dst)
    if dst_file.exists() and dst_file.resolve() == src_file.resolve():
        raise CheckpointError(f"refusing to overwrite the input {src_file}: give another output path")
    refuse_existing(dst_file, overwrite)
    tensors = read_tensors(src_file)
    out, report = convert_tensors(tensors, from_layout, to_layout, preset)
    meta = {"format": "pt", "layout": to_layout, "converted_from": from_layout, "preset": report["preset"]}
    write_safetensors(out, dst_file, meta)  # a failed write leaves no half file under the final name
    report.update({"src": str(src_file), "dst": str(dst_file)})
    return report


def refuse_existing(dst_file, overwrite: bool) -> None:
    """CheckpointError where the output file exists and `overwrite` (--force) was not given."""
    if dst_file.exists() and not overwrite:  # a checkpoint is not something to lose to a repeated command
        raise CheckpointError(f"{dst_file} exists: give another output path, or replace it with --force "
                              "(overwrite=True)")


def _convert_jax(src, dst, to_layout: str, preset: str | Pi0Config, overwrite: bool = False) -> dict:
    """An openpi JAX checkpoint -> `to_layout`'s file: renamed by vlaperf.openpi_jax, the expert's LM head (absent
    in JAX) written as zeros, then the same strict check and writer as the safetensors layouts. dtypes as stored."""
    from vlaperf import openpi_jax

    if to_layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {to_layout!r}; expected one of {LAYOUTS}")
    cfg = _config(preset)
    dst_file = output_file(dst)  # checked before the (long) read
    refuse_existing(dst_file, overwrite)
    arrays = openpi_jax.read_params(src)
    named = openpi_jax.to_openpi_names(arrays)
    filled = openpi_jax.fill_unused_heads(named, expected_shapes(cfg))
    validate(named, cfg)
    out = from_model_names(named, to_layout)
    meta = {"format": "pt", "layout": to_layout, "converted_from": "openpi-jax", "preset": cfg.name}
    write_safetensors(out, dst_file, meta)
    return {"from": "openpi-jax", "to": to_layout, "preset": cfg.name, "tensors_in": len(arrays), "tensors_out": len(out),
            "dtypes": sorted({str(t.dtype).replace("torch.", "") for t in out.values()}),
            "numel": sum(t.numel() for t in out.values()), "renamed": [], "embedding_from": None,
            "lm_head_differed": None, "filled": filled, "src": str(openpi_jax.params_folder(src)), "dst": str(dst_file)}


__all__ = ["LAYOUTS", "SOURCES", "convert_checkpoint", "convert_tensors", "expected_shapes", "validate", "to_model_names",
           "from_model_names"]
