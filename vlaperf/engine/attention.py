"""Attention for the engine: eager (the reference math) or torch SDPA, and the masks.

Shapes: q (B, N, Tq, h); k, v (B, K, Tk, h); mask (B, Tq, Tk) bool, True = may attend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.models.pi0 import eager_attention


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, use_sdpa: bool) -> Tensor:
    if not use_sdpa:
        if mask is None:
            mask = torch.ones(q.shape[0], q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
        return eager_attention(q, k, v, mask)
    if k.shape[1] != q.shape[1]:
        # Broadcast the shared KV head to the query heads as a view (no copy); the fused
        # kernels accept expanded strides.
        groups = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
        v = v[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None])


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
