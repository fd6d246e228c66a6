"""Attention for the engine: eager (the reference math) or torch SDPA, and the masks.

Shapes: q (B, N, Tq, h); k, v (B, K, Tk, h); mask (B, Tq, Tk) bool, True = may attend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.models.pi0 import ATTENTION_MASK_VALUE, eager_attention


# Below this many query rows (heads x tokens) a single-KV-head attention runs as two plain
# matmuls with the heads folded into the rows: the fused SDPA kernels cost ~55 us per call
# at head dim 256 with a mask on an H200, the folded matmuls a few us (denoise steps: 8 x 51).
FOLDED_MQA_MAX_ROWS = 1024


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, use_sdpa: bool) -> Tensor:
    if not use_sdpa:
        if mask is None:
            mask = torch.ones(q.shape[0], q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
        return eager_attention(q, k, v, mask)
    if k.shape[1] == 1 and q.shape[1] * q.shape[2] <= FOLDED_MQA_MAX_ROWS:
        return folded_mqa_attention(q, k, v, mask)
    if k.shape[1] != q.shape[1]:
        # Broadcast the shared KV head to the query heads as a view (no copy); the fused
        # kernels accept expanded strides.
        groups = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
        v = v[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None])


def folded_mqa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Attention with one shared K/V head as two batched matmuls, heads folded into rows.

    q (B, N, Tq, h) -> rows (B, N*Tq, h); scores (B, N*Tq, Tk) = rows @ k^T; softmax in
    float32 with masked logits set to the reference's large finite negative (not -inf, so
    a fully masked row stays finite).
    """
    B, N, Tq, h = q.shape
    Tk = k.shape[2]
    scores = (q.reshape(B, N * Tq, h) @ k[:, 0].transpose(1, 2)).float() * h**-0.5
    scores = scores.view(B, N, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None], ATTENTION_MASK_VALUE)
    probs = scores.softmax(-1).to(v.dtype).view(B, N * Tq, Tk)
    return (probs @ v[:, 0]).view(B, N, Tq, h)


def prefix_mask(pad: Tensor) -> Tensor:
    """Bidirectional attention among valid prefix tokens, (B, T, T).

    Padded query rows may attend to themselves: their outputs are never read, but a fully
    masked row would give NaN in fused kernels, and NaN keys/values poison later layers
    (0 * NaN = NaN). The reference gives such rows uniform weights instead; both are unread.
    """
    allowed = pad[:, None, :] & pad[:, :, None]
    eye = torch.eye(pad.shape[1], dtype=torch.bool, device=pad.device)[None]
    return allowed | (eye & ~pad[:, :, None])


def suffix_mask(prefix_pad: Tensor, suffix_len: int, pi05: bool) -> Tensor:
    """Suffix queries over [prefix, suffix] keys, (B, Ts, Tp + Ts).

    Every suffix token sees every valid prefix token. pi0's state token (index 0) sees
    only itself within the suffix; the action tokens see the state and all actions.
    pi0.5 has no state token: action tokens see each other.
    """
    B, Tp = prefix_pad.shape
    to_prefix = prefix_pad[:, None, :].expand(B, suffix_len, Tp)
    within = torch.ones(suffix_len, suffix_len, dtype=torch.bool, device=prefix_pad.device)
    if not pi05:
        within[0, 1:] = False
    return torch.cat([to_prefix, within[None].expand(B, -1, -1)], dim=2)
