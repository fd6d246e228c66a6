"""The engine's own view of the weights: plain or fused, never the reference modules mutated.

Without `fuse_projections` every tensor here is the reference model's parameter itself (a
view, no copy). With it, the engine builds new tensors:
  - q/k/v concatenated into one matrix, gate/up into one (fewer, fatter matmuls);
  - Gemma RMSNorm scales (1 + w) folded into the columns of the linear that follows
    (W @ (n * s) == (W * s) @ n), so the norm is a plain normalisation;
  - time conditioning tabulated for the fixed schedule (see `time_tables`).
Folding happens in float32 and is rounded once to the model dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.models.pi0 import AdaptiveRMSNorm, GemmaLayer, Pi0Model, RMSNorm, SiglipLayer


@dataclass
class GemmaLayerW:
    """One Gemma layer. A norm is `None` where its scale was folded or it is adaptive."""

    in_scale: Tensor | None  # (D,) float32, the (1 + w) of the input RMSNorm
    qkv: Tensor | None  # fused (N*h + 2*K*h, D), or None
    q: Tensor | None
    k: Tensor | None
    v: Tensor | None
    o: Tensor
    post_scale: Tensor | None
    gate_up: Tensor | None  # fused (2*F, D), or None
    gate: Tensor | None
    up: Tensor | None
    down: Tensor
    ada_in: tuple[Tensor, Tensor] | None  # pi0.5 adaRMS dense (weight, bias) if not tabulated
    ada_post: tuple[Tensor, Tensor] | None
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass
class SiglipLayerW:
    ln1: tuple[Tensor, Tensor]
    qkv: tuple[Tensor, Tensor] | None  # fused (3D, D) weight and bias, or None
    q: tuple[Tensor, Tensor] | None
    k: tuple[Tensor, Tensor] | None
    v: tuple[Tensor, Tensor] | None
    out: tuple[Tensor, Tensor]
    ln2: tuple[Tensor, Tensor]
    fc1: tuple[Tensor, Tensor]
    fc2: tuple[Tensor, Tensor]
    num_heads: int
    # fc1 and its GELU(tanh) as one GEMM with the activation in its epilogue (fused weights, on
    # CUDA only: there `_addmm_activation` is cuBLASLt's tanh GELU, on the CPU it is the erf one)
    gelu_epilogue: bool = False
    # fc2 through cuBLASLt's heuristic's first algorithm at a 32 MiB workspace limit (kernels/cublaslt.py), which
    # torch's own limit does not get: 13.3 against 15.4-16.0 us a layer on the H200 (fused bf16 weights on CUDA)
    fc2_lt: bool = False


def _wb(linear) -> tuple[Tensor, Tensor]:
    return linear.weight, linear.bias


def siglip_layer_weights(layer: SiglipLayer, fuse: bool) -> SiglipLayerW:
    a = layer.self_attn
    if fuse:
        qkv = (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        q = k = v = None
    else:
        qkv, q, k, v = None, _wb(a.q_proj), _wb(a.k_proj), _wb(a.v_proj)
    return SiglipLayerW(
        ln1=_wb(layer.layer_norm1), qkv=qkv, q=q, k=k, v=v, out=_wb(a.out_proj),
        ln2=_wb(layer.layer_norm2), fc1=_wb(layer.mlp.fc1), fc2=_wb(layer.mlp.fc2), num_heads=a.num_heads,
        gelu_epilogue=fuse and layer.mlp.fc1.weight.is_cuda,
        fc2_lt=fuse and layer.mlp.fc2.weight.is_cuda and layer.mlp.fc2.weight.dtype == torch.bfloat16,
    )


def _fold(weight: Tensor, scale: Tensor) -> Tensor:
    return (weight.float() * scale[None, :]).to(weight.dtype)


def gemma_layer_weights(layer: GemmaLayer, fuse: bool) -> GemmaLayerW:
    a, m = layer.self_attn, layer.mlp
    adaptive = isinstance(layer.input_layernorm, AdaptiveRMSNorm)
    in_scale = None if adaptive else 1.0 + layer.input_layernorm.weight.float()
    post_scale = None if adaptive else 1.0 + layer.post_attention_layernorm.weight.float()
    ada_in = None if not adaptive else _wb(layer.input_layernorm.dense)
    ada_post = None if not adaptive else _wb(layer.post_attention_layernorm.dense)
    common = dict(o=a.o_proj.weight, down=m.down_proj.weight, ada_in=ada_in, ada_post=ada_post,
                  num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim)
    if not fuse:
        return GemmaLayerW(in_scale=in_scale, qkv=None, q=a.q_proj.weight, k=a.k_proj.weight, v=a.v_proj.weight,
                           post_scale=post_scale, gate_up=None, gate=m.gate_proj.weight, up=m.up_proj.weight, **common)
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight])
    if not adaptive:
        qkv, gate_up = _fold(qkv, in_scale), _fold(gate_up, post_scale)
    return GemmaLayerW(in_scale=None, qkv=qkv, q=None, k=None, v=None, post_scale=None, gate_up=gate_up,
                       gate=None, up=None, **common)


@dataclass
class ExpertStack:
    """The expert's fused weights stacked over layers, (L, ...) each, for the step kernel
    (`megakernel`), which walks the layers by pointer offset within one launch."""

    qkv: Tensor  # (L, N*h + 2*K*h, D), input RMSNorm scale folded (pi0)
    o: Tensor  # (L, D, N*h)
    gate_up: Tensor  # (L, 2F, D), post-attention RMSNorm scale folded (pi0)
    down: Tensor  # (L, D, F)
    # pi0.5: adaptive norms, nothing folded; each step passes the kernel its modulation
    # (`step_kernel_modulation`, tabulated with the schedule's other time tables)
    adaptive: bool = False


@dataclass
class EngineWeights:
    patch: tuple[Tensor, Tensor] | None  # SigLIP's patch conv as a (D, 3*p*p) matrix and bias (fused)
    vision: list[SiglipLayerW]
    backbone: list[GemmaLayerW]  # its final norm is never needed: the actions read only its K/V
    expert: list[GemmaLayerW]
    expert_final: RMSNorm | AdaptiveRMSNorm
    fused: bool
    expert_stack: ExpertStack | None = None
    # the patch matmul in TF32 (float32 operands rounded to 10-bit mantissas on the tensor cores): only for models
    # that compute in bf16, whose next step rounds the embeddings to bf16's 7 bits anyway; float32 models stay exact
    patch_tf32: bool = False


def stack_expert(ew: EngineWeights) -> ExpertStack | None:
    """Stack the fused expert weights for the step kernel, or None where it cannot apply
    (unfused weights, more than one K/V head). pi0.5's adaptive norms apply through a table
    per step (`step_kernel_modulation`). Every layer's weights become views into the stack,
    so the engine holds each once; o and down are then copies of the model's parameters
    (226 MB for pi0, freed by `release_reference_copies`)."""
    if not ew.fused or any(lw.qkv is None or lw.num_kv_heads != 1 for lw in ew.expert):
        return None
    with torch.no_grad():
        stack = ExpertStack(*(torch.stack([getattr(lw, n) for lw in ew.expert]) for n in ("qkv", "o", "gate_up", "down")),
                            adaptive=ew.expert[0].ada_in is not None)
    for i, lw in enumerate(ew.expert):
        lw.qkv, lw.o, lw.gate_up, lw.down = stack.qkv[i], stack.o[i], stack.gate_up[i], stack.down[i]
    return stack


def release_reference_copies(model: Pi0Model, ew: EngineWeights) -> int:
    """Free the model's parameters that the engine holds its own copies of (fused q/k/v and
    gate/up, the expert's stacked o/down), for a process that runs the engine only; returns
    the bytes freed. Everything the engine reads from the model itself stays. The model's
    reference path cannot run afterwards (`Pi0Model.sample_actions` refuses, saying why)."""
    params = []
    for layer, lw in zip(model.vision.encoder.layers, ew.vision):
        if lw.qkv is not None:
            a = layer.self_attn
            params += [p for linear in (a.q_proj, a.k_proj, a.v_proj) for p in (linear.weight, linear.bias)]
    for layers, lws in ((model.backbone.layers, ew.backbone), (model.expert.layers, ew.expert)):
        for layer, lw in zip(layers, lws):
            a, m = layer.self_attn, layer.mlp
            if lw.qkv is not None:
                params += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
            if lw.gate_up is not None:
                params += [m.gate_proj.weight, m.up_proj.weight]
            params += [p for p, held in ((a.o_proj.weight, lw.o), (m.down_proj.weight, lw.down)) if held is not p]
    freed = 0
    for p in params:
        freed += p.numel() * p.element_size()
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    if params:
        model.reference_released = True
        model.released_parameters |= {id(p) for p in params}  # another engine that reads one of them refuses to run
    return freed


def held_tensors(x) -> Iterator[Tensor]:
    """Every tensor an engine's weights hold (EngineWeights: dataclasses, lists, tuples, modules' parameters)."""
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, torch.nn.Module):
        yield from x.parameters()
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from held_tensors(getattr(x, f.name))
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from held_tensors(item)


def build_weights(model: Pi0Model, fuse: bool) -> EngineWeights:
    with torch.no_grad():
        conv = model.vision.embeddings.patch_embedding
        return EngineWeights(
            patch=(conv.weight.flatten(1), conv.bias) if fuse else None,
            vision=[siglip_layer_weights(l, fuse) for l in model.vision.encoder.layers],
            backbone=[gemma_layer_weights(l, fuse) for l in model.backbone.layers],
            expert=[gemma_layer_weights(l, fuse) for l in model.expert.layers],
            expert_final=model.expert.norm,
            fused=fuse,
            patch_tf32=fuse and model.dtype != torch.float32,
        )


# ------------------------------------------------------------------ time tables


def schedule(num_steps: int) -> list[float]:
    """The times t_i the reference visits: float32 1.0 plus dt, num_steps times, accumulated
    in float32 exactly as the reference's device tensor is (so the tables match bit for bit)."""
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32)
    t = torch.tensor(1.0, dtype=torch.float32)
    out = []
    for _ in range(num_steps):
        out.append(t.item())
        t = t + dt
    return out


@torch.no_grad()
def step_kernel_modulation(tables: dict[str, Tensor], stack: ExpertStack) -> Tensor:
    """pi0.5's `modulation` table in the step kernel's layout: (steps, L, 4D + QKV + 2F)
    float32 (kernels/expert_step.modulation_table): the scales and gates as they are, the
    shifts pushed through the weights they feed (shift @ W^T), once per schedule."""
    from vlaperf.engine.kernels.expert_step import modulation_table

    return modulation_table(tables["modulation"], stack.qkv, stack.gate_up)


@torch.no_grad()
def time_tables(model: Pi0Model, num_steps: int, device) -> dict[str, Tensor]:
    """Everything that depends on the step's time alone, for the fixed schedule.

    pi0:  `action_time` (steps, D_e): W_t @ emb(t_i) + b of action_time_mlp_in, plus the
          action_in_proj bias pushed through W_a; `action_proj` (D_e, A): W_a @ W_in, so one
          small matmul maps x_t straight to the MLP's pre-activation.
    pi0.5: `modulation` (steps, depth*6 + 2, D_e): every adaptive norm's scale/shift/gate.
    Both: the Euler update folded into the action head (`euler_tables`).
    Tables without a steps axis are named in SCHEDULE_TABLES.
    """
    return {**_time_tables(model, num_steps, device), **euler_tables(model, num_steps)}


# time_tables entries shared by every step (no leading steps axis)
SCHEDULE_TABLES = ("action_proj", "euler_proj", "euler_bias")


def euler_tables(model: Pi0Model, num_steps: int) -> dict[str, Tensor]:
    """x_t + dt (y W^T + b) = y (dt W)^T + (x_t + dt b), with the schedule's float32 dt: the
    action head returns the next x_t, so the update is no kernel of its own (two eager
    kernels a step before, ~3 us on an H200). `euler_proj` (A, D_e) = dt W, `euler_bias`
    (A,) = dt b. Only for a float32 head (openpi's): x_t stays float32 through the sum, where a
    bf16 head's output would round it."""
    head = model.action_out_proj
    if head.weight.dtype != torch.float32:
        return {}
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32).item()  # the reference's float32 dt
    return {"euler_proj": head.weight * dt, "euler_bias": head.bias * dt}


def _time_tables(model: Pi0Model, num_steps: int, device) -> dict[str, Tensor]:
    cfg = model.config
    ts = torch.tensor(schedule(num_steps), dtype=torch.float32, device=device)
    temb = model.time_condition(ts)  # (steps, D_e), heads' dtype, as the reference rounds it
    if not cfg.pi05:
        D = cfg.expert.width
        w_in = model.action_time_mlp_in.weight.float()  # (D, 2D) acting on [action, time]
        w_a, w_t = w_in[:, :D], w_in[:, D:]
        b = model.action_time_mlp_in.bias.float()
        p_w, p_b = model.action_in_proj.weight.float(), model.action_in_proj.bias.float()
        action_time = temb.float() @ w_t.T + b + p_b @ w_a.T
        # Kept in the heads' dtype (float32 in openpi), like the layers they replace.
        return {"action_time": action_time.to(model.head_dtype), "action_proj": (w_a @ p_w).to(model.head_dtype)}
    cond = F.silu(model.time_mlp_out(F.silu(model.time_mlp_in(temb))))  # (steps, D)
    mods = []
    for layer in model.expert.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            mods.append(norm.dense(cond).view(num_steps, 3, -1))  # scale, shift, gate
    final = model.expert.norm.dense(cond).view(num_steps, 3, -1)[:, :2]
    return {"modulation": torch.cat(mods + [final], dim=1)}  # (steps, depth*6 + 2, D)
