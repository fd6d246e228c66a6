"""The prefix's qkv epilogue in one kernel: RoPE on q and k, and k, v written into the static
KV cache, straight from the fused qkv projection's output.

Under torch.compile the reference ops became, per Gemma layer of the prefix, four kernels:
RoPE on q (with the angles' pow/sin/cos recomputed per element, 7.2 us), RoPE on k (3.7 us),
and the cache write, which inductor lowered as a select/slice scatter over the whole cache
buffer, every layer's slots included (5-7 us at batch 1 for 0.6 MB of new keys and values;
12-16 us at batch 4), plus their launch gaps
(benchmarks/results/h200/profiles/kernel_sequence_best_s8.txt, kernels_b4_best_s8.txt).
Here one pass reads the projection once (B*T x (N + 2K) * h) and writes q, k (for the
attention) and the cache slots; the rotary tables are the ones the reference computes.

The custom op (kernels/ops.py) mutates the cache buffers in place; it returns q and k as
new tensors, so nothing downstream reads the mutated buffers inside the prefix graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels.launch import launch, pdl_wait


@triton.jit
def _rotate(x1, x2, cos_ptr, sin_ptr, trig, t_ok, HALF: tl.constexpr):
    """rotate-half RoPE: out[:h/2] = x1 cos - x2 sin, out[h/2:] = x2 cos + x1 sin, with the
    reference's tables (both halves of a row hold the same angles), in float32, one rounding."""
    c1 = tl.load(cos_ptr + trig, mask=t_ok[:, None], other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + trig + HALF, mask=t_ok[:, None], other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + trig, mask=t_ok[:, None], other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + trig + HALF, mask=t_ok[:, None], other=0.0).to(tl.float32)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    return (f1 * c1 - f2 * s1).to(x1.dtype), (f2 * c2 + f1 * s2).to(x1.dtype)


@triton.jit
def _rope_qkv_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, kc_ptr, vc_ptr,
    T, start, N, K,
    sxb, sxt, scb, sct, sqb, sqh, sqt, skb, skh, skt, scache_b, scache_h, scache_t,
    HALF: tl.constexpr, BLOCK_T: tl.constexpr, WRITE_Q: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(2)  # [0, N): q heads, [N, N + K): k heads, [N + K, N + 2K): v heads
    if not WRITE_Q:  # the grid holds the key and value heads only
        head += N
    t_ok = t < T
    d = tl.arange(0, HALF)
    row = qkv_ptr + b * sxb + t[:, None] * sxt + head * (2 * HALF) + d[None, :]
    x1 = tl.load(row, mask=t_ok[:, None], other=0.0)
    x2 = tl.load(row + HALF, mask=t_ok[:, None], other=0.0)
    trig = b * scb + t[:, None] * sct + d[None, :]
    slot = (start + t[:, None]) * scache_t + d[None, :]
    if head >= N + K:  # a value head: into the cache as it is
        cache = vc_ptr + b * scache_b + (head - N - K) * scache_h + slot
        tl.store(cache, x1, mask=t_ok[:, None])
        tl.store(cache + HALF, x2, mask=t_ok[:, None])
    elif head >= N:  # a key head: rotated, returned and into the cache
        o1, o2 = _rotate(x1, x2, cos_ptr, sin_ptr, trig, t_ok, HALF)
        out = k_ptr + b * skb + (head - N) * skh + t[:, None] * skt + d[None, :]
        tl.store(out, o1, mask=t_ok[:, None])
        tl.store(out + HALF, o2, mask=t_ok[:, None])
        cache = kc_ptr + b * scache_b + (head - N) * scache_h + slot
        tl.store(cache, o1, mask=t_ok[:, None])
        tl.store(cache + HALF, o2, mask=t_ok[:, None])
    else:  # a query head: rotated and returned
        o1, o2 = _rotate(x1, x2, cos_ptr, sin_ptr, trig, t_ok, HALF)
        out = q_ptr + b * sqb + head * sqh + t[:, None] * sqt + d[None, :]
        tl.store(out, o1, mask=t_ok[:, None])
        tl.store(out + HALF, o2, mask=t_ok[:, None])


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             layer: int, start: int, num_heads: int, num_kv_heads: int, write_q: bool = True,
             block_t: int = 32, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (B, T, (N + 2K) * h) from the fused projection; cos, sin (B, T, h); caches
    (depth, B, K, T_cache, h). Writes RoPE(k) and v into the caches' `layer` at keys
    [start, start + T) and returns RoPE(q) (B, N, T, h) (N = 0 rows if not write_q) and
    RoPE(k) (B, K, T, h)."""
    B, T, C = qkv.shape
    N, K = num_heads, num_kv_heads
    h = C // (N + 2 * K)
    if C != (N + 2 * K) * h or h % 2 or h & (h - 1):
        raise ValueError(f"rope_qkv: qkv's last dim {C} is not (heads {N} + 2 x kv heads {K}) x a power-of-two head dim")
    if cos.shape != (B, T, h) or sin.shape != (B, T, h):
        raise ValueError(f"rope_qkv: expected cos and sin of shape {(B, T, h)}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if k_cache.shape[1:3] != (B, K) or k_cache.shape[4] != h or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_qkv: expected caches (depth, {B}, {K}, T, {h}), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if not (0 <= layer < k_cache.shape[0]) or start < 0 or start + T > k_cache.shape[3]:
        raise ValueError(f"rope_qkv: layer {layer}, keys [{start}, {start + T}) outside the cache {tuple(k_cache.shape)}")
    if qkv.stride(2) != 1 or cos.stride(2) != 1 or sin.stride(2) != 1 or k_cache.stride(4) != 1 or v_cache.stride(4) != 1:
        raise ValueError("rope_qkv needs the last dims contiguous")
    if cos.stride() != sin.stride():
        raise ValueError("rope_qkv: cos and sin must share a layout")
    q = torch.empty(B, N if write_q else 0, T, h, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(B, K, T, h, dtype=qkv.dtype, device=qkv.device)
    kc, vc = k_cache[layer], v_cache[layer]
    if kc.stride() != vc.stride():
        raise ValueError("rope_qkv: the key and value caches must share a layout")
    launch(
        _rope_qkv_kernel, (B, triton.cdiv(T, block_t), (N if write_q else 0) + 2 * K), qkv, cos, sin, q, k, kc, vc, T, start, N, K,
        qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        kc.stride(0), kc.stride(1), kc.stride(2),
        HALF=h // 2, BLOCK_T=block_t, WRITE_Q=write_q, num_warps=num_warps,
    )
    return q, k
