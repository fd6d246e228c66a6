"""The prefix's Gemma MLP input as one GEMM with its GEGLU in the epilogue.

    out[M, F] = gelu_tanh(h @ W[:F]^T) * (h @ W[F:]^T)      W = [gate; up] (2F, D), fused

Under torch.compile each Gemma prefix layer ran this as cuBLAS's gate_up GEMM (544 x 2048 ->
32768 columns at batch 1, 103 us, with a memset and a ~4.4 us gap before it), which writes
the whole (M, 2F) product, and an inductor kernel that reads it back for GELU x up (14.6 us;
benchmarks/results/h200/profiles/kernel_sequence_best_s9.txt). Here each program computes
a BLOCK_M x BLOCK_N tile of the gate and of the up product from the same rows of h (two
accumulators, one pass over K) and writes only the (M, F) result: half the output bytes,
no second kernel. The product is rounded once (the reference rounds the GEMM's output to
bf16, then the GELU, then the product).

The GEMM is compute-bound at these shapes (2.3 TFLOP a call at batch 1 for the 17 layers),
so the tiles are the large ones a Hopper GEMM uses; `CONFIGS` holds the candidates the H200
sweep tries (benchmarks/geglu_matmul_bench.py) and `DEFAULT` the one it picked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels.small_m_matmul import _gelu_tanh


@triton.jit
def _tile_of(tile, blocks_m, blocks_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row blocks sweep the column blocks together, so a group's weight
    tiles come from HBM once and from L2 for the group's other row blocks."""
    group = tile // (GROUP_M * blocks_n)
    first_m = group * GROUP_M
    size_m = min(blocks_m - first_m, GROUP_M)
    return first_m + (tile % (GROUP_M * blocks_n)) % size_m, (tile % (GROUP_M * blocks_n)) // size_m


@triton.jit
def _geglu_matmul_kernel(
    h_ptr, w_ptr, out_ptr,
    M, F, D,
    stride_hm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(F, BLOCK_N), GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < F
    h_tile = h_ptr + rows[:, None] * stride_hm + ks[None, :]
    g_tile = w_ptr + cols[:, None] * stride_wn + ks[None, :]
    u_tile = g_tile + F * stride_wn
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k_ok = (k0 + ks) < D
        a = tl.load(h_tile + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(g_tile + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        wu = tl.load(u_tile + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        gate = tl.dot(a, tl.trans(wg), gate)
        up = tl.dot(a, tl.trans(wu), up)
    out = _gelu_tanh(gate) * up
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _geglu_matmul_tma_kernel(
    h_desc, g_desc, u_desc, o_desc, M, F, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr, STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Persistent: PROGRAMS programs walk the tiles; every operand tile comes through a TMA
    descriptor (bulk copies, the rows past M and columns past F read as zeros and not stored)."""
    blocks_m, blocks_n = tl.cdiv(M, BLOCK_M), tl.cdiv(F, BLOCK_N)
    k_tiles = tl.cdiv(D, BLOCK_K)
    for tile in tl.range(tl.program_id(0), blocks_m * blocks_n, PROGRAMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, blocks_m, blocks_n, GROUP_M)
        off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in tl.range(k_tiles, num_stages=STAGES):
            a = h_desc.load([off_m, ki * BLOCK_K])
            gate = tl.dot(a, g_desc.load([off_n, ki * BLOCK_K]).T, gate)
            up = tl.dot(a, u_desc.load([off_n, ki * BLOCK_K]).T, up)
        o_desc.store([off_m, off_n], (_gelu_tanh(gate) * up).to(o_desc.dtype))


# (kind, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages): the H200 sweep's candidates.
# kind "ptr": one program a tile, pointer loads; "tma" / "tma_ws": persistent, TMA descriptors
# (and warp specialization)
CONFIGS = (
    ("ptr", 128, 128, 32, 8, 8, 5),
    ("tma", 128, 128, 64, 8, 8, 3),
    ("tma", 128, 128, 64, 8, 8, 4),
    ("tma", 128, 128, 32, 8, 8, 5),
    ("tma", 128, 64, 64, 8, 4, 4),
    ("tma_ws", 128, 128, 64, 8, 8, 3),
    ("tma_ws", 128, 128, 64, 8, 4, 3),
    ("tma_ws", 128, 64, 64, 8, 4, 4),
)
DEFAULT = CONFIGS[0]


def geglu_matmul(h: torch.Tensor, w: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """h (..., D), w (2F, D) = [gate; up] -> gelu_tanh(h @ gate^T) * (h @ up^T), (..., F)."""
    if w.dim() != 2 or w.shape[0] % 2:
        raise ValueError(f"geglu_matmul: w must be the fused (2F, D) gate and up weights, got {tuple(w.shape)}")
    D = w.shape[1]
    if h.shape[-1] != D:
        raise ValueError(f"geglu_matmul: h's last dim {h.shape[-1]} does not match the weights' D = {D}")
    if h.dtype != w.dtype:
        raise ValueError(f"geglu_matmul: h is {h.dtype}, the weights {w.dtype}; expected one dtype")
    if w.stride(1) != 1:
        raise ValueError("geglu_matmul needs the weights' rows contiguous")
    rows = h.reshape(-1, D)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    M, F = rows.shape[0], w.shape[0] // 2
    out = torch.empty(M, F, dtype=h.dtype, device=h.device)
    kind, bm, bn, bk, group, warps, stages = config or DEFAULT
    tiles = triton.cdiv(M, bm) * triton.cdiv(F, bn)
    if kind == "ptr":
        _geglu_matmul_kernel[(tiles,)](rows, w, out, M, F, D, rows.stride(0), w.stride(0), out.stride(0),
                                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages)
    elif kind in ("tma", "tma_ws"):
        from triton.tools.tensor_descriptor import TensorDescriptor

        programs = min(tiles, torch.cuda.get_device_properties(h.device).multi_processor_count if h.is_cuda else 4)
        descs = (TensorDescriptor.from_tensor(rows, [bm, bk]), TensorDescriptor.from_tensor(w[:F], [bn, bk]),
                 TensorDescriptor.from_tensor(w[F:], [bn, bk]), TensorDescriptor.from_tensor(out, [bm, bn]))
        _geglu_matmul_tma_kernel[(programs,)](*descs, M, F, D, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
                                              PROGRAMS=programs, STAGES=stages, WARP_SPECIALIZE=kind == "tma_ws",
                                              num_warps=warps)
    else:
        raise ValueError(f"geglu_matmul: config kind {kind!r} is not one of 'ptr', 'tma', 'tma_ws'")
    return out.view(*h.shape[:-1], F)
