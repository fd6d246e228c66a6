"""Layer math over `EngineWeights`: the same functions as the reference, with the levers'
variations (fused weights, SDPA) selected by plain arguments. No host syncs anywhere here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.engine.attention import attention
from vlaperf.engine.fusion import GemmaLayerW, SiglipLayerW
from vlaperf.models.pi0 import apply_rope


def rms_normalize(x: Tensor, eps: float, scale: Tensor | None = None) -> Tensor:
    """Gemma RMSNorm in float32; `scale` is (1 + w), or None where it was folded away."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (n if scale is None else n * scale).to(x.dtype)


def modulated(x: Tensor, eps: float, scale: Tensor, shift: Tensor) -> Tensor:
    """pi0.5 adaptive RMSNorm with precomputed scale/shift ((D,) or (B, 1, D))."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (n * (1.0 + scale.float()) + shift.float()).to(x.dtype)


def adaptive_from_dense(x: Tensor, eps: float, dense: tuple[Tensor, Tensor], cond: Tensor) -> tuple[Tensor, Tensor]:
    mod = F.linear(cond.to(dense[0].dtype), *dense)[:, None, :]  # (B, 1, 3D)
    scale, shift, gate = mod.chunk(3, dim=-1)
    return modulated(x, eps, scale, shift), gate.to(x.dtype)


# ------------------------------------------------------------------------ SigLIP


def siglip_layer(lw: SiglipLayerW, x: Tensor, eps: float, use_sdpa: bool) -> Tensor:
    x, branch = siglip_layer_parts(lw, x, eps, use_sdpa)
    return x + branch


def siglip_layer_parts(lw: SiglipLayerW, x: Tensor, eps: float, use_sdpa: bool) -> tuple[Tensor, Tensor]:
    """siglip_layer up to its last residual add: (x, branch), the layer's output being x + branch."""
    B, T, D = x.shape
    h = F.layer_norm(x, (D,), *lw.ln1, eps)
    if lw.qkv is not None:
        q, k, v = F.linear(h, *lw.qkv).split(D, dim=-1)
    else:
        q, k, v = F.linear(h, *lw.q), F.linear(h, *lw.k), F.linear(h, *lw.v)
    heads = lambda t: t.view(B, T, lw.num_heads, D // lw.num_heads).transpose(1, 2)  # noqa: E731
    out = attention(heads(q), heads(k), heads(v), None, use_sdpa)
    x = x + F.linear(out.transpose(1, 2).reshape(B, T, D), *lw.out)
    h = F.layer_norm(x, (D,), *lw.ln2, eps)
    g = siglip_fc1_gelu(lw, h)
    if lw.fc2_lt:
        from vlaperf.engine.kernels.ops import lt_linear  # custom op: compile sees through

        return x, lt_linear(g, *lw.fc2)
    return x, F.linear(g, *lw.fc2)


def siglip_fc1_gelu(lw: SiglipLayerW, h: Tensor) -> Tensor:
    """gelu_tanh(h @ W1^T + b1). With `gelu_epilogue`, one `_addmm_activation` call: on CUDA
    a cuBLASLt GEMM with a bias + GELU(tanh) epilogue (inductor keeps it as one extern call),
    the activation taken on the float32 accumulator before the single rounding."""
    w, b = lw.fc1
    if not lw.gelu_epilogue:
        return F.gelu(F.linear(h, w, b), approximate="tanh")
    rows = h.reshape(-1, h.shape[-1])
    return torch._addmm_activation(b, rows, w.t(), use_gelu=True).view(*h.shape[:-1], w.shape[0])


# ------------------------------------------------------------------------- Gemma


def qkv_projection(lw: GemmaLayerW, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """h (B, T, D) -> q (B, N, T, h), k, v (B, K, T, h), before RoPE."""
    B, T, _ = h.shape
    N, K, hd = lw.num_heads, lw.num_kv_heads, lw.head_dim
    if lw.qkv is not None:
        q, k, v = F.linear(h, lw.qkv).split([N * hd, K * hd, K * hd], dim=-1)
    else:
        q, k, v = F.linear(h, lw.q), F.linear(h, lw.k), F.linear(h, lw.v)
    return (q.view(B, T, N, hd).transpose(1, 2), k.view(B, T, K, hd).transpose(1, 2), v.view(B, T, K, hd).transpose(1, 2))


# The stacked gate_up weight as two GEMMs of its halves (views, no copy) instead of one of twice the
# width: at the prefix's M = 544 cuBLAS picks the same 192 x 192 kernel for both widths, and only the
# 32768-wide call comes with a memset node in front of it (benchmarks/memset_probe.py). A switch for
# benchmarks/change_ab.py (`split_gate_up`); off: the libero-pi0 call 0.996x (session 19), the memset's
# idle time is the profiler's, not a replay's.
SPLIT_GATE_UP = False


def gemma_mlp(lw: GemmaLayerW, h: Tensor) -> Tensor:
    if lw.gate_up is not None and SPLIT_GATE_UP:
        half = lw.gate_up.shape[0] // 2
        gate, up = F.linear(h, lw.gate_up[:half]), F.linear(h, lw.gate_up[half:])
    elif lw.gate_up is not None:
        gate, up = F.linear(h, lw.gate_up).chunk(2, dim=-1)
    else:
        gate, up = F.linear(h, lw.gate), F.linear(h, lw.up)
    return F.linear(F.gelu(gate, approximate="tanh") * up, lw.down)


def gemma_layer(*args, **kwargs) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One Gemma layer on one stream; the arguments are gemma_layer_parts'.
    Returns the new x and this stream's (k, v) after RoPE (for the prefix cache)."""
    x, branch, gate, kv = gemma_layer_parts(*args, **kwargs)
    return (x + branch if gate is None else x + branch * gate), kv


def gemma_layer_parts(
    lw: GemmaLayerW,
    x: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    mask: Tensor | None,
    use_sdpa: bool,
    kv_write: tuple[Tensor, Tensor] | None = None,
    kv_past: tuple[Tensor, Tensor] | None = None,
    mod: Tensor | None = None,
    ada_cond: Tensor | None = None,
    attend=None,
    rope_qkv=None,
) -> tuple[Tensor, Tensor, Tensor | None, tuple[Tensor, Tensor]]:
    """One Gemma layer up to its last residual add: (x, branch, gate, (k, v)), the layer's output
    being x + branch (times gate, pi0.5's adaptive norms, when not None).

    kv_write: static buffers (B, K, T_total, h) and this stream's slot in them are given as
              views; this stream's k, v are written there and attention reads the whole
              buffer view passed in `kv_past` (static cache), or
    kv_past:  cached prefix (k, v) concatenated in front of this stream's (dynamic cache).
    mod:      pi0.5 tabulated modulation rows (6, D): scale/shift/gate for both norms.
    ada_cond: pi0.5 condition (B, D) when modulation is not tabulated.
    attend:   attention to use instead of `attention` (a kernel), called as attend(q, k, v, mask).
    rope_qkv: the fused projection's output (B, T, (N + 2K) h) -> (q, k) after RoPE, writing
              k and v into the static cache itself (with `triton_kernels`: kernels/rope_qkv.py);
              needs `attend`, replaces kv_write. Attention reads kv_past if given (the denoise
              step: the whole cache, this stream's keys just written there), else this
              stream's own k, v (the prefix).
    (k, v) are this stream's after RoPE (for the prefix cache).
    """
    gate1 = gate2 = None
    if mod is not None:
        h = modulated(x, eps, mod[0], mod[1])
        gate1 = mod[2].to(x.dtype)
    elif lw.ada_in is not None:
        h, gate1 = adaptive_from_dense(x, eps, lw.ada_in, ada_cond)
    else:
        h = rms_normalize(x, eps, lw.in_scale)
    if rope_qkv is not None:
        B, T, _ = h.shape
        qkv = F.linear(h, lw.qkv)
        q, k = rope_qkv(qkv)
        v = qkv[..., -lw.num_kv_heads * lw.head_dim :].view(B, T, lw.num_kv_heads, lw.head_dim).transpose(1, 2)
        k_all, v_all = kv_past if kv_past is not None else (k, v)
        out = attend(q, k_all, v_all, mask).transpose(1, 2).reshape(B, T, -1)
    else:
        q, k, v = qkv_projection(lw, h)
        out, (k, v) = rope_and_attend(q, k, v, cos, sin, mask, use_sdpa, kv_write, kv_past, attend)
    branch = F.linear(out, lw.o)
    x = x + branch if gate1 is None else x + branch * gate1
    if mod is not None:
        h = modulated(x, eps, mod[3], mod[4])
        gate2 = mod[5].to(x.dtype)
    elif lw.ada_post is not None:
        h, gate2 = adaptive_from_dense(x, eps, lw.ada_post, ada_cond)
    else:
        h = rms_normalize(x, eps, lw.post_scale)
    return x, gemma_mlp(lw, h), gate2, (k, v)


def rope_and_attend(q, k, v, cos, sin, mask, use_sdpa, kv_write, kv_past, attend=None):
    """RoPE on q, k; the cache (see gemma_layer); attention (`attend(q, k, v, mask)` if given).
    Returns (B, T, N*h) and (k, v)."""
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if kv_write is not None:
        kv_write[0].copy_(k)
        kv_write[1].copy_(v)
        k_all, v_all = kv_past
    elif kv_past is not None:
        k_all, v_all = torch.cat([kv_past[0], k], dim=2), torch.cat([kv_past[1], v], dim=2)
    else:
        k_all, v_all = k, v
    out = attend(q, k_all, v_all, mask) if attend else attention(q, k_all, v_all, mask, use_sdpa)
    B, _, T, _ = q.shape
    return out.transpose(1, 2).reshape(B, T, -1), (k, v)


def small_m_layer_applies(lw: GemmaLayerW, rows: int) -> bool:
    """The `triton_kernels` layer needs folded plain RMSNorms (pi0 with fuse_projections) and
    at most 64 rows (batch 1 of 51 suffix tokens)."""
    return lw.qkv is not None and lw.gate_up is not None and lw.ada_in is None and lw.in_scale is None and rows <= 64


def gemma_layer_small_m(lw: GemmaLayerW, x: Tensor, eps: float, cos, sin, mask, use_sdpa, kv_write=None, kv_past=None):
    """gemma_layer for the denoise step with the `triton_kernels` kernels: four launches for the
    matmuls, the pre-norms, GELU-GLU and both residual adds (kernels/small_m_matmul.py), and
    split-key attention over the cache when there is a mask (kernels/suffix_attention.py)."""
    from vlaperf.engine.kernels.ops import small_m_matmul, suffix_attention  # custom ops: compile sees through

    B, T, D = x.shape
    N, K, hd = lw.num_heads, lw.num_kv_heads, lw.head_dim
    x2 = x.reshape(B * T, D)
    qkv = small_m_matmul(x2, lw.qkv, rms_eps=eps).view(B, T, -1)
    q, k, v = qkv.split([N * hd, K * hd, K * hd], dim=-1)
    q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    attend = suffix_attention if mask is not None and K == 1 else None
    if attend is None and mask is not None and mask.dtype != torch.bool:
        mask = mask.bool()  # the step may hand over the kernel's uint8 mask; torch attention wants bool
    out, kv = rope_and_attend(q, k, v, cos, sin, mask, use_sdpa, kv_write, kv_past, attend)
    x2 = small_m_matmul(out.reshape(B * T, -1), lw.o, residual=x2)
    F_ = lw.gate_up.shape[0] // 2
    h = small_m_matmul(x2, lw.gate_up[:F_], w_up=lw.gate_up[F_:], rms_eps=eps)
    x2 = small_m_matmul(h, lw.down, residual=x2)
    return x2.view(B, T, D), kv
