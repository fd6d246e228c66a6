"""Weight-streaming matmul for few rows (the denoise step: M = 51 suffix tokens).

    y[M, N] = epilogue( rowscale(x)[M] * (x[M, K] @ w[N, K]^T) )

At M <= 64 a matmul is a pass over the weights: 2*M*N*K FLOPs against 2*N*K bytes, far
below the ridge, so the only goal is to read the weights once at full bandwidth. cuBLAS
reaches ~29% of it on these shapes on an H200 (shared/design/perf-facts.md) and needs a
split-K reduce kernel besides. Here each program owns a BLOCK_N slice of the columns and
the whole (padded) M, and streams its weight rows once; when there are too few column
blocks to fill the GPU the K loop is split across programs (SPLIT_K) and a second, small
kernel sums the float32 partials (deterministic: no atomics).

Fused around the matmul, so the step needs no separate elementwise kernels for them:
  prologue  RMS_NORM: y *= rsqrt(mean(x^2) + eps) per row. With the RMSNorm scale (1 + w)
            folded into w (fuse_projections), this is the whole pre-norm; the sum of squares
            is accumulated from the x tiles the matmul loads anyway.
  epilogue  "geglu":    y = gelu_tanh(x @ gate^T) * (x @ up^T)   (two weight matrices)
            "residual": y = residual + (x @ w^T) [* gate]         (o_proj, down_proj)
Measured on an H200 (benchmarks/small_m_matmul_bench.py, M = 51, results in
benchmarks/results/h200/kernel_small_m_matmul.json): per expert layer the four calls take
~27 us against ~71 us for cuBLAS plus the eager elementwise they replace; `pick_config`
holds the fastest correct configuration per shape class from that sweep.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels.launch import launch, pdl_wait


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh written with exp for portability
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * (1.0 - 1.0 / (tl.exp(2.0 * inner) + 1.0))


@triton.jit
def _small_m_kernel(
    x_ptr, w_ptr, w2_ptr, out_ptr, res_ptr, gate_ptr, part_ptr, ssq_ptr,
    M, N, K, eps,
    stride_xm, stride_wn, stride_om, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    RMS_NORM: tl.constexpr, GEGLU: tl.constexpr, RESIDUAL: tl.constexpr, GATED: tl.constexpr, PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_per_split = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ssq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        # float32 operands: PRECISION is "ieee" (FMA, as torch's float32 matmul) unless the caller asks
        # for "tf32x3" (three TF32 tensor-core products, near-float32) or "tf32"; None for bf16
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
        if GEGLU:
            w2 = tl.load(w2_ptr + cols[:, None] * stride_wn + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc2 += tl.dot(x, tl.trans(w2), input_precision=PRECISION)
        if RMS_NORM:
            xf = x.to(tl.float32)
            ssq += tl.sum(xf * xf, axis=1)
    if SPLIT_K > 1:
        # float32 partials (split, [2,] M, N) and per-row sums of squares (split, M)
        base = part_ptr + pid_k * (2 if GEGLU else 1) * BLOCK_M * N
        tl.store(base + rows[:, None] * N + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])
        if GEGLU:
            tl.store(base + BLOCK_M * N + rows[:, None] * N + cols[None, :], acc2, mask=row_ok[:, None] & col_ok[None, :])
        if RMS_NORM:
            if pid_n == 0:  # every column block has the same row sums; one writes them
                tl.store(ssq_ptr + pid_k * BLOCK_M + rows, ssq, mask=row_ok)
    else:
        _epilogue(acc, acc2, ssq, rows, cols, row_ok, col_ok, out_ptr, res_ptr, gate_ptr, K, eps,
                  stride_om, stride_rm, RMS_NORM, GEGLU, RESIDUAL, GATED)


@triton.jit
def _epilogue(acc, acc2, ssq, rows, cols, row_ok, col_ok, out_ptr, res_ptr, gate_ptr, K, eps,
              stride_om, stride_rm, RMS_NORM: tl.constexpr, GEGLU: tl.constexpr, RESIDUAL: tl.constexpr,
              GATED: tl.constexpr):
    if RMS_NORM:
        scale = 1.0 / tl.sqrt(ssq / K + eps)
        acc = acc * scale[:, None]
        if GEGLU:
            acc2 = acc2 * scale[:, None]
    if GEGLU:
        acc = _gelu_tanh(acc) * acc2
    mask = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        if GATED:
            acc = acc * tl.load(gate_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_kernel(
    part_ptr, ssq_ptr, out_ptr, res_ptr, gate_ptr, M, N, K, eps, stride_om, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    RMS_NORM: tl.constexpr, GEGLU: tl.constexpr, RESIDUAL: tl.constexpr, GATED: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    pid_n = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ssq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for s in range(SPLIT_K):
        base = part_ptr + s * (2 if GEGLU else 1) * BLOCK_M * N
        acc += tl.load(base + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        if GEGLU:
            acc2 += tl.load(base + BLOCK_M * N + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        if RMS_NORM:
            ssq += tl.load(ssq_ptr + s * BLOCK_M + rows, mask=row_ok, other=0.0)
    _epilogue(acc, acc2, ssq, rows, cols, row_ok, col_ok, out_ptr, res_ptr, gate_ptr, K, eps,
              stride_om, stride_rm, RMS_NORM, GEGLU, RESIDUAL, GATED)


def pick_config(N: int, K: int, geglu: bool, num_sms: int = 132) -> dict[str, int]:
    """Tiling for an (M <= 64) x K @ K x N product, from the H200 sweep over block_n, block_k
    and split_k on the pi0 expert's shapes (kernel_small_m_matmul.json):
      wide outputs (qkv N=2560, gate_up N=2x4096 at K=1024): 32 columns per program and no
        split fill the SMs already (80 / 128 programs); 6.5 and 8.3 us;
      narrow outputs (o_proj, down: N=1024 at K=2048 / 4096): 16 columns and 4 K splits
        (256 programs); 5.3 and 6.8 us. More splits lose: the float32 partials (split x 64 x N)
        become a sizeable share of the bytes moved, and so does the reduce kernel.
    Other shapes get the same two classes (split only while each split keeps 4 K blocks)."""
    wide = triton.cdiv(N, 32) >= num_sms // 2
    block_n = 32 if wide else 16
    block_k = 128 if geglu else 64
    split_k = 1
    while not wide and split_k < 4 and K // (split_k * 2) >= 4 * block_k:
        split_k *= 2
    return {"block_n": block_n, "block_k": block_k, "split_k": split_k}


def small_m_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    w_up: torch.Tensor | None = None,
    rms_eps: float | None = None,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_sms: int = 132,
    precision: str | None = None,
) -> torch.Tensor:
    """y = epilogue(x @ w^T) for x (M, K) with M <= 64, w (N, K) row-major.

    w_up:     GEGLU: y = gelu_tanh(x @ w^T) * (x @ w_up^T)
    rms_eps:  prologue RMSNorm without scale (fold the scale into w): rows of x normalised
    residual: y = residual + (x @ w^T) [* gate], residual (M, N); a bias broadcast over the
              rows (stride 0, e.g. `bias.expand(M, N)`) is a residual too
    float32 x and w multiply in full precision (FMA, as torch's float32 matmul; not TF32),
    bf16 on tensor cores. precision: for float32 operands, "ieee" (the default), "tf32x3"
    (three TF32 tensor-core products, close to float32) or "tf32".
    block_n, block_k, split_k: the tiling; None takes `pick_config`'s (measured) choice.
    """
    M, K = x.shape
    N = w.shape[0]
    if M > 64:
        raise ValueError(f"small_m_matmul is for at most 64 rows, got {M}")
    if w.shape[1] != K or (w_up is not None and w_up.shape != w.shape):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w {tuple(w.shape)}, w_up {None if w_up is None else tuple(w_up.shape)}")
    if w.dtype != x.dtype or (w_up is not None and w_up.dtype != x.dtype):
        raise ValueError(f"small_m_matmul: x is {x.dtype} and w {w.dtype}; expected the same dtype")
    if precision is not None and (x.dtype != torch.float32 or precision not in ("ieee", "tf32x3", "tf32")):
        raise ValueError(f"small_m_matmul: precision={precision!r} needs float32 operands and one of 'ieee', 'tf32x3', "
                         f"'tf32' (x is {x.dtype})")
    assert x.stride(1) == 1 and w.stride(1) == 1 and (w_up is None or w_up.stride() == w.stride())
    BLOCK_M = 16 if M <= 16 else 32 if M <= 32 else 64
    auto = pick_config(N, K, w_up is not None, num_sms)
    block_n = block_n or auto["block_n"]
    block_k = block_k or auto["block_k"]
    split_k = split_k or auto["split_k"]
    n_blocks = triton.cdiv(N, block_n)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    geglu = w_up is not None
    flags = dict(RMS_NORM=rms_eps is not None, GEGLU=geglu, RESIDUAL=residual is not None, GATED=gate is not None)
    res = residual if residual is not None else out
    g = gate if gate is not None else out
    eps = float(rms_eps or 0.0)
    if split_k > 1:
        part = torch.empty(split_k * (2 if geglu else 1) * BLOCK_M * N, dtype=torch.float32, device=x.device)
        ssq = torch.empty(split_k * BLOCK_M, dtype=torch.float32, device=x.device)
    else:
        part = ssq = out
    launch(
        _small_m_kernel, (n_blocks, split_k), x, w, w_up if geglu else w, out, res, g, part, ssq, M, N, K, eps,
        x.stride(0), w.stride(0), out.stride(0), res.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        PRECISION=(precision or "ieee") if x.dtype == torch.float32 else None, **flags,
    )
    if split_k > 1:
        launch(
            _reduce_kernel, (n_blocks,), part, ssq, out, res, g, M, N, K, eps, out.stride(0), res.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, SPLIT_K=split_k, **flags,
        )
    return out
