"""The prefix: which image slots and prompt tokens to compute, their embedding, the prefill.

`skip_masked_images` and `trim_prompt_padding` decide on the host, from the observation's
host-side metadata, which tokens exist; positions and masks of the kept tokens are exactly
those of the full prefix (dropped tokens were padding: they add nothing to the position
cumsum and no valid token attends to them).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.engine.attention import prefix_mask
from vlaperf.engine.fusion import EngineWeights
from vlaperf.engine.layers import gemma_layer_parts, qkv_projection, rms_normalize, siglip_layer_parts
from vlaperf.models.pi0 import Pi0Model, apply_rope, rope_cos_sin

# Static prompt lengths: changing the instruction must not re-capture a graph or recompile
# per length, so kept prompts are padded up to the next bucket (capped at the slot count).
PROMPT_BUCKETS = (8, 16, 32, 64, 128, 256)


def prompt_bucket(valid_len: int, slots: int) -> int:
    for b in PROMPT_BUCKETS:
        if b >= valid_len:
            return min(b, slots)
    return slots


@dataclass(frozen=True)
class PrefixPlan:
    slots: tuple[int, ...]  # image slots that are embedded
    prompt_len: int  # prompt tokens kept (from the left)
    read_device_masks: bool = False  # True if the plan needed a device-to-host read


def plan_prefix(obs, skip_masked_images: bool, trim_prompt_padding: bool) -> PrefixPlan:
    """Decide the prefix layout on the host. Uses the observation's host metadata; without
    it, reads the device masks once (a sync, reported in the plan) rather than guess."""
    S, L = obs.images.shape[1], obs.tokens.shape[1]
    read = False
    slots = tuple(range(S))
    if skip_masked_images:
        valid = obs.host_image_valid
        if valid is None:
            valid, read = tuple(obs.image_mask.any(0).tolist()), True
        slots = tuple(s for s in range(S) if valid[s])
    prompt_len = L
    if trim_prompt_padding:
        n = obs.host_prompt_len
        if n is None:
            n, read = _right_padded_prompt_len(obs.token_mask), True
        prompt_len = prompt_bucket(n, L)
    if not slots and prompt_len == 0 and S:
        # every image masked and no prompt slots (a model built with max_token_len 0): an empty prefix has no shape
        # the layers can reshape to, so one masked image stays; its keys are padding, as in the reference
        slots = (0,)
    return PrefixPlan(slots, prompt_len, read)


def _right_padded_prompt_len(token_mask: Tensor) -> int:
    """The longest prompt of the batch, read from the device mask (one sync), which must pad on the right as
    openpi's tokenizer does: trimming keeps the first tokens, so a left-padded prompt would lose its own."""
    mask = token_mask.bool().cpu().numpy()  # the one read; the rest is host arithmetic
    counts = mask.sum(1)
    wrong = (mask != (np.arange(mask.shape[1]) < counts[:, None])).any(1)
    if wrong.any():
        raise ValueError(f"obs.token_mask: sample {int(wrong.argmax())} has padding before a valid token; "
                         "trim_prompt_padding keeps the first tokens, so the prompt must be padded on the right (as "
                         "openpi's tokenizer pads)")
    return int(counts.max())


# ------------------------------------------------------------------ the repeated layers as blocks
# Each block is one layer less its last residual add, which the next block does first: when
# `compile_layers` compiles each block once and reuses it for every layer, that add and the next
# layer's norm stay one fused kernel, as they are when the whole prefix is one graph. The per-
# layer arguments are tensors only (the layer's weights and its slice of the static cache), so
# one compiled block serves every layer. The first layer gets zeros pending (one small fill and
# an add inside its norm's kernel, ~2 us), not None, which would be a second graph to compile.


def siglip_block(lw, x: Tensor, pending: Tensor, eps: float, use_sdpa: bool) -> tuple[Tensor, Tensor]:
    """x + pending, then a SigLIP layer up to its last residual add: (x, branch)."""
    return siglip_layer_parts(lw, x + pending, eps, use_sdpa)


def gemma_block(lw, x: Tensor, pending: Tensor, eps: float, cos: Tensor, sin: Tensor, mask: Tensor, use_sdpa: bool,
                attend, kv_layer: tuple[Tensor, Tensor] | None, rope_kernel: bool):
    """x + pending, then a Gemma prefix layer up to its last residual add: (x, branch, (k, v)).
    kv_layer: this layer's static cache, (1, B, K, T, h) each, or None (the keys are returned);
    rope_kernel: RoPE and the cache write as one kernel (kernels/rope_qkv.py), else copies."""
    x = x + pending
    rope = None
    if rope_kernel:
        from vlaperf.engine.kernels.ops import rope_qkv  # custom op: compile sees through

        rope = lambda qkv: rope_qkv(qkv, cos, sin, kv_layer[0], kv_layer[1], 0, 0, lw.num_heads, lw.num_kv_heads, True)  # noqa: E731
    x, branch, gate, kv = gemma_layer_parts(lw, x, eps, cos, sin, mask, use_sdpa, attend=attend, rope_qkv=rope)
    assert gate is None, "the prefix's layers have no adaptive norms (only the expert's do)"
    if kv_layer is not None and not rope_kernel:
        Tp = x.shape[1]
        kv_layer[0][0, :, :, :Tp].copy_(kv[0])
        kv_layer[1][0, :, :, :Tp].copy_(kv[1])
    return x, branch, kv


def gemma_last_kv_block(lw, x: Tensor, pending: Tensor, eps: float, cos: Tensor, sin: Tensor,
                        kv_layer: tuple[Tensor, Tensor], rope_kernel: bool) -> None:
    """The last prefix layer with a static cache: only its keys and values feed the actions."""
    x = x + pending
    h = rms_normalize(x, eps, lw.in_scale)
    if rope_kernel:
        from vlaperf.engine.kernels.ops import rope_qkv

        rope_qkv(F.linear(h, lw.qkv), cos, sin, kv_layer[0], kv_layer[1], 0, 0, lw.num_heads, lw.num_kv_heads, False)
        return
    _, k, v = qkv_projection(lw, h)
    Tp = x.shape[1]
    kv_layer[0][0, :, :, :Tp].copy_(apply_rope(k, cos, sin))
    kv_layer[1][0, :, :, :Tp].copy_(v)


@dataclass(frozen=True)
class PrefixBlocks:
    """How the prefix runs its repeated layers: these functions as they are, or each compiled once
    and reused for every layer (`compile_layers`, engine.py)."""
    siglip: Callable = siglip_block
    gemma: Callable = gemma_block
    gemma_last_kv: Callable = gemma_last_kv_block


PLAIN_BLOCKS = PrefixBlocks()


def embed_images(model: Pi0Model, ew: EngineWeights, images: Tensor, use_sdpa: bool,
                 blocks: PrefixBlocks = PLAIN_BLOCKS) -> Tensor:
    """(B, S', 3, R, R) -> (B, S' * P, D). All kept images go through SigLIP as one batch
    (fatter matmuls than one call per camera)."""
    B, S = images.shape[:2]
    vision = model.vision
    if ew.patch is None:
        x = vision.embeddings(images.flatten(0, 1))
    else:
        x = patch_embed(ew.patch, images.flatten(0, 1), vision.embeddings, tf32=ew.patch_tf32)
    x = x.to(vision.post_layernorm.weight.dtype)
    eps = vision.post_layernorm.eps
    pending = torch.zeros_like(x)
    for lw in ew.vision:
        x, pending = blocks.siglip(lw, x, pending, eps, use_sdpa)
    x = x + pending
    x = model.projector(vision.post_layernorm(x))
    return x.view(B, S * x.shape[1], x.shape[2])


def patch_embed(patch: tuple[Tensor, Tensor], images: Tensor, embeddings, tf32: bool = False) -> Tensor:
    """SigLIP's patch embedding as one matmul: (N, 3, R, R) -> (N, P, D). The conv's stride
    equals its kernel, so it is the patches (channel, row, column within a patch, the conv
    weight's order) times the flattened weight. On the H200 cuDNN ran the float32 conv as a
    SIMT implicit GEMM at 57 us a call for 0.7 GFLOP (2 images), cuBLAS's float32 matmul at
    ~39 us (FFMA); `tf32`: on a CUDA device, outside torch.compile (whose kernels follow the
    process's setting at compile time), on the tensor cores in TF32; not in the engine's
    kernel-compile thread, whose results are discarded: the switch is process-wide, and when that
    thread flipped it while the main thread traced a compiled block, dynamo's guard on it failed
    ("GLOBAL_STATE changed: allow_tf32", `vlaperf check` on the H200, session 23)."""
    weight, bias = patch
    N, C, R, _ = images.shape
    p = embeddings.patch_embedding.kernel_size[0]
    g = R // p
    rows = images.to(weight.dtype).view(N, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(N * g * g, C * p * p)
    tf32 = (tf32 and rows.is_cuda and weight.dtype == torch.float32 and not torch.compiler.is_compiling()
            and not _in_kernel_compile_pass())
    with tf32_matmuls() if tf32 else contextlib.nullcontext():
        x = F.linear(rows, weight, bias)
    x = x.view(N, g * g, -1)
    return x + embeddings.position_embedding.weight[None]


def _in_kernel_compile_pass() -> bool:
    from vlaperf.engine.kernels.launch import compiling_only  # Triton's module: imported on CUDA paths only

    return compiling_only()


@contextlib.contextmanager
def tf32_matmuls():
    """cuBLAS's float32 matmuls in TF32 inside the block, the process's setting restored after
    (through torch's newer `fp32_precision` switch only: mixing it with `allow_tf32` makes
    torch refuse to read either). The switch is process-wide while the block runs (one matmul's
    dispatch). Inside a CUDA-graph capture the TF32 kernel is what the graph keeps."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"  # torch < 2.9: the older switch
    before = getattr(matmul, name)
    setattr(matmul, name, "tf32" if name == "fp32_precision" else True)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def select_slots(x: Tensor, slots: tuple[int, ...]) -> Tensor:
    """x[:, slots] without an index tensor: indexing with a Python list would copy the index
    to the device on every call (and cannot be captured in a CUDA graph)."""
    if slots == tuple(range(slots[0], slots[-1] + 1)):
        return x[:, slots[0] : slots[-1] + 1]
    return torch.stack([x[:, s] for s in slots], dim=1)


def embed_prefix(model: Pi0Model, ew: EngineWeights, obs, plan: PrefixPlan, use_sdpa: bool,
                 blocks: PrefixBlocks = PLAIN_BLOCKS) -> tuple[Tensor, Tensor]:
    """Prefix embeddings (B, Tp, D) and pad mask (B, Tp) for the planned layout."""
    embs, pads = [], []
    if plan.slots:
        img = embed_images(model, ew, select_slots(obs.images, plan.slots), use_sdpa, blocks)
        P = img.shape[1] // len(plan.slots)
        embs.append(img)
        pads.append(select_slots(obs.image_mask, plan.slots).repeat_interleave(P, dim=1))
    tokens = obs.tokens[:, : plan.prompt_len]
    lang = model.backbone.embed_tokens(tokens)
    embs.append(lang * math.sqrt(lang.shape[-1]))
    pads.append(obs.token_mask[:, : plan.prompt_len])
    return torch.cat(embs, dim=1), torch.cat(pads, dim=1)


def prefill(
    model: Pi0Model,
    ew: EngineWeights,
    prefix: Tensor,
    pad: Tensor,
    use_sdpa: bool,
    kv_buffers: tuple[Tensor, Tensor] | None,
    kernels: bool = False,
    blocks: PrefixBlocks = PLAIN_BLOCKS,
) -> list[tuple[Tensor, Tensor]] | None:
    """Backbone over the prefix. With `kv_buffers` (depth, B, K, T >= Tp + Ts, h) the keys and
    values are written into their prefix part and nothing is returned; otherwise the
    per-layer (k, v) list is returned. With static buffers the last layer stops after its
    K/V: its attention output, MLP and the final norm feed nothing the actions depend on.
    `kernels` (the `triton_kernels` lever): attention by the Triton kernel where the backbone
    has one K/V head (Gemma-2B), with the mask cast to bytes once for all layers, and with
    static buffers RoPE and the cache write as one kernel per layer (kernels/rope_qkv.py: it
    writes the cache in place, a declared mutation, so torch.compile does not rebuild the
    buffer per layer)."""
    cfg = model.config.backbone
    positions = torch.cumsum(pad.long(), dim=1) - 1
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_base, prefix.dtype)
    mask = prefix_mask(pad)
    attend = None
    if kernels and cfg.num_kv_heads == 1:
        from vlaperf.engine.kernels.ops import prefix_attention  # custom op: compile sees through

        attend, mask = prefix_attention, mask.to(torch.uint8)
    rope_kernel = attend is not None and kv_buffers is not None and FUSED_ROPE_CACHE_WRITE and ew.backbone[0].qkv is not None
    x, pending, cache = prefix, torch.zeros_like(prefix), []
    last = len(ew.backbone) - 1
    for i, lw in enumerate(ew.backbone):
        kv_layer = None if kv_buffers is None else (kv_buffers[0][i : i + 1], kv_buffers[1][i : i + 1])
        if kv_layer is not None and i == last:
            blocks.gemma_last_kv(lw, x, pending, cfg.eps, cos, sin, kv_layer, rope_kernel)
            return None
        x, pending, kv = blocks.gemma(lw, x, pending, cfg.eps, cos, sin, mask, use_sdpa, attend, kv_layer, rope_kernel)
        if kv_layer is None:
            cache.append(kv)
    return cache


# The prefix's RoPE + cache write as one kernel (with `triton_kernels` and a static cache).
# A switch so benchmarks/change_ab.py can time the call without it, in the same process.
FUSED_ROPE_CACHE_WRITE = True
