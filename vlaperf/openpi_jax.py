"""openpi's JAX checkpoints: the orbax `params/` folder, read and renamed to openpi's PyTorch names.

openpi releases its checkpoints (pi0_base, pi0_libero, pi05_droid, ...) and writes its trainings'
as JAX parameter trees saved by orbax: `<checkpoint>/params/` (with `assets/<robot>/norm_stats.json`
beside it). This module reads such a folder without JAX, through tensorstore (the library orbax
itself stores arrays with: OCDBT or plain-file stores, zarr v2 or v3 arrays), and renames the tree to
the names of openpi's `PI0Pytorch.state_dict()`, which `Pi0Model` shares; `vlaperf.checkpoints`
then loads it as strictly as a `model.safetensors`.

    pip install "vlaperf[openpi-jax]"      # tensorstore
    load_checkpoint(model, "checkpoints/pi05_libero")          # the folder holding params/, or params/

The renaming follows the shapes of openpi's JAX model (facts read in its source, models/gemma.py,
siglip.py, pi0.py): layers are stacked on a leading axis (`nn.scan`); Gemma's projections are
einsum weights (q [N, D, h], kv [2, K, D, h], attention output [N, h, D], gating [2, D, F], linear
[F, D]); the action expert's carry the suffix `_1`; pi0.5's expert norms are `Dense_0` layers
(adaptive RMSNorm); SigLIP's attention kernels are [D, heads, head dim]; every `Dense` kernel is
[in, out], PyTorch's `Linear.weight` its transpose. Heads, head dims and widths come from the arrays'
own shapes, so the renaming needs no config: the strict check against the model's expected shapes
comes after. A training checkpoint's leaves end in nnx's `value` key; a released one's do not;
both load. Two tensors of openpi's PyTorch state dict have no JAX counterpart and sit on no path at
inference: the PaliGemma LM head (tied to the token embedding: the embedding's value) and the
expert's LM head (zeros; openpi's own converter leaves it at its random initialisation).

LoRA checkpoints (openpi's `gemma_2b_lora` / `gemma_300m_lora` fine-tunes, e.g. pi0_libero_low_mem_finetune) are
merged into the weights as openpi's modules apply them: an attention einsum's `lora_a` @ `lora_b` (over the last two
axes) times alpha / rank, which is 1 for both of openpi's variants and not stored in the checkpoint (`lora_scale`
otherwise); the feed-forward's `*_lora_a` @ `*_lora_b` unscaled, as openpi's FeedForward adds it. One quirk is kept:
openpi derives the adapter's einsums from the weight's ("BTNH,NHD->BTD" for the attention output), and for the
attention output the first one has no head axis left, so the second sums `lora_b` over the heads: the merged delta
is `lora_a` @ (`lora_b` summed over heads), which is what the LoRA model computes.
Not read: pi0-FAST checkpoints (another model).
Checked against openpi's own JAX model in tests/test_openpi_jax.py (fixture made by
benchmarks/openpi_jax_fixture.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from vlaperf.checkpoints import EMBED, EXPERT_LM_HEAD, LM_HEAD, CheckpointError

VISION = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
LLM = "paligemma_with_expert.paligemma.model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."
PROJECTOR = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear."
MARKERS = ("_METADATA", "manifest.ocdbt", "_CHECKPOINT_METADATA")  # files orbax writes in a params folder


def is_params_folder(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / m).exists() for m in MARKERS)


def params_folder(path: str | os.PathLike) -> Path | None:
    """The orbax params folder at `path` (the folder itself or a checkpoint folder holding `params/`), or None."""
    p = Path(path)
    # params/ first: a training checkpoint's step folder (orbax's CheckpointManager) holds _CHECKPOINT_METADATA
    # itself, beside params/ and train_state/, and would be taken for the params folder
    for candidate in (p / "params", p):
        if is_params_folder(candidate):
            return candidate
    return None


def _tensorstore():
    try:
        import tensorstore
    except ImportError:
        raise CheckpointError("reading openpi's JAX (orbax) checkpoints needs tensorstore: "
                              "pip install \"vlaperf[openpi-jax]\" (or pip install tensorstore)") from None
    return tensorstore


ZARR_DRIVERS = {".zarray": "zarr", "zarr.json": "zarr3"}  # an array's metadata key -> tensorstore's driver for it


def _array_names(ts, kvstore: dict) -> dict[str, str]:
    """The arrays a store holds, each with its zarr driver: the prefixes of its metadata keys (`.zarray` for zarr
    v2, `zarr.json` for v3, as orbax's `use_zarr3` chose)."""
    keys = ts.KvStore.open(kvstore).result().list().result()
    names = {}
    for key in keys:
        key = key.decode() if isinstance(key, bytes) else key
        head, _, tail = key.rpartition("/")
        if tail in ZARR_DRIVERS and head:
            names[head] = ZARR_DRIVERS[tail]
    return dict(sorted(names.items()))


def _to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the same bits as torch's
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def read_params(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every array of an orbax params folder (or of a checkpoint folder holding `params/`), keyed by its
    tree path joined with '/', without the root `params` key and nnx's trailing `value`:
    'PaliGemma/llm/layers/attn/q_einsum/w' -> tensor, dtypes as stored."""
    folder = params_folder(path)
    if folder is None:
        raise CheckpointError(f"{path}: not an openpi JAX checkpoint (expected a folder holding params/, or the params "
                              f"folder itself, with orbax's {' / '.join(MARKERS)})")
    ts = _tensorstore()
    root = str(folder.resolve()) + "/"
    ocdbt = (folder / "manifest.ocdbt").exists()  # one database of all arrays (orbax's default), else a folder an array
    kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": root}} if ocdbt else {"driver": "file", "path": root}
    try:
        names = _array_names(ts, kvstore)
    except Exception as e:  # tensorstore raises ValueError with the store's own message
        raise CheckpointError(f"{folder}: cannot list the checkpoint's arrays ({e})") from None
    if not names:
        if not ocdbt and any(folder.glob("ocdbt.process_*")):  # the arrays' database is there, its index is not
            raise CheckpointError(f"{folder}: manifest.ocdbt is missing (orbax's index of the arrays in "
                                  "ocdbt.process_*/): the checkpoint is incomplete; copy it again")
        raise CheckpointError(f"{folder}: the checkpoint holds no arrays")
    # every array opened, then every read issued, then gathered: tensorstore runs them side by side (60 arrays,
    # 1.25 GB, in the page cache of this project's 2-core machine: 0.73 s against 1.23 s one array after another,
    # medians of 5 runs interleaved)
    pending = {}
    for name, driver in names.items():
        where = {**kvstore, "path": name + "/"} if ocdbt else {"driver": "file", "path": root + name + "/"}
        pending[name] = ts.open({"driver": driver, "kvstore": where}, open=True, read=True)
    out = {}
    unreadable = "the checkpoint's data files are incomplete or damaged (copy it again)"
    for name in names:
        try:
            pending[name] = pending[name].result().read()
        except Exception as e:
            raise CheckpointError(f"{folder}: cannot read array {name!r}: {unreadable} ({e})") from None
    for name in names:
        try:
            array = pending.pop(name).result()
        except Exception as e:
            raise CheckpointError(f"{folder}: cannot read array {name!r}: {unreadable} ({e})") from None
        parts = name.split(".")
        if parts[0] == "params":
            parts = parts[1:]
        if parts and parts[-1] == "value":
            parts = parts[:-1]
        out["/".join(parts)] = _to_torch(array)
    return out


class _Taker:
    """Pops the checkpoint's arrays by name from `params` (the caller's own copy: it is emptied); a missing
    one, or one of other dims, is an error naming it."""

    def __init__(self, params: dict[str, torch.Tensor]):
        self.params = params

    def __call__(self, name: str, ndim: int) -> torch.Tensor:
        if name not in self.params:
            raise CheckpointError(f"the JAX checkpoint has no array {name!r}")
        t = self.params.pop(name)
        if t.dim() != ndim:
            raise CheckpointError(f"JAX array {name!r}: {t.dim()} dims {list(t.shape)}, expected {ndim}")
        return t

    def has(self, name: str) -> bool:
        return name in self.params


def _linear(take: _Taker, out: dict, jax_name: str, torch_name: str) -> None:
    out[torch_name + "weight"] = take(jax_name + "/kernel", 2).T  # flax's kernel is [in, out]
    out[torch_name + "bias"] = take(jax_name + "/bias", 1)


def _siglip(take: _Taker, out: dict) -> None:
    img = "PaliGemma/img/"
    kernel = take(img + "embedding/kernel", 4)  # [p, p, 3, W] -> conv weight [W, 3, p, p]
    out[VISION + "embeddings.patch_embedding.weight"] = kernel.permute(3, 2, 0, 1)
    out[VISION + "embeddings.patch_embedding.bias"] = take(img + "embedding/bias", 1)
    pos = take(img + "pos_embedding", 3)  # [1, P, W]
    out[VISION + "embeddings.position_embedding.weight"] = pos.reshape(-1, pos.shape[-1])
    block = img + "Transformer/encoderblock/"
    if not take.has(block + "LayerNorm_0/scale"):
        raise CheckpointError("the JAX checkpoint's SigLIP is not stacked over layers (expected "
                              f"{block}LayerNorm_0/scale, as openpi's scanned SigLIP saves it)")
    same, transposed = (lambda a: a), (lambda a: a.T)
    attn = "MultiHeadDotProductAttention_0/"
    stacked = [  # (our name in layer i, the JAX array under encoderblock/, its dims with the layer axis, a -> ours)
        ("layer_norm1.weight", "LayerNorm_0/scale", 2, same), ("layer_norm1.bias", "LayerNorm_0/bias", 2, same),
        ("layer_norm2.weight", "LayerNorm_1/scale", 2, same), ("layer_norm2.bias", "LayerNorm_1/bias", 2, same),
        ("mlp.fc1.weight", "MlpBlock_0/Dense_0/kernel", 3, transposed), ("mlp.fc1.bias", "MlpBlock_0/Dense_0/bias", 2, same),
        ("mlp.fc2.weight", "MlpBlock_0/Dense_1/kernel", 3, transposed), ("mlp.fc2.bias", "MlpBlock_0/Dense_1/bias", 2, same),
        # out kernel [heads, head dim, D] -> [D, heads x head dim]
        ("self_attn.out_proj.weight", attn + "out/kernel", 4, lambda a: a.reshape(-1, a.shape[-1]).T),
        ("self_attn.out_proj.bias", attn + "out/bias", 2, same),
    ]
    for ours, theirs in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        # kernel [D, heads, head dim] -> [heads x head dim, D]; bias [heads, head dim] -> flat
        stacked.append((f"self_attn.{ours}.weight", f"{attn}{theirs}/kernel", 4, lambda a: a.reshape(a.shape[0], -1).T))
        stacked.append((f"self_attn.{ours}.bias", f"{attn}{theirs}/bias", 3, lambda a: a.reshape(-1)))
    for ours, theirs, ndim, fn in stacked:
        a = take(block + theirs, ndim)
        for i in range(a.shape[0]):
            out[f"{VISION}encoder.layers.{i}.{ours}"] = fn(a[i])
    out[VISION + "post_layernorm.weight"] = take(img + "Transformer/encoder_norm/scale", 1)
    out[VISION + "post_layernorm.bias"] = take(img + "Transformer/encoder_norm/bias", 1)
    _linear(take, out, img + "head", PROJECTOR)


def _gemma(take: _Taker, out: dict, prefix: str, suffix: str) -> None:
    """One Gemma of the pair: the backbone (suffix '') or the action expert ('_1')."""
    layers = "PaliGemma/llm/layers/"
    q = take(f"{layers}attn/q_einsum{suffix}/w", 4)  # [L, N, D, h]
    kv = take(f"{layers}attn/kv_einsum{suffix}/w", 5)  # [L, 2, K, D, h]
    o = take(f"{layers}attn/attn_vec_einsum{suffix}/w", 4)  # [L, N, h, D]
    gating = take(f"{layers}mlp{suffix}/gating_einsum", 4)  # [L, 2, D, F]
    linear = take(f"{layers}mlp{suffix}/linear", 3)  # [L, F, D]
    adaptive = take.has(f"{layers}pre_attention_norm{suffix}/Dense_0/kernel")  # pi0.5's expert
    norms = {}
    for ours, theirs in (("input_layernorm", "pre_attention_norm"), ("post_attention_layernorm", "pre_ffw_norm")):
        if adaptive:
            norms[ours + ".dense.weight"] = take(f"{layers}{theirs}{suffix}/Dense_0/kernel", 3).transpose(1, 2)
            norms[ours + ".dense.bias"] = take(f"{layers}{theirs}{suffix}/Dense_0/bias", 2)
        else:
            norms[ours + ".weight"] = take(f"{layers}{theirs}{suffix}/scale", 2)
    depth = q.shape[0]
    for name, a in (("kv_einsum", kv), ("attn_vec_einsum", o), ("gating_einsum", gating), ("linear", linear),
                    *norms.items()):
        if a.shape[0] != depth:
            raise CheckpointError(f"JAX array {name}{suffix}: {a.shape[0]} layers, q_einsum{suffix} has {depth}")
    for i in range(depth):
        at = f"{prefix}layers.{i}."
        qi = q[i]  # [N, D, h] -> [N x h, D]
        out[at + "self_attn.q_proj.weight"] = qi.permute(0, 2, 1).reshape(-1, qi.shape[1])
        for j, name in enumerate(("k_proj", "v_proj")):
            kvi = kv[i, j]  # [K, D, h] -> [K x h, D]
            out[at + f"self_attn.{name}.weight"] = kvi.permute(0, 2, 1).reshape(-1, kvi.shape[1])
        out[at + "self_attn.o_proj.weight"] = o[i].reshape(-1, o.shape[-1]).T  # [N x h, D] -> [D, N x h]
        out[at + "mlp.gate_proj.weight"] = gating[i, 0].T
        out[at + "mlp.up_proj.weight"] = gating[i, 1].T
        out[at + "mlp.down_proj.weight"] = linear[i].T
        for name, a in norms.items():
            out[at + name] = a[i]
    final = f"PaliGemma/llm/final_norm{suffix}"
    if take.has(final + "/Dense_0/kernel"):
        _linear(take, out, final + "/Dense_0", prefix + "norm.dense.")
    else:
        out[prefix + "norm.weight"] = take(final + "/scale", 1)


def merge_lora(params: dict[str, torch.Tensor], lora_scale: float = 1.0) -> list[str]:
    """Fold LoRA adapters into their weights, in place in `params` (the adapters are removed). Returns the
    weights changed. Attention einsums (`.../q_einsum/lora_a`, `lora_b` beside `.../q_einsum/w`): w += lora_scale
    a @ b (the attention output's with b summed over its heads, as openpi's einsum computes); the feed-forward's (`.../mlp/gating_einsum_lora_a` beside `.../mlp/gating_einsum`, `linear_lora_*`):
    w += a @ b, without a scale. Computed in float32, stored in the weight's dtype."""
    merged = []
    for key in sorted(k for k in params if k.endswith("lora_a")):
        b_key = key[:-1] + "b"
        if key.endswith("/lora_a"):
            base, scale = key[: -len("lora_a")] + "w", lora_scale
        else:
            base, scale = key[: -len("_lora_a")], 1.0
        if base not in params or b_key not in params:
            raise CheckpointError(f"LoRA adapter {key!r} without {b_key!r} and {base!r} beside it")
        a, b, w = params.pop(key), params.pop(b_key), params[base]
        if a.dim() < 2 or b.dim() != a.dim() or a.shape[-1] != b.shape[-2]:
            raise CheckpointError(f"LoRA adapter {key!r} {list(a.shape)} and {b_key!r} {list(b.shape)} do not multiply")
        b = b.float()
        if "attn_vec_einsum" in key:  # x a reduces the heads away, so every head meets the heads' sum of b (see above)
            b = b.sum(dim=-3, keepdim=True)
        delta = torch.matmul(a.float(), b)
        if delta.shape != w.shape:
            raise CheckpointError(f"LoRA adapter {key!r} @ {b_key!r} is {list(delta.shape)}, the weight {base!r} "
                                  f"{list(w.shape)}")
        params[base] = (w.float() + scale * delta).to(w.dtype)
        merged.append(base)
    return merged


def to_openpi_names(params: dict[str, torch.Tensor], lora_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """read_params' tree -> openpi's PyTorch names (views of the same tensors where a transpose is all
    it takes), LoRA adapters merged first (merge_lora). Every array must be used: one left over is an
    error naming it."""
    params = dict(params)  # merge_lora and _Taker change this copy, not the caller's dict
    merge_lora(params, lora_scale)
    take = _Taker(params)
    out: dict[str, torch.Tensor] = {}
    if not take.has("PaliGemma/llm/layers/attn/q_einsum_1/w"):
        hint = " (no action expert: a pi0-FAST checkpoint is another model)" if take.has(
            "PaliGemma/llm/layers/attn/q_einsum/w") else ""
        raise CheckpointError(f"the JAX checkpoint has no array 'PaliGemma/llm/layers/attn/q_einsum_1/w'{hint}")
    _siglip(take, out)
    out[EMBED] = take("PaliGemma/llm/embedder/input_embedding", 2)
    out[LM_HEAD] = out[EMBED]
    _gemma(take, out, LLM, "")
    _gemma(take, out, EXPERT, "_1")
    pi05 = take.has("time_mlp_in/kernel")
    heads = ("action_in_proj", "action_out_proj") + (("time_mlp_in", "time_mlp_out") if pi05 else
                                                      ("state_proj", "action_time_mlp_in", "action_time_mlp_out"))
    for name in heads:
        _linear(take, out, name, name + ".")
    if take.params:
        left = sorted(take.params)
        hint = " (LoRA adapters of an unknown form)" if any("lora" in k.lower() for k in left) else ""
        listed = ", ".join(f"{k} {list(take.params[k].shape)}" for k in left[:8]) + (
            f" and {len(left) - 8} more" if len(left) > 8 else "")
        raise CheckpointError(f"the JAX checkpoint holds arrays openpi's pi0 / pi0.5 does not have{hint}: {listed}")
    return out


def fill_unused_heads(named: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> list[str]:
    """The expert's LM head, which openpi's JAX model lacks and inference never reads, as zeros where the
    model has one. Returns the names filled."""
    filled = []
    if EXPERT_LM_HEAD in expected and EXPERT_LM_HEAD not in named:
        ref = named.get(EMBED)
        named[EXPERT_LM_HEAD] = torch.zeros(expected[EXPERT_LM_HEAD], dtype=ref.dtype if ref is not None else None)
        filled.append(EXPERT_LM_HEAD)
    return filled


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """read_params + to_openpi_names: an openpi JAX checkpoint under openpi's PyTorch names."""
    return to_openpi_names(read_params(path))


__all__ = ["is_params_folder", "params_folder", "read_params", "merge_lora", "to_openpi_names", "read_checkpoint",
           "fill_unused_heads", "EXPERT_LM_HEAD"]
