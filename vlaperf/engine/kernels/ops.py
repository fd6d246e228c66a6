"""The Triton kernels as PyTorch custom operators, so `triton_kernels` composes with `compile`.

torch.compile sees `torch.ops.vlaperf.small_m_matmul`, `torch.ops.vlaperf.suffix_attention`,
`torch.ops.vlaperf.prefix_attention`, `torch.ops.vlaperf.rope_qkv` (which writes the static
cache in place: a declared mutation) and `torch.ops.vlaperf.expert_step` (the `megakernel`
lever) as opaque calls with known output shapes (the fake implementations below): no graph
break, and inductor still fuses the elementwise work between them (norms, residuals, casts).
In eager (and inside the engine's CUDA graph) they dispatch straight to the launchers.
`torch.ops.vlaperf.lt_linear` is the one that is no Triton kernel: a cuBLASLt GEMM with an algorithm
of our choosing (kernels/cublaslt.py, SigLIP's fc2).

The implementations look the launchers up on their modules at call time, so a test that
wraps `small_m_matmul.small_m_matmul` to count calls sees these calls too.
"""

from __future__ import annotations

import contextlib

import torch

from vlaperf.engine.kernels import cublaslt as _cublaslt_module
from vlaperf.engine.kernels import expert_step as _step_module
from vlaperf.engine.kernels import rope_qkv as _rope_module
from vlaperf.engine.kernels import small_m_matmul as _matmul_module
from vlaperf.engine.kernels import suffix_attention as _attention_module


@contextlib.contextmanager
def _explain_resource_errors(kernel: str, lever: str = "triton_kernels", dtype: torch.dtype | None = None):
    """Triton's OutOfResources (tiles that do not fit this GPU's shared memory or registers)
    becomes a LeverError that names the lever and the way out. `dtype`: the model's, where a
    float32 model is the likelier cause than the GPU (its tiles take twice the bytes). It is named
    as the cause only where the bytes asked for in bfloat16 would fit (Triton's error says what
    was asked for and what the GPU has): on a GPU of 99 KiB a block the step kernel's bfloat16
    tiles (144 KiB at libero-pi0's 51 rows) do not fit either, and bfloat16 is no way out."""
    try:
        yield
    except Exception as e:
        if type(e).__name__ != "OutOfResources":
            raise
        from vlaperf.engine.levers import LeverError

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "this device"
        wide = dtype is not None and dtype.itemsize > 2
        need, limit = getattr(e, "required", None), getattr(e, "limit", None)
        if wide and isinstance(need, int) and isinstance(limit, int):
            wide = getattr(e, "name", None) == "shared memory" and need * 2 // dtype.itemsize <= limit
        if wide:
            raise LeverError(f"{lever}: the {kernel} kernel does not fit {gpu} in {str(dtype).replace('torch.', '')} "
                             f"({e}); its tiles are sized for bfloat16 weights on an H200 (Hopper). Run in bfloat16, "
                             "or without the lever (`best` leaves it out for a float32 model)") from e
        raise LeverError(f"{lever}: the {kernel} kernel does not fit {gpu} ({e}); its tiles are tuned for an "
                         "H200 (Hopper). Run without the lever (e.g. --levers graph, or best on a non-Hopper GPU)") from e


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("vlaperf::lt_linear", mutates_args=())
def lt_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """See kernels/cublaslt.py: F.linear(x, w, b) with cuBLASLt's algorithm chosen for the shape (F.linear off CUDA)."""
    return _cublaslt_module.linear(x, w, b)


@lt_linear.register_fake
def _(x, w, b):
    return x.new_empty(*x.shape[:-1], w.shape[0])


@torch.library.custom_op("vlaperf::small_m_matmul", mutates_args=())
def small_m_matmul(x: torch.Tensor, w: torch.Tensor, w_up: torch.Tensor | None = None, rms_eps: float | None = None,
                   residual: torch.Tensor | None = None, gate: torch.Tensor | None = None,
                   precision: str | None = None) -> torch.Tensor:
    """See kernels/small_m_matmul.py: y = epilogue(prologue(x) @ w^T), x (M <= 64, K), w (N, K)."""
    # the kernel indexes rows by stride and columns as unit-stride
    residual = None if residual is None else _unit_stride(residual)
    # a float32 head (precision given) is float32 in a bfloat16 model too: its dtype is not the model's
    with _explain_resource_errors("small_m_matmul", dtype=x.dtype if precision is None else None):
        return _matmul_module.small_m_matmul(_unit_stride(x), w, w_up=w_up, rms_eps=rms_eps, residual=residual, gate=gate,
                                             precision=precision)


@small_m_matmul.register_fake
def _(x, w, w_up=None, rms_eps=None, residual=None, gate=None, precision=None):
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op("vlaperf::suffix_attention", mutates_args=())
def suffix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """See kernels/suffix_attention.py: q (B, N, Tq, h) over one shared K/V head -> (B, N, Tq, h)."""
    with _explain_resource_errors("suffix_attention", dtype=q.dtype):
        return _attention_module.suffix_attention(_unit_stride(q), _unit_stride(k), _unit_stride(v), mask)


@suffix_attention.register_fake
def _(q, k, v, mask):
    return q.new_empty(q.shape)


# A second op, not a flag of the first: the output's layout is then part of the traced graph's
# code, so no compile cache can hand one layout's compiled graph to the other (inductor's FX
# graph cache keys on the graph, not on what a fake implementation returns)
@torch.library.custom_op("vlaperf::step_attention", mutates_args=())
def step_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """suffix_attention with its output's memory token-major (B, Tq, N, h): the (B, Tq, N * h)
    that the output projection reads is a view, not a transpose copy."""
    with _explain_resource_errors("suffix_attention", dtype=q.dtype):
        return _attention_module.suffix_attention(_unit_stride(q), _unit_stride(k), _unit_stride(v), mask, token_major=True)


@step_attention.register_fake
def _(q, k, v, mask):
    B, N, T, h = q.shape
    return q.new_empty(B, T, N, h).transpose(1, 2)


@torch.library.custom_op("vlaperf::prefix_attention", mutates_args=())
def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """See kernels/suffix_attention.py: the prefix's attention, one pass per 64 folded query rows."""
    with _explain_resource_errors("prefix_attention", dtype=q.dtype):
        return _attention_module.prefix_attention(_unit_stride(q), _unit_stride(k), _unit_stride(v), mask)


@prefix_attention.register_fake
def _(q, k, v, mask):
    B, N, T, h = q.shape
    return q.new_empty(B, T, N, h).transpose(1, 2)  # token-major memory, as the kernel writes it


@torch.library.custom_op("vlaperf::rope_qkv", mutates_args=("k_cache", "v_cache"))
def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             layer: int, start: int, num_heads: int, num_kv_heads: int, write_q: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """See kernels/rope_qkv.py: RoPE(q), RoPE(k) from the fused projection; RoPE(k), v into the caches."""
    with _explain_resource_errors("rope_qkv", dtype=qkv.dtype):
        return _rope_module.rope_qkv(_unit_stride(qkv), cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads,
                                     write_q=write_q)


@rope_qkv.register_fake
def _(qkv, cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads, write_q=True):
    B, T, C = qkv.shape
    h = C // (num_heads + 2 * num_kv_heads)
    return qkv.new_empty(B, num_heads if write_q else 0, T, h), qkv.new_empty(B, num_kv_heads, T, h)


@torch.library.custom_op("vlaperf::expert_step", mutates_args=("x",))
def expert_step(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                eps: float, mod: torch.Tensor | None = None) -> None:
    """See kernels/expert_step.py: the suffix x (M, D), contiguous, through every expert layer
    in one kernel, in place (`mod`: pi0.5's adaptive norms for this step,
    expert_step.modulation_table). In place, so that the step's input is not copied: the
    engine hands it the tokens it has just built (inductor reuses that buffer)."""
    with _explain_resource_errors("expert_step", "megakernel", wqkv.dtype):
        _step_module.expert_step(x, wqkv, wo, wgu, wd, k_cache, v_cache, cos, sin, mask, eps, mod=mod, in_place=True)


@expert_step.register_fake
def _(x, wqkv, wo, wgu, wd, k_cache, v_cache, cos, sin, mask, eps, mod=None):
    return None
