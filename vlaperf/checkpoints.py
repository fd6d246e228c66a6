"""Checkpoints in openpi's and LeRobot's layouts: strict load, save.

openpi (`model.safetensors` from its JAX->PyTorch converter) uses the parameter names of
`PI0Pytorch.state_dict()`, which `Pi0Model` shares one to one. Two quirks of the file:
  - the token embedding is tied to the PaliGemma LM head; safetensors keeps one name of a
    shared tensor, so openpi's file stores it as `...paligemma.lm_head.weight` and has no
    `...language_model.embed_tokens.weight` (either name is accepted here);
  - the expert's LM head is stored although inference never uses it.
LeRobot's `pi0` / `pi05` policies hold the same model under `model.`, so their keys are
openpi's with that prefix. Older LeRobot files may name pi0's time MLP `time_mlp_*`
(pi0.5's name) or the other way round; those names are mapped, and every other mismatch
is an error that names the key and both shapes. openpi's JAX checkpoints (an orbax
`params/` folder) are read and renamed by `vlaperf.openpi_jax` (layout "openpi-jax",
detected from the folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vlaperf.models.pi0 import Pi0Model

LM_HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
EMBED = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
EXPERT_LM_HEAD = "paligemma_with_expert.gemma_expert.lm_head.weight"
UNUSED_HEADS = (LM_HEAD, EXPERT_LM_HEAD)  # in openpi's state dict, never read by inference (Pi0Config.unused_heads)
LEROBOT_PREFIX = "model."
LAYOUTS = ("auto", "openpi", "lerobot", "openpi-jax")


class CheckpointError(ValueError):
    """A checkpoint that does not match the model; the message names every offending key."""


def checkpoint_file(path: str | os.PathLike) -> Path:
    if not str(os.fspath(path)).strip():  # Path("") is the current folder: its model.safetensors, whatever that is
        raise CheckpointError("checkpoint path: empty (an unset variable?); expected a model.safetensors file or a "
                              "folder holding one")
    p = Path(path)
    folder = p if p.is_dir() else None
    if folder is not None:
        p = p / "model.safetensors"
    if not p.is_file():
        hint = ""
        if folder is not None and ((folder / "params").is_dir() or folder.name == "params"):
            from vlaperf.openpi_jax import MARKERS, params_folder

            if params_folder(folder) is not None:  # a complete one, read as a safetensors layout: the layout is wrong
                hint = ("; it is an openpi JAX checkpoint: convert it with --from openpi-jax (load it with layout "
                        "'openpi-jax' or 'auto')")
            else:
                hint = (f"; it looks like an openpi JAX checkpoint, but without orbax's {' / '.join(MARKERS)} in its "
                        "params folder: an incomplete copy?")
        if not hint:
            from vlaperf.hub import BARE_REPO

            text = str(os.fspath(path))
            if text.endswith("/") and BARE_REPO.fullmatch(text.rstrip("/")):  # a shell's completion adds the "/"
                hint = (f"; a Hugging Face Hub repo is named {text.rstrip('/')!r}, without the trailing '/' (or "
                        f"hf://{text.rstrip('/')})")
        raise CheckpointError(f"checkpoint not found: {p} (expected a model.safetensors file or a folder holding one"
                              f"{hint})")
    return p


def lerobot_config(path: str | os.PathLike) -> dict | None:
    """LeRobot's `config.json` beside a checkpoint's model.safetensors, where it is a pi0 or pi0.5 policy's: {"type":
    "pi0" | "pi05", "chunk_size": actions a chunk, "path"}. None where there is none (openpi's files, a bare file,
    another program's config.json). The chunk a checkpoint was trained with is not in its weights; LeRobot's
    config says it. CheckpointError where the file is LeRobot's and its chunk_size is not a positive integer."""
    p = Path(path)
    doc_path = (p if p.is_dir() else p.parent) / "config.json"
    try:
        doc = json.loads(doc_path.read_text())
    except (OSError, ValueError):  # none, or not JSON: not LeRobot's
        return None
    if not isinstance(doc, dict) or doc.get("type") not in ("pi0", "pi05"):
        return None
    chunk = doc.get("chunk_size")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise CheckpointError(f"{doc_path}: LeRobot's {doc['type']} config with chunk_size {chunk!r}; expected a "
                              "positive integer")
    return {"type": doc["type"], "chunk_size": chunk, "path": str(doc_path)}


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    p = checkpoint_file(path)
    try:
        with safe_open(str(p), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise _unreadable(p, e) from None


def _unreadable(p: Path, e: Exception) -> CheckpointError:
    """safe_open's failure, naming the file. safetensors raises an OSError without a filename (which the CLI takes
    for a bug: a traceback) where it cannot open the file, as "No such file or directory" whatever the reason (a
    permission denied included): the OS's own reason is taken from Python's open where it gives one."""
    if isinstance(e, SafetensorError):
        return CheckpointError(f"{p}: not a readable safetensors file ({e})")
    try:
        with open(p, "rb"):
            pass
    except OSError as os_error:
        e = os_error.strerror or os_error
    return CheckpointError(f"{p}: cannot read it ({e})")


def check_readable(path: str | os.PathLike) -> None:
    """Raise CheckpointError now if `path` is neither an openpi JAX checkpoint folder nor a safetensors file whose
    header reads: only the header is read, so a server can refuse a bad path before it builds a model or warns
    about how the checkpoint will be served."""
    from vlaperf import openpi_jax

    if openpi_jax.params_folder(path) is not None:
        return
    p = checkpoint_file(path)
    try:
        with safe_open(str(p), framework="pt") as f:
            f.keys()
    except (OSError, SafetensorError) as e:
        raise _unreadable(p, e) from None


def detect_layout(keys) -> str:
    """LeRobot's when most keys carry its `model.` prefix (a few stray keys, such as older files'
    normalization buffers, are then named as what they are, not as 180 missing tensors)."""
    keys = list(keys)
    if keys and 2 * sum(k.startswith(LEROBOT_PREFIX) for k in keys) > len(keys):
        return "lerobot"
    return "openpi"


def to_openpi_names(tensors: dict[str, torch.Tensor], layout: str, pi05: bool) -> dict[str, torch.Tensor]:
    """Rename a file's tensors to openpi's names (the model's own)."""
    if layout == "openpi-jax":
        raise CheckpointError("an openpi JAX checkpoint is renamed by vlaperf.openpi_jax.to_openpi_names, not here")
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {layout!r}; expected one of {LAYOUTS}")
    if layout == "auto":
        layout = detect_layout(tensors)
    out, source = {}, {}
    for key, t in tensors.items():
        original = key
        if layout == "lerobot":
            if not key.startswith(LEROBOT_PREFIX):
                raise CheckpointError(f"LeRobot checkpoint key {key!r} lacks the {LEROBOT_PREFIX!r} prefix")
            key = key[len(LEROBOT_PREFIX):]
            # LeRobot renames the time MLP between pi0 and pi0.5 on load; accept either name.
            if pi05 and key.startswith("action_time_mlp_"):
                key = key[len("action_"):]
            elif not pi05 and key.startswith("time_mlp_"):
                key = "action_" + key
        if key in out:  # the legacy and the current time-MLP names both present: which one is meant is unknowable
            raise CheckpointError(f"several keys of the checkpoint name the same tensor {key}: {source[key]!r} and "
                                  f"{original!r}")
        out[key], source[key] = t, original
    # Tied embedding: openpi's file keeps the LM head's name only. LeRobot (transformers 5.5)
    # unties the two and saves both; on load it copies the LM head into the embedding and
    # then the file's own embedding overwrites it, so with both present the embedding wins.
    if EMBED in out:
        out[LM_HEAD] = out[EMBED]
    elif LM_HEAD in out:
        out[EMBED] = out[LM_HEAD]
    return out


def load_checkpoint(model: Pi0Model, path: str | os.PathLike, layout: str = "auto") -> dict:
    """Load a checkpoint strictly into `model` (in place), keeping the model's dtypes.

    `path`: a model.safetensors (openpi's or LeRobot's layout) or a folder holding one, or an openpi JAX
    checkpoint folder (orbax's params/, or the folder holding it: vlaperf.openpi_jax).
    Raises CheckpointError listing every missing, unexpected or wrongly shaped tensor.
    Returns a small report: layout, tensor count, dtypes found in the file (and, for JAX, the tensors filled).
    Warns where LeRobot's config.json beside the weights says the checkpoint was trained with another action
    chunk than the model's `action_horizon` (the horizon is in no tensor, so the strict load cannot see it).
    """
    named, report = read_model_tensors(path, {k: v.shape for k, v in model.state_dict().items()},
                                       model.config.pi05, layout)
    load_read_tensors(model, named, report)
    trained = lerobot_config(path)
    if trained is not None and trained["chunk_size"] != model.config.action_horizon:
        warnings.warn(f"{trained['path']}: the checkpoint was trained with {trained['chunk_size']} actions a chunk "
                      f"(chunk_size); this model has action_horizon {model.config.action_horizon}, and the action "
                      "tokens attend to one another, so its chunks are not the ones the checkpoint learned: build the "
                      f"model with get_config(preset, action_horizon={trained['chunk_size']})", stacklevel=2)
    return report


def load_read_tensors(model: Pi0Model, named: dict[str, torch.Tensor], report: dict) -> None:
    """`read_model_tensors`' output into `model` strictly (load_state), and where it came from on the model, which
    result files record."""
    from vlaperf.hub import origin

    load_state(model, named)
    model.checkpoint = {"path": report["path"], "layout": report["layout"]}
    hub = origin(report["path"])
    if hub is not None:  # fetched from the Hugging Face Hub (or read from its cache): the repo and its commit
        model.checkpoint["hub"] = hub


def read_model_tensors(path: str | os.PathLike, shapes: dict[str, torch.Size], pi05: bool,
                       layout: str = "auto") -> tuple[dict[str, torch.Tensor], dict]:
    """A checkpoint's tensors under openpi's names (the model's own), as the file stores them (its dtypes), and
    load_checkpoint's report. `shapes`: the model's state-dict shapes (an openpi JAX checkpoint lacks the unused
    expert LM head, which is filled with zeros of that shape). Each runtime then casts the same tensors to its own
    dtypes (load_state; vlaperf.compare.lerobot.load_into_lerobot_)."""
    from vlaperf import openpi_jax

    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint layout {layout!r}; expected one of {LAYOUTS}")
    jax_folder = openpi_jax.params_folder(path) if layout in ("auto", "openpi-jax") else None
    if layout == "openpi-jax" or (layout == "auto" and jax_folder is not None):
        tensors = openpi_jax.read_params(path)  # (raises where the folder is not one)
        named = openpi_jax.to_openpi_names(tensors)
        filled = openpi_jax.fill_unused_heads(named, shapes)
        root = jax_folder.parent if jax_folder.name == "params" else jax_folder  # named by its checkpoint: pi05_libero
        report = {"path": str(root), "layout": "openpi-jax", "tensors": len(tensors),
                  "file_dtypes": sorted({str(t.dtype) for t in tensors.values()}), "filled": filled,
                  "lora_merged": sum(k.endswith("lora_a") for k in tensors)}
        return named, report
    tensors = read_tensors(path)
    layout_found = detect_layout(tensors) if layout == "auto" else layout
    named = to_openpi_names(tensors, layout_found, pi05)
    report = {"path": str(checkpoint_file(path)), "layout": layout_found, "tensors": len(tensors),
              "file_dtypes": sorted({str(t.dtype) for t in tensors.values()})}
    return named, report


def check_tensors(named: dict[str, torch.Tensor], expected: dict[str, torch.Size], cfg) -> None:
    """The strict check: raise CheckpointError listing every missing, unexpected or wrongly
    shaped tensor (openpi names on both sides), with a hint when the file is the other
    member of the family (pi0 vs pi0.5), or of another size."""
    common = set(named) & set(expected)
    lerobot_names = 2 * sum(k.startswith(LEROBOT_PREFIX) for k in named) > len(named)  # read as openpi's: said below
    if named and not common and not lerobot_names:  # another model's file: its 20 "missing" tensors said nothing
        listed = ", ".join(sorted(named)[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
        raise CheckpointError(f"none of the checkpoint's {len(named)} tensors is a parameter of preset {cfg.name!r}: "
                              f"not a pi0-family checkpoint in openpi's or LeRobot's names (its keys: {listed})")
    problems = []
    for key in sorted(common):  # the ones that explain most first: shapes and dtypes
        if named[key].shape != expected[key]:
            problems.append(f"wrong shape for {key}: checkpoint has {list(named[key].shape)}, model expects {list(expected[key])}")
        elif not named[key].is_floating_point():
            problems.append(f"wrong dtype for {key}: checkpoint has {str(named[key].dtype).removeprefix('torch.')}, "
                            "model expects floating point")
    for key in sorted(set(expected) - set(named)):
        problems.append(f"missing tensor {key} (model expects shape {list(expected[key])})")
    for key in sorted(set(named) - set(expected)):
        problems.append(f"unexpected tensor {key} with shape {list(named[key].shape)} (not a parameter of preset {cfg.name!r})")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        # The expert's final norm tells the family apart: pi0.5's is adaptive (a dense layer), pi0's a weight. The time
        # MLP's name does not: a LeRobot pi0.5 file's time_mlp_* was renamed to pi0's action_time_mlp_* above.
        adaptive = "paligemma_with_expert.gemma_expert.model.norm.dense.weight" in named
        plain = "paligemma_with_expert.gemma_expert.model.norm.weight" in named
        if cfg.pi05:
            looks_other = "state_proj.weight" in named or plain
        else:
            looks_other = "time_mlp_in.weight" in named or adaptive
        kind, other = ("pi0.5", "pi0") if cfg.pi05 else ("pi0", "pi0.5")
        hint = f" (the file looks like {other}, the preset is {kind})" if looks_other else ""
        if lerobot_names:
            hint += " (its keys carry LeRobot's 'model.' prefix: load it with layout 'lerobot' or 'auto')"
        shapes = sum(p.startswith("wrong shape") for p in problems)
        size = ""
        if not looks_other and not lerobot_names and (shapes or len(common) < len(expected)):  # another size, or cut
            size = (f"\n(the file holds {len(common)} of the preset's {len(expected)} tensors"
                    + (f", {shapes} of them of another shape" if shapes else "")
                    + ": a checkpoint of another preset, or not all of one?)")
        counts = ", ".join(f"{sum(p.startswith(k) for p in problems)} {k}" for k in ("wrong shape", "wrong dtype", "missing",
                                                                                   "unexpected")
                           if any(p.startswith(k) for p in problems))
        raise CheckpointError(f"checkpoint does not match model preset {cfg.name!r}{hint} ({counts}):\n  "
                              + "\n  ".join(shown) + size)


def check_finite(named: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype] | None = None) -> None:
    """Raise CheckpointError naming every tensor with a NaN or inf, in its stored dtype or, where `dtypes`
    names one, once cast to it (a float32 value past bfloat16's range becomes inf). One tensor's cast at a
    time: no second copy of the model in memory."""
    bad = []
    for key in sorted(named):
        tensor = named[key]
        if not tensor.is_floating_point():
            continue
        dtype = (dtypes or {}).get(key, tensor.dtype)
        if not torch.isfinite(tensor.to(dtype)).all():
            where = "" if not torch.isfinite(tensor).all() else f" once cast to the model's {dtype}"
            bad.append(f"{key}: NaN or inf{where}")
    if bad:
        shown = bad[:20] + ([f"... and {len(bad) - 20} more"] if len(bad) > 20 else [])
        raise CheckpointError("checkpoint holds non-finite weights:\n  " + "\n  ".join(shown))


def load_state(model: Pi0Model, named: dict[str, torch.Tensor]) -> None:
    """Check every tensor (names, shapes, dtypes; finite in the model's dtypes), then copy them in: a
    refused file leaves the model as it was. Bumps `model.weights_version`, which engines built before
    the load check before they run."""
    if model.reference_released:
        raise CheckpointError("this model's reference weights were released (Engine.release_reference_weights): "
                              "build the model again to load a checkpoint into it")
    expected = model.state_dict()
    if not model.config.unused_heads:  # a model built without the two heads: the file's (or the tied alias) dropped
        named = {k: v for k, v in named.items() if k not in UNUSED_HEADS}
    check_tensors(named, {k: v.shape for k, v in expected.items()}, model.config)
    check_finite(named, {k: v.dtype for k, v in expected.items()})
    with torch.no_grad():
        for key, param in expected.items():
            param.copy_(named[key])  # copies into the model's own dtype and device
    model.weights_version += 1


def save_checkpoint(model: Pi0Model, path: str | os.PathLike, layout: str = "openpi") -> Path:
    """Write `model.safetensors` in openpi's layout (or LeRobot's, with the `model.` prefix).
    Tensors are saved in the model's dtypes; the tied embedding under the LM head's name."""
    if layout not in ("openpi", "lerobot"):
        raise CheckpointError(f"can only save in 'openpi' or 'lerobot' layout, got {layout!r}")
    if model.reference_released:
        raise CheckpointError("this model's reference weights were released (Engine.release_reference_weights); "
                              "save a checkpoint before releasing them")
    p = output_file(path)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if LM_HEAD in state:  # stored once, under the LM head's name as openpi's file does: the embedding's values, which
        # inference reads (the two differ only in a model whose tie was undone, e.g. load_state_dict(assign=True))
        state[LM_HEAD] = state.pop(EMBED, state[LM_HEAD])
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    write_safetensors({prefix + k: v for k, v in state.items()}, p, {"format": "pt", "layout": layout})
    return p


def output_file(path: str | os.PathLike) -> Path:
    """Where a checkpoint goes: a `.safetensors` path as it is, any other path a folder that gets
    `model.safetensors`. Nothing is created here (a refused run leaves nothing behind)."""
    if not str(path).strip():
        raise CheckpointError("output path: empty; expected a .safetensors file or a folder")
    p = Path(path)
    if p.suffix == ".safetensors":
        if p.is_dir():
            raise CheckpointError(f"output {p}: a folder; expected a .safetensors file path (or a folder without the suffix)")
        return p
    if p.exists() and not p.is_dir():
        raise CheckpointError(f"output {p}: an existing file; expected a .safetensors path or a folder")
    return p / "model.safetensors"


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError):
        return 0o022


def write_safetensors(tensors: dict[str, torch.Tensor], dst: Path, metadata: dict[str, str]) -> None:
    """Write through a `.partial` file renamed into place, so a failed write leaves no file (and no folder
    it created); the file gets the usual umask's mode, not the 0600 of safetensors' temporary file."""
    created = [d for d in (dst.parent, *dst.parent.parents) if not d.exists()]
    tmp = dst.with_name(dst.name + ".partial")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dst)
    except BaseException as e:  # a Ctrl-C or a MemoryError mid-write too: gigabytes of .partial left behind otherwise
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        for d in created:  # innermost first
            try:
                d.rmdir()
            except OSError:
                break
        if isinstance(e, (OSError, SafetensorError)):
            raise CheckpointError(f"cannot write {dst}: {getattr(e, 'strerror', None) or e}") from None
        raise
