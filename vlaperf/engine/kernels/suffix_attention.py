"""Attention of the denoise step's few query rows over the cached prefix + suffix keys.

One shared K/V head (pi0's Gemma: 8 query heads, 1 KV head), so the 8 heads' queries fold
into rows: (B, N*Tq, h) against (B, Tk, h). The keys are split across programs
(flash-decoding): each program runs an online softmax over its key chunk and writes a
partial (unnormalised output, running max, running sum); a second kernel merges the splits.
Masked logits get the reference's large finite negative, so a fully masked row stays finite.
Tiles: at head dim 256 a 64-key tile of K and of V is 32 KiB each in bf16; with Triton's
default 3-stage pipelining the first H200 run asked for 240 KiB of shared memory (the limit
is 227 KiB) and failed to launch. 32-key tiles and 2 stages need about a third of that.
Correctness-tested on the CPU (Triton interpreter, float32) and in bf16 on the GPU by the
engine's equivalence check (float32 operands multiply in full precision, not Triton's default
TF32); timed by benchmarks/suffix_attention_bench.py: on the step's
shape (8 x 51 rows, 595 keys, head dim 256) the 32-row, 32-key tiles take ~20 us against ~31 us
for 64-row tiles and ~35 us for the engine's folded matmuls in eager
(benchmarks/results/h200/kernel_suffix_attention.json).

`prefix_attention` runs the same kernel on the prefix (8 x 544 query rows at batch 1) with
its own tiles (PREFIX_TILES) and key splits picked for the shape (`prefix_splits`: 3 at batch 1's
68 row blocks, so 204 programs instead of one pass's 68; one pass at batch 4 and 8).
On the H200 torch's SDPA picks cuDNN for this shape (head dim 256, a mask) at ~48 us a layer
(benchmarks/results/h200/profiles/kernels_graph_replay_best_splitk.txt) for ~2.4 GFLOP.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels.launch import launch, pdl_wait
from vlaperf.models.pi0 import ATTENTION_MASK_VALUE


@triton.jit
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, m_ptr, l_ptr, out_ptr,
    ROWS, TQ, TK, MASK_COLS, keys_per_split, scale,
    sqb, sqh, sqt, skb, skt, svb, svt, smb, smq, sob, soh, sot,
    MASK_VALUE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    PRECISION: tl.constexpr = None, USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    b = tl.program_id(0)
    rb = tl.program_id(1)
    s = tl.program_id(2)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    head = rows // TQ
    tq = rows % TQ
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * sqb + head[:, None] * sqh + tq[:, None] * sqt + d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    k_start = s * keys_per_split
    for k0 in range(k_start, k_start + keys_per_split, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        key_ok = (keys < TK) & (keys < k_start + keys_per_split)
        k = tl.load(k_ptr + b * skb + keys[:, None] * skt + d[None, :], mask=key_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
        # The mask's load is bounded by the columns its rows hold, not by TK: aligned rows hold a multiple of 16, so
        # the bound's constancy lets these loads be 16-byte vectors (keys past TK become -inf just below)
        allowed = tl.load(mask_ptr + b * smb + tq[:, None] * smq + keys[None, :],
                          mask=row_ok[:, None] & (keys < MASK_COLS)[None, :], other=0)
        scores = tl.where(allowed != 0, scores, MASK_VALUE)
        scores = tl.where(key_ok[None, :], scores, float("-inf"))  # keys past the end do not exist
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * svb + keys[:, None] * svt + d[None, :], mask=key_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
        m_i = m_new
    if SPLITS == 1:  # one pass over all keys (the prefix's long query side): normalise and write the output
        tl.store(out_ptr + b * sob + head[:, None] * soh + tq[:, None] * sot + d[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        base = (b * SPLITS + s) * ROWS
        tl.store(acc_ptr + (base + rows[:, None]) * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None])
        tl.store(m_ptr + base + rows, m_i, mask=row_ok)
        tl.store(l_ptr + base + rows, l_i, mask=row_ok)


@triton.jit
def _merge_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, ROWS, TQ, soh, sot, sob,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
                  USE_PDL: tl.constexpr = False):
    """Program (b, row block, dim block): the splits' partials of BLOCK_M rows and BLOCK_D of the
    head dims, weighted by their running maxima. The per-row maxima and sums are re-read by
    each dim block (a few hundred bytes): what the dim split buys is programs, since one
    program a row block left most SMs idle (52 programs at batch 4, 68 for the prefix)."""
    pdl_wait(USE_PDL)
    b = tl.program_id(0)
    rb = tl.program_id(1)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for s in range(SPLITS):
        m = tl.maximum(m, tl.load(m_ptr + (b * SPLITS + s) * ROWS + rows, mask=row_ok, other=float("-inf")))
    total = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    norm = tl.zeros((BLOCK_M,), tl.float32)
    for s in range(SPLITS):
        base = (b * SPLITS + s) * ROWS
        m_s = tl.load(m_ptr + base + rows, mask=row_ok, other=float("-inf"))
        w = tl.where(m_s > float("-inf"), tl.exp(m_s - m), 0.0)  # a split with no keys adds nothing
        norm += w * tl.load(l_ptr + base + rows, mask=row_ok, other=0.0)
        total += w[:, None] * tl.load(acc_ptr + (base + rows[:, None]) * HEAD_DIM + d[None, :], mask=row_ok[:, None], other=0.0)
    out = total / norm[:, None]
    head = rows // TQ
    tq = rows % TQ
    tl.store(out_ptr + b * sob + head[:, None] * soh + tq[:, None] * sot + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


# The merge's programs: split the head dim until there are at least this many (two per SM on
# the H200), down to MIN_MERGE_DIMS dims a program
MERGE_PROGRAMS = 264
MIN_MERGE_DIMS = 32


def merge_block_d(programs: int, head_dim: int) -> int:
    """Dims per merge program: the whole head dim, halved while fewer than MERGE_PROGRAMS
    programs would run (`programs`: samples x row blocks) and a half keeps at least
    MIN_MERGE_DIMS dims. A head dim that is not a power of two stays whole."""
    if head_dim & (head_dim - 1):
        return head_dim
    bd = head_dim
    while programs * (head_dim // bd) < MERGE_PROGRAMS and bd // 2 >= MIN_MERGE_DIMS:
        bd //= 2
    return bd


# Programs of the partial kernel resident at once: two a multiprocessor at the default tiles
# (32 x 32, two stages: ~80 KB of shared memory each) on the H200's 132
WAVE_PROGRAMS = 264


def default_splits(Tk: int, block_n: int, blocks: int) -> int:
    """Key splits for `blocks` (samples x row blocks): ~4 key tiles a split (more splits add
    float32 partials, splits x rows x h, to write and merge, which at 8 x 51 rows outweigh the
    K/V bytes themselves), and no more than keep all programs in one wave: a second, partial
    wave costs about a whole program's time (batch 8, 104 blocks: 3 splits, 312 programs,
    46.1 us; 2 splits, 208 programs, 36.9 us; kernel_suffix_attention_b8.json)."""
    return max(1, min(triton.cdiv(Tk, 4 * block_n), WAVE_PROGRAMS // blocks))


def whole_tile_splits(Tk: int, block_n: int, splits: int) -> tuple[int, int]:
    """(splits run, keys a split) for `splits` asked: each split a whole number of key tiles, so some counts run as
    fewer (600 keys in 32-key tiles: 6 splits asked run as 5 of 128 keys)."""
    keys_per_split = triton.cdiv(triton.cdiv(Tk, splits), block_n) * block_n
    return triton.cdiv(Tk, keys_per_split), keys_per_split


# The prefix's key splits: at most 3, and only as many as keep the programs in one wave (`prefix_splits`)
PREFIX_MAX_SPLITS = 3


def prefix_splits(blocks: int) -> int:
    """Key splits for the prefix's `blocks` (samples x row blocks of 64 folded rows): the most, up to
    PREFIX_MAX_SPLITS, whose programs fit in one wave, and one split (no partials, no merge) where even one split
    fills a wave. Measured with 1-6 splits at the shapes the prompt buckets make (prefix_splits_probe.py, session
    36): a fixed 3 put 712-968 rows (89-121 blocks) into a second, nearly empty wave, 1.24-1.31x slower than 2
    splits, and batch 4 and 8 (272 and 544 blocks) 1.50x and 1.78x slower than one pass, whose float32 partials
    cost more than their programs gain. This rule is within 4.3% of each shape's fastest count there (456 rows:
    3 splits, 1.043x of 2's time)."""
    return max(1, min(PREFIX_MAX_SPLITS, WAVE_PROGRAMS // blocks))


def aligned_mask(mask: torch.Tensor) -> torch.Tensor:
    """The mask as uint8 with its rows 16-byte aligned: a (B, Tq, Tk) view of a buffer whose rows hold Tk rounded
    up to 16. Triton specializes an integer argument that is a multiple of 16 and only then proves the mask rows'
    loads aligned and vectorizes them; with 520 keys (two images and an 8-token prompt) the prefix's attention took
    0.72 ms a call against 0.33 ms with 528 (perf-notes, session 30). The prefix's attention aligns its mask here;
    the step's is aligned once a call (loop.SuffixContext.kernel_mask): aligned inside the step kernel's op, the
    copy at every step cost more than the loads gained (0.997x, session 30)."""
    B, Tq, Tk = mask.shape
    if mask.dtype == torch.uint8 and mask.stride(2) == 1 and mask.stride(1) % 16 == 0 and mask.stride(0) % 16 == 0:
        return mask
    padded = torch.empty(B, Tq, -(-Tk // 16) * 16, dtype=torch.uint8, device=mask.device)[..., :Tk]
    padded.copy_(mask)
    return padded


def readable_mask_cols(mask: torch.Tensor) -> int:
    """How many bytes of each row of a (B, Tq, Tk) uint8 mask may be read: its row stride where the rows are padded
    (`aligned_mask`'s buffer, or a view of wider rows) and the storage holds the last row's padding too, else Tk.
    The kernel reads past Tk only to keep its mask loads vectorized (the bound a multiple of 16); those keys are -inf."""
    B, Tq, Tk = mask.shape
    cols = mask.stride(1)
    if mask.stride(2) != 1 or cols <= Tk:
        return Tk
    last_row_end = mask.storage_offset() + (B - 1) * mask.stride(0) + Tq * cols
    return cols if last_row_end <= mask.untyped_storage().nbytes() else Tk


def suffix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     block_m: int = 32, block_n: int = 32, splits: int | None = None,
                     num_warps: int = 4, num_stages: int = 2, token_major: bool = False,
                     block_d: int | None = None, mask_cols: int | None = None) -> torch.Tensor:
    """q (B, N, Tq, h); k, v (B, 1, Tk, h); mask (B, Tq, Tk) bool -> (B, N, Tq, h).
    splits=1: one pass per row block, normalised in place (no partials, no merge launch).
    token_major: the output's memory is (B, Tq, N, h) (a transposed view is returned), so the
    (B, Tq, N * h) the output projection reads is a view, not a copy.
    block_d: head dims per merge program (None: `merge_block_d`; h: one program a row block).
    mask_cols: the mask columns the kernel may read in each row (None: all the row's memory holds, `readable_mask_cols`;
    Tk: exactly the keys, as before session 36)."""
    B, N, Tq, h = q.shape
    Tk = k.shape[2]
    if k.shape[1] != 1 or v.shape[1] != 1:
        raise ValueError(f"suffix_attention needs one shared K/V head, got {k.shape[1]} key and {v.shape[1]} value heads")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("suffix_attention needs the head dim contiguous")
    rows = N * Tq
    row_blocks = triton.cdiv(rows, block_m)
    if splits is None:
        splits = default_splits(Tk, block_n, B * row_blocks)
    splits, keys_per_split = whole_tile_splits(Tk, block_n, splits)
    single = splits == 1
    block_d = merge_block_d(B * row_blocks, h) if block_d is None else block_d
    if block_d < 1 or h % block_d or block_d & (block_d - 1):
        raise ValueError(f"suffix_attention: block_d={block_d}, expected a power of two dividing the head dim {h}")
    acc = torch.empty(1 if single else B * splits * rows * h, dtype=torch.float32, device=q.device)
    m = torch.empty(1 if single else B * splits * rows, dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    if token_major:
        out = torch.empty(B, Tq, N, h, dtype=q.dtype, device=q.device).transpose(1, 2)
    else:
        out = torch.empty(B, N, Tq, h, dtype=q.dtype, device=q.device)
    mask_u8 = mask.to(torch.uint8) if mask.dtype == torch.bool else mask
    readable = readable_mask_cols(mask_u8)
    if mask_cols is None:
        mask_cols = readable
    elif not Tk <= mask_cols <= readable:
        raise ValueError(f"suffix_attention: mask_cols={mask_cols}, expected from Tk={Tk} up to the columns the "
                         f"mask's rows hold ({readable})")
    launch(
        _partial_kernel, (B, row_blocks, splits), q, k, v, mask_u8, acc, m, l_, out, rows, Tq, Tk, mask_cols,
        keys_per_split, h**-0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2),
        mask_u8.stride(0), mask_u8.stride(1), out.stride(0), out.stride(1), out.stride(2),
        MASK_VALUE=ATTENTION_MASK_VALUE, HEAD_DIM=h, BLOCK_M=block_m, BLOCK_N=block_n, SPLITS=splits,
        # float32 operands multiply in full precision, as torch's float32 attention does: Triton's default for them
        # is TF32 (10-bit mantissas), which put a float32 libero-pi0 at 7.9e-4 rel L2 against float32's 1e-4 (session
        # 66, H100). bfloat16 operands take the tensor cores as they are (no precision to choose)
        PRECISION="ieee" if q.dtype == torch.float32 else None,
        num_warps=num_warps, num_stages=num_stages,
    )
    if single:
        return out
    launch(_merge_kernel, (B, row_blocks, h // block_d), acc, m, l_, out, rows, Tq, out.stride(1), out.stride(2),
           out.stride(0), HEAD_DIM=h, BLOCK_M=block_m, BLOCK_D=block_d, SPLITS=splits)
    return out


# Prefix tiles: 64 query rows x 32 keys, the keys split in 3 (partials + the merge kernel):
# 68 row blocks x 3 = 204 programs where one pass gave 68 on the H200's 132 SMs. The fastest
# of 32 tilings (benchmarks/prefix_tiles_ab.py, session 7): 24.0 us a layer against 28.6 for
# session 4's one pass of 64 x 64 tiles (49.8 for SDPA); the whole libero-pi0 call 1.005x
# faster, interleaved in one process (prefix_tiles_ab_libero-pi0.json).
# splits=None since session 36: `prefix_splits` picks them for the shape (still 3 at libero-pi0's 68 blocks).
PREFIX_TILES = dict(block_m=64, block_n=32, splits=None, num_warps=4, num_stages=2)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, **tiles) -> torch.Tensor:
    """The prefix's bidirectional attention over one shared K/V head, heads folded into rows:
    q (B, N, T, h); k, v (B, 1, T, h); mask (B, T, T) bool -> (B, N, T, h), its memory
    token-major (B, T, N, h): the output projection reads it without a transpose copy."""
    tiles = {**PREFIX_TILES, **tiles}
    if tiles["splits"] is None:
        B, N, T, _ = q.shape
        tiles["splits"] = prefix_splits(B * triton.cdiv(N * T, tiles["block_m"]))
    return suffix_attention(q, k, v, aligned_mask(mask), token_major=True, **tiles)
