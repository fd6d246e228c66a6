"""The denoise loop: the suffix (state + noisy actions) through the expert, N Euler steps.

`for_loop` runs Python integers over the precomputed schedule (nothing read on the host);
without it the loop keeps the reference's `while` on a device tensor (one sync per step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.engine.attention import suffix_mask
from vlaperf.engine.fusion import EngineWeights, GemmaLayerW
from vlaperf.engine.layers import gemma_layer, gemma_layer_small_m, modulated, rms_normalize, small_m_layer_applies
from vlaperf.models.pi0 import Pi0Model, rope_cos_sin


class SuffixContext:
    """Per-call tensors of the denoise loop that do not change between steps: the suffix
    mask, RoPE tables, pi0's state token, and the KV cache. Built once per call when
    `hoist` (static_kv_cache) is on; otherwise rebuilt every step as the reference does."""

    def __init__(self, model: Pi0Model, state: Tensor, prefix_pad: Tensor, cache, kv_buffers, hoist: bool):
        self.model, self.state, self.prefix_pad = model, state, prefix_pad
        self.cache, self.kv_buffers, self.hoist = cache, kv_buffers, hoist
        self._kernel_mask = None
        cfg = model.config
        self.suffix_len = cfg.action_horizon + (0 if cfg.pi05 else 1)
        if hoist:
            self._mask, self._cos, self._sin = self._build()
            self._state_tok = None if cfg.pi05 else self._embed_state()

    def _build(self):
        cfg = self.model.config.expert
        pad = self.prefix_pad
        mask = suffix_mask(pad, self.suffix_len, self.model.config.pi05)
        if self.kv_buffers is not None:  # the static cache's alignment padding: keys nobody attends to
            mask = F.pad(mask, (0, self.kv_buffers[0].shape[3] - mask.shape[2]), value=False)
        positions = pad.long().sum(-1, keepdim=True) + torch.arange(self.suffix_len, device=pad.device)[None]
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_base, self.model.dtype)
        return mask, cos, sin

    def mask_rope(self):
        return (self._mask, self._cos, self._sin) if self.hoist else self._build()

    def kernel_mask(self, mask: Tensor | None) -> Tensor | None:
        """This step's `mask` as the attention kernels read it: uint8 in rows padded to 16 bytes
        (suffix_attention.aligned_mask), so Triton can prove the rows' loads aligned (libero-pi0's step
        mask has 600 keys a row). Hoisted, it is made once a call with the mask itself; otherwise once a
        step, as the mask is."""
        if mask is None:
            return None
        from vlaperf.engine.kernels.suffix_attention import aligned_mask

        if not self.hoist:
            return aligned_mask(mask)
        if self._kernel_mask is None:
            self._kernel_mask = aligned_mask(mask)
        return self._kernel_mask

    def _embed_state(self) -> Tensor:
        m = self.model
        return m.state_proj(self.state.to(m.head_dtype))[:, None, :].to(m.dtype)

    def state_token(self) -> Tensor:
        return self._state_tok if self.hoist else self._embed_state()


def head_linear(x: Tensor, weight: Tensor, bias: Tensor | None, kernels: bool, residual: Tensor | None = None) -> Tensor:
    """x (B, T, K) @ weight^T + bias for the step's float32 heads (action in/out, pi0's time
    MLP), or + residual (B, T, N) instead of the bias (the Euler-folded action head). With
    `kernels` and at most 64 rows it is one small_m_matmul launch, the bias as a
    broadcast residual, float32 operands multiplied as three TF32 tensor-core products
    ("tf32x3", within 1e-6 of float32; plain float32 FMA was no faster than cuBLAS; see
    `head_precision` for GPUs without TF32). On the
    H200 these took 2.6 / 8.1 / 6.4 us against cuBLAS's 15.7 / 24.8 / 20.4 us
    (kernel_small_m_heads.json; docs/perf-notes.md, versions 17 and 19)."""
    B, T, K = x.shape
    rows = x.reshape(B * T, K)
    if residual is not None:
        assert bias is None, "head_linear: a residual replaces the bias"
        residual = residual.reshape(B * T, -1)
    if not kernels or B * T > 64:
        if residual is None:
            return F.linear(x, weight, bias)
        return torch.addmm(residual, rows, weight.t()).view(B, T, -1)
    from vlaperf.engine.kernels.ops import small_m_matmul  # a custom op: compile sees through

    if residual is None and bias is not None:
        residual = bias.expand(B * T, -1)
    return small_m_matmul(rows, weight, residual=residual, precision=head_precision(weight)).view(B, T, -1)


def head_precision(weight: Tensor) -> str | None:
    """How small_m_matmul multiplies a head's float32 operands: TF32x3 where the GPU has TF32
    tensor cores (compute capability 8+; the interpreter on a CPU too), else full float32 FMA
    ("ieee"); None for bf16 weights, which always run on tensor cores."""
    if weight.dtype != torch.float32:
        return None
    if weight.device.type == "cuda" and torch.cuda.get_device_capability(weight.device)[0] < 8:
        return "ieee"
    return "tf32x3"


def suffix_tokens(model: Pi0Model, ctx: SuffixContext, x_t: Tensor, t: Tensor, table_row: dict | None,
                  kernels: bool = False):
    """Suffix embeddings (B, Ts, D_e) and the pi0.5 condition (or None).

    With tables (fuse_projections), pi0's action/time MLP input is one matmul plus the
    tabulated time row; pi0.5's norms read tabulated modulations, so no condition is needed.
    `kernels`: those float32 matmuls through `head_linear`'s kernel.
    """
    cfg = model.config
    if table_row is None:
        tokens, _, _, adarms = model.embed_suffix(ctx.state, x_t, t)
        if not cfg.pi05 and ctx.hoist:
            tokens = torch.cat([ctx.state_token(), tokens[:, 1:]], dim=1)
        return tokens, adarms
    x_h = x_t.to(model.head_dtype)
    if cfg.pi05:
        return head_linear(x_h, model.action_in_proj.weight, model.action_in_proj.bias, kernels).to(model.dtype), None
    pre = head_linear(x_h, table_row["action_proj"], table_row["action_time"], kernels)
    mlp_out = model.action_time_mlp_out
    actions = head_linear(F.silu(pre), mlp_out.weight, mlp_out.bias, kernels).to(model.dtype)
    return torch.cat([ctx.state_token(), actions], dim=1), None


def step_kernel_applies(ew: EngineWeights, ctx: SuffixContext, x: Tensor, batched: bool = False,
                        table_row: dict | None = None) -> bool:
    """The `megakernel` step needs the stacked fused weights (one K/V head; for pi0.5 also the
    step's modulation table), the static cache (it reads the prefix keys there), and batch 1
    with at most 64 suffix rows: the kernel takes several samples too (`megakernel=batched`:
    up to 256 rows in all), but at batch 4 that was slower than the layers on the H200
    (docs/perf-notes.md, session 7)."""
    from vlaperf.engine.kernels.expert_step import MAX_ROWS, TUNED_ROWS

    if ew.expert_stack is None or ctx.kv_buffers is None:
        return False
    if ew.expert_stack.adaptive and (table_row is None or "step_kernel_modulation" not in table_row):
        return False
    if batched:
        return x.shape[0] * x.shape[1] <= MAX_ROWS
    return x.shape[0] == 1 and x.shape[1] <= TUNED_ROWS


def step_attention_kernel(lw: GemmaLayerW, kernels: bool, mask: Tensor | None):
    """The attention of a step's torch layers (batches, pi0.5, and pi0 without the step kernel):
    with `kernels` and one shared K/V head, the split-key Triton kernel over the cache
    (kernels/suffix_attention.py, any batch), else None (the folded matmuls of `attention`).
    On the H200 at batch 4 cuBLAS ran those matmuls as an sm75 CUTLASS kernel and a 64 x 64 one,
    ~47 us a layer, in some processes (the cache's 595 keys are not a multiple of 8), and the
    kernel made the call 1.24x faster there (docs/perf-notes.md, session 8)."""
    if not kernels or mask is None or lw.num_kv_heads != 1:
        return None
    from vlaperf.engine.kernels import ops  # custom ops: compile sees through

    return ops.step_attention if STEP_TOKEN_MAJOR else ops.suffix_attention


# The step's attention output written token-major (ops.step_attention), so the output projection
# reads it as a view: no transpose copy (1.3 us a layer at batch 4 on the H200,
# kernel_sequence_b4_best_s20.txt). A switch so benchmarks/change_ab.py can time the call without it.
STEP_TOKEN_MAJOR = True


# The step's RoPE + cache write as one kernel a layer (the layers' path with `triton_kernels` and a
# static cache). A switch so benchmarks/change_ab.py can time the call without it, in one process.
FUSED_STEP_ROPE_CACHE_WRITE = True


def step_rope_cache_kernel(lw: GemmaLayerW, ctx: SuffixContext, attend, layer: int, Tp: int, cos: Tensor, sin: Tensor):
    """qkv -> (RoPE(q), RoPE(k)) with this step's RoPE(k) and v written into layer `layer`'s
    static cache at [Tp, Tp + Ts) by one kernel (kernels/rope_qkv.py, as the prefix does), or
    None. With it, torch.compile sees one declared mutation of the cache; without it, the
    reference's two `copy_` into slices of the cache, which inductor lowered for 8 of the 18
    layers as a copy of the whole cache buffer, ~12-14 us for the keys and again for the values
    at batch 4 on the H200 (benchmarks/results/h200/profiles/kernel_sequence_b4_best_s20.txt).
    Needs the step attention kernel (`attend`), the fused qkv weights and the static cache."""
    if attend is None or ctx.kv_buffers is None or lw.qkv is None or not FUSED_STEP_ROPE_CACHE_WRITE:
        return None
    from vlaperf.engine.kernels.ops import rope_qkv  # a custom op: compile sees through

    kv_layer = (ctx.kv_buffers[0][layer : layer + 1], ctx.kv_buffers[1][layer : layer + 1])
    return lambda qkv: rope_qkv(qkv, cos, sin, kv_layer[0], kv_layer[1], 0, Tp, lw.num_heads, lw.num_kv_heads, True)


def denoise_step(
    model: Pi0Model, ew: EngineWeights, ctx: SuffixContext, x_t: Tensor, t: Tensor, table_row: dict | None, use_sdpa: bool,
    kernels: bool = False, megakernel: bool = False, euler: bool = False,
) -> Tensor:
    """Velocity (B, H, A) float32 at x_t, or with `euler` (the table row's euler_proj / euler_bias,
    fusion.euler_tables) the next x_t = x_t + dt v. `kernels`: the triton_kernels layers where
    they apply; `megakernel`: all expert layers in one kernel where it applies (else the layers)."""
    cfg = model.config
    eps = cfg.expert.eps
    x, adarms = suffix_tokens(model, ctx, x_t, t, table_row, kernels)
    mask, cos, sin = ctx.mask_rope()
    mods = table_row.get("modulation") if table_row else None  # (depth*6 + 2, D) for pi0.5
    Ts = x.shape[1]
    Tp = ctx.prefix_pad.shape[1]  # this step's keys sit at [Tp, Tp + Ts) of a static cache (padding after)
    # the attention kernels read the mask as aligned bytes: cast once a call (or a step), not inside each layer's op
    kernel_mask = ctx.kernel_mask(mask) if kernels or megakernel else mask
    batched = megakernel == "batched" and x.shape[0] > 1
    if megakernel and step_kernel_applies(ew, ctx, x, batched, table_row):
        from vlaperf.engine.kernels.ops import expert_step  # a custom op: compile sees through

        st, (kb, vb) = ew.expert_stack, ctx.kv_buffers
        T = Tp + Ts  # the kernel reads this step's keys from its own scratch: no padding
        step_mod = table_row["step_kernel_modulation"] if st.adaptive else None  # pi0.5's norms for this step
        x = x.contiguous()  # the op updates it in place (the tokens just built: no copy)
        if batched:  # (B, Ts, D) with the cache's batch axis: all samples in one launch
            expert_step(x, st.qkv, st.o, st.gate_up, st.down, kb[:, :, 0, :T], vb[:, :, 0, :T], cos, sin,
                        kernel_mask[..., :T], eps, step_mod)
        else:
            expert_step(x[0], st.qkv, st.o, st.gate_up, st.down, kb[:, 0, 0, :T], vb[:, 0, 0, :T], cos[0], sin[0],
                        kernel_mask[0, :, :T], eps, step_mod)
    else:
        for i, lw in enumerate(ew.expert):
            mod = mods[6 * i : 6 * i + 6] if mods is not None else None
            if ctx.kv_buffers is not None:
                kb, vb = ctx.kv_buffers[0][i], ctx.kv_buffers[1][i]
                cache = dict(kv_write=(kb[:, :, Tp : Tp + Ts], vb[:, :, Tp : Tp + Ts]), kv_past=(kb, vb))
            else:
                cache = dict(kv_past=ctx.cache[i])
            if kernels and small_m_layer_applies(lw, x.shape[0] * Ts):
                x, _ = gemma_layer_small_m(lw, x, eps, cos, sin, kernel_mask, use_sdpa, **cache)
            else:
                attend = step_attention_kernel(lw, kernels, mask)
                rope = step_rope_cache_kernel(lw, ctx, attend, i, Tp, cos, sin)
                if rope is not None:  # the kernel writes this step's keys: no copies into the cache
                    cache.pop("kv_write")
                x, _ = gemma_layer(lw, x, eps, cos, sin, kernel_mask if attend else mask, use_sdpa, mod=mod,
                                   ada_cond=adarms, attend=attend, rope_qkv=rope, **cache)
    if mods is not None:
        x = modulated(x, eps, mods[-2], mods[-1])
    elif cfg.pi05:
        x, _ = ew.expert_final(x, adarms)
    else:
        x = rms_normalize(x, eps, 1.0 + ew.expert_final.weight.float())
    H = x_t.shape[1]
    head = model.action_out_proj
    y = x[:, -H:].to(head.weight.dtype)
    if euler:
        return head_linear(y, table_row["euler_proj"], None, kernels, residual=x_t + table_row["euler_bias"])
    return head_linear(y, head.weight, head.bias, kernels).float()
