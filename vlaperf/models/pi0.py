"""The pi0 family (pi0, pi0.5, Shallow-pi) in plain PyTorch, and its reference sampler.

One file, read top to bottom: config + presets, the SigLIP vision tower, Gemma blocks,
the joint backbone/expert attention, and `sample_actions`, which computes what openpi's
PyTorch `PI0Pytorch.sample_actions` computes. Every speed lever in `vlaperf.engine` is
checked against this file; nothing here knows about the engine.

Module and parameter names follow openpi's `PI0Pytorch.state_dict()` one to one, so an
openpi `model.safetensors` loads with `strict=True` (see `vlaperf.checkpoints`).

Axis letters used in shape comments:
    B batch            S image slots        P patches (tokens) per image
    L prompt tokens    T tokens in a stream (prefix or suffix)
    H action horizon   A action dim (padded, 32)
    D width            N query heads        K key/value heads    h head dim
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# openpi fills masked attention logits with this value (close to -max(bfloat16)) rather
# than -inf, so a fully masked row stays finite; we use the same for identical softmax.
ATTENTION_MASK_VALUE = -2.3819763e38


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class VisionConfig:
    width: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    patch_size: int = 14
    image_size: int = 224
    eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class GemmaConfig:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    eps: float = 1e-6
    rope_base: float = 10_000.0


GEMMA_2B = GemmaConfig(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256, vocab_size=257152)
GEMMA_300M = GemmaConfig(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256, vocab_size=257152)


@dataclass(frozen=True)
class Pi0Config:
    name: str
    vision: VisionConfig = field(default_factory=VisionConfig)
    backbone: GemmaConfig = GEMMA_2B
    expert: GemmaConfig = GEMMA_300M
    pi05: bool = False  # adaptive RMSNorm time conditioning in the expert; state in the prompt
    action_dim: int = 32  # padded action dim (and padded state dim for pi0)
    action_horizon: int = 50
    max_token_len: int = 48
    # openpi's state dict also holds heads that inference never uses (the PaliGemma LM head,
    # the expert's LM head); they are kept so checkpoints load strictly, but sit on no path.
    unused_heads: bool = True

    def __post_init__(self):
        b, e = self.backbone, self.expert
        if (b.num_heads, b.num_kv_heads, b.head_dim, b.depth) != (e.num_heads, e.num_kv_heads, e.head_dim, e.depth):
            raise ValueError(
                "backbone and expert share attention per layer: heads, kv heads, head dim and depth must match, "
                f"got backbone {(b.num_heads, b.num_kv_heads, b.head_dim, b.depth)} vs expert "
                f"{(e.num_heads, e.num_kv_heads, e.head_dim, e.depth)}"
            )


def _tiny() -> Pi0Config:
    vision = VisionConfig(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=14, image_size=56)
    backbone = GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16, vocab_size=1024)
    expert = replace(backbone, width=32, mlp_dim=64)
    return Pi0Config("tiny", vision, backbone, expert, action_dim=8, action_horizon=10, max_token_len=16)


PRESETS: dict[str, Pi0Config] = {
    "pi0": Pi0Config("pi0"),
    "pi05": Pi0Config("pi05", pi05=True, action_horizon=10, max_token_len=200),
    "shallow6": Pi0Config("shallow6", backbone=replace(GEMMA_2B, depth=6), expert=replace(GEMMA_300M, depth=6)),
    "tiny": _tiny(),
}


def get_config(preset: str, **overrides) -> Pi0Config:
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; expected one of: {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **overrides) if overrides else PRESETS[preset]


# ----------------------------------------------------------------------- small parts


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype), None


class AdaptiveRMSNorm(nn.Module):
    """pi0.5's time-conditioned RMSNorm: scale, shift and a residual gate from `cond`.

    The same (normed, gate) interface as RMSNorm; the gate multiplies the branch output
    before it is added to the residual stream.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)  # -> (scale, shift, gate)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        assert cond is not None, "AdaptiveRMSNorm needs the time condition"
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        mod = self.dense(cond.to(self.dense.weight.dtype))[:, None, :].float()  # (B, 1, 3D)
        scale, shift, gate = mod.chunk(3, dim=-1)
        return (normed * (1.0 + scale) + shift).to(x.dtype), gate.to(x.dtype)


def make_norm(dim: int, eps: float, cond_dim: int | None) -> nn.Module:
    return AdaptiveRMSNorm(dim, cond_dim, eps) if cond_dim else RMSNorm(dim, eps)


def gated_residual(residual: Tensor, branch: Tensor, gate: Tensor | None) -> Tensor:
    return residual + branch if gate is None else residual + branch * gate


def rope_cos_sin(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Rotary tables for integer positions (B, T) -> cos, sin of shape (B, T, h)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq  # (B, T, h/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, h)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, heads, T, h); rotate-half convention (first half paired with second half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> Tensor:
    """Flow-matching time t (B,) -> (B, dim) as [sin, cos] over geometric periods, in float64
    where the device supports it (openpi does the same, so the embedding is exact)."""
    dtype = torch.float64 if t.device.type != "mps" else torch.float32
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.to(dtype)[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def make_attention_mask_2d(pad_mask: Tensor, att_mask: Tensor) -> Tensor:
    """openpi's prefix-LM rule. pad_mask, att_mask: (B, T) bool.

    att_mask[i] = True starts a new causal block: token j may attend to token k iff
    cumsum(att)[k] <= cumsum(att)[j], and both tokens are valid (pad_mask).
    Returns (B, T, T) bool, True = may attend.
    """
    blocks = torch.cumsum(att_mask.long(), dim=1)
    allowed = blocks[:, None, :] <= blocks[:, :, None]
    valid = pad_mask[:, None, :] & pad_mask[:, :, None]
    return allowed & valid


# ------------------------------------------------------------------------- SigLIP


class SiglipAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = (q @ k.transpose(-1, -2)) * (D // self.num_heads) ** -0.5
        out = scores.float().softmax(-1).to(v.dtype) @ v  # (B, N, T, h)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D))


class SiglipMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipLayer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.self_attn = SiglipAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.mlp = SiglipMLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.num_patches, cfg.width)

    def forward(self, images: Tensor) -> Tensor:
        # images: (B, 3, 224, 224) in [-1, 1] -> (B, P, D). openpi keeps the patch and position
        # embeddings in float32 and casts to the encoder's dtype afterwards.
        x = self.patch_embedding(images.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.depth))


class SiglipVisionModel(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg)
        self.encoder = SiglipEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.eps)

    def forward(self, images: Tensor) -> Tensor:
        x = self.embeddings(images).to(self.post_layernorm.weight.dtype)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.vision_model = SiglipVisionModel(cfg)


class Projector(nn.Module):
    def __init__(self, vision_width: int, width: int):
        super().__init__()
        self.linear = nn.Linear(vision_width, width)


# -------------------------------------------------------------------------- Gemma


class GemmaAttentionWeights(nn.Module):
    """Projection weights only: the attention itself is computed jointly over both streams."""

    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)


class GemmaMLP(nn.Module):
    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.width, cfg.mlp_dim, bias=False)
        self.up_proj = nn.Linear(cfg.width, cfg.mlp_dim, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_dim, cfg.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, cond_dim: int | None = None):
        super().__init__()
        self.input_layernorm = make_norm(cfg.width, cfg.eps, cond_dim)
        self.self_attn = GemmaAttentionWeights(cfg)
        self.post_attention_layernorm = make_norm(cfg.width, cfg.eps, cond_dim)
        self.mlp = GemmaMLP(cfg)


class GemmaModel(nn.Module):
    def __init__(self, cfg: GemmaConfig, with_embedding: bool, cond_dim: int | None = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.width) if with_embedding else None
        self.layers = nn.ModuleList(GemmaLayer(cfg, cond_dim) for _ in range(cfg.depth))
        self.norm = make_norm(cfg.width, cfg.eps, cond_dim)


class PaliGemmaInner(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.vision_tower = VisionTower(cfg.vision)
        self.multi_modal_projector = Projector(cfg.vision.width, cfg.backbone.width)
        self.language_model = GemmaModel(cfg.backbone, with_embedding=True)


class PaliGemma(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.model = PaliGemmaInner(cfg)
        if cfg.unused_heads:
            # Tied to the token embedding (one tensor, two names), as in PaliGemma.
            self.lm_head = nn.Linear(cfg.backbone.width, cfg.backbone.vocab_size, bias=False)
            self.lm_head.weight = self.model.language_model.embed_tokens.weight


class GemmaExpert(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        cond_dim = cfg.expert.width if cfg.pi05 else None
        self.model = GemmaModel(cfg.expert, with_embedding=False, cond_dim=cond_dim)
        if cfg.unused_heads:
            self.lm_head = nn.Linear(cfg.expert.width, cfg.expert.vocab_size, bias=False)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.paligemma = PaliGemma(cfg)
        self.gemma_expert = GemmaExpert(cfg)


# ---------------------------------------------------------------- joint attention


def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Reference attention. q: (B, N, Tq, h); k, v: (B, K, Tk, h); mask: (B, Tq, Tk) bool.

    Key/value heads are repeated to the query heads (grouped-query attention); logits are
    masked with openpi's large negative value and soft-maxed in float32.
    """
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = torch.where(mask[:, None], scores, ATTENTION_MASK_VALUE)
    return scores.softmax(-1).to(v.dtype) @ v


def joint_layer(
    layers: list[GemmaLayer],
    xs: list[Tensor | None],
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
    conds: list[Tensor | None],
    past_kv: tuple[Tensor, Tensor] | None = None,
) -> tuple[list[Tensor | None], tuple[Tensor, Tensor]]:
    """One transformer layer over several token streams that attend to each other.

    Stream i (prefix -> backbone weights, suffix -> expert weights) is projected with its
    own weights; queries, keys and values are concatenated along the token axis, attention
    is computed once over all of them (plus `past_kv`, the cached prefix), and each stream's
    output goes back through its own o_proj and MLP.
    Returns the new streams and this call's (k, v) (after RoPE), for the prefix KV cache.
    """
    qs, ks, vs, gates, lens = [], [], [], [], []
    for layer, x, cond in zip(layers, xs, conds):
        if x is None:
            continue
        B, T, _ = x.shape
        attn = layer.self_attn
        h, gate = layer.input_layernorm(x, cond)
        qs.append(attn.q_proj(h).view(B, T, attn.num_heads, attn.head_dim).transpose(1, 2))  # (B, N, T, h)
        ks.append(attn.k_proj(h).view(B, T, attn.num_kv_heads, attn.head_dim).transpose(1, 2))  # (B, K, T, h)
        vs.append(attn.v_proj(h).view(B, T, attn.num_kv_heads, attn.head_dim).transpose(1, 2))
        gates.append(gate)
        lens.append(T)
    q = apply_rope(torch.cat(qs, dim=2), cos, sin)
    k = apply_rope(torch.cat(ks, dim=2), cos, sin)
    v = torch.cat(vs, dim=2)
    new_kv = (k, v)
    if past_kv is not None:
        # The reference concatenates the cached prefix to the suffix keys every step (as
        # openpi does); `static_kv_cache` in the engine removes this copy.
        k = torch.cat([past_kv[0], k], dim=2)
        v = torch.cat([past_kv[1], v], dim=2)
    out = eager_attention(q, k, v, mask)  # (B, N, sum T, h)
    outs = out.transpose(1, 2).flatten(2).split(lens, dim=1)

    new_xs: list[Tensor | None] = []
    i = 0
    for layer, x, cond in zip(layers, xs, conds):
        if x is None:
            new_xs.append(None)
            continue
        x = gated_residual(x, layer.self_attn.o_proj(outs[i]), gates[i])
        h, gate = layer.post_attention_layernorm(x, cond)
        new_xs.append(gated_residual(x, layer.mlp(h), gate))
        i += 1
    return new_xs, new_kv


# ------------------------------------------------------------------------ the model


def _shape(t: Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} on {t.device}"


MAX_NUM_STEPS = 1000  # denoise steps; beyond it a call is a typo (a million steps runs for hours), as the CLI's bound


def check_num_steps(value, name: str = "num_steps", note: str = "") -> int:
    """A denoise step count: an int in 1..MAX_NUM_STEPS, else a ValueError naming `name` (`note` says what else it
    may be). Below 1, the reference's `while` on the time (and openpi's, and LeRobot's) would never end."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_NUM_STEPS:
        raise ValueError(f"{name}: expected an integer in 1..{MAX_NUM_STEPS}{note}, got {value!r}")
    return int(value)  # a numpy integer (a config read with numpy) as a Python one


def check_sample_inputs(cfg: Pi0Config, obs, noise: Tensor | None, num_steps: int, device: torch.device) -> None:
    """`sample_actions`' arguments against the model, on the host (dtypes, shapes, devices: nothing is read
    from the device, so no sync). A wrong one is a ValueError or TypeError naming it and what was expected,
    not an error from inside a layer; a negative num_steps would make the reference's `while` never end."""
    check_num_steps(num_steps)
    if isinstance(obs, dict):  # an openpi observation dict: it goes through the policy's transform first
        raise TypeError("obs: expected an inputs.Observation (tensors on the device), got a dict: give openpi's "
                        "observation dicts to Policy.infer, or turn them into one with inputs.ObservationTransform")
    fields = ("images", "image_mask", "tokens", "token_mask", "state")
    for name in fields:
        if not isinstance(getattr(obs, name, None), Tensor):
            raise TypeError(f"obs.{name}: expected a torch.Tensor (an inputs.Observation), got "
                            f"{type(getattr(obs, name, None)).__name__}")
    for name in fields:
        if getattr(obs, name).device != device:
            raise ValueError(f"obs.{name}: on {getattr(obs, name).device}, the model is on {device}")
    state, images, tokens = obs.state, obs.images, obs.tokens
    if state.dim() != 2 or not state.is_floating_point() or (not cfg.pi05 and state.shape[1] != cfg.action_dim):
        width = "state_dim" if cfg.pi05 else cfg.action_dim
        raise ValueError(f"obs.state: expected a float tensor (B, {width}) (pi0 pads the state to the action dim), "
                         f"got {_shape(state)}")
    B, R = state.shape[0], cfg.vision.image_size
    if B == 0:  # the engine's plan has no prompt to size; the reference would return an empty chunk
        raise ValueError("obs.state: a batch of 0 samples; expected at least 1")
    others = {getattr(obs, name).shape[0] for name in fields[:4] if getattr(obs, name).dim()}
    if len(others) == 1 and B not in others:  # the state alone is off: name it, not the images checked against it
        raise ValueError(f"obs.state: a batch of {B}, the other fields' is {others.pop()} (images, masks, tokens); "
                         "every field holds the same samples")
    if images.dim() != 5 or images.shape[0] != B or tuple(images.shape[2:]) != (3, R, R) or not images.is_floating_point():
        raise ValueError(f"obs.images: expected a float tensor (B={B}, slots, 3, {R}, {R}) in [-1, 1], got {_shape(images)}")
    if obs.image_mask.dtype != torch.bool or tuple(obs.image_mask.shape) != (B, images.shape[1]):
        raise ValueError(f"obs.image_mask: expected a bool tensor ({B}, {images.shape[1]}), got {_shape(obs.image_mask)}")
    if tokens.dim() != 2 or tokens.shape[0] != B or tokens.dtype not in (torch.int32, torch.int64):
        # the embedding takes int32 and int64 ids only: int16 / uint8 failed inside it
        raise ValueError(f"obs.tokens: expected an int32 or int64 tensor (B={B}, L), got {_shape(tokens)}")
    if tokens.device.type == "cpu" and tokens.numel():  # read without a sync here; on a GPU an id out of range is a
        ids = tokens.numpy()  # device-side assert that ends the process (inputs.py). numpy: vlaperf syncs' CPU
        low, high = int(ids.min()), int(ids.max())  # stand-in for a GPU does not count this check as a device read
        if low < 0 or high >= cfg.backbone.vocab_size:
            raise ValueError(f"obs.tokens: ids in [{low}, {high}], expected 0..{cfg.backbone.vocab_size - 1} (the "
                             "model's vocabulary)")
    if obs.token_mask.dtype != torch.bool or obs.token_mask.shape != tokens.shape:
        raise ValueError(f"obs.token_mask: expected a bool tensor {tuple(tokens.shape)}, got {_shape(obs.token_mask)}")
    valid = getattr(obs, "host_image_valid", None)
    if valid is not None and len(valid) != images.shape[1]:
        raise ValueError(f"obs.host_image_valid: expected one flag per image slot ({images.shape[1]}), got {len(valid)}")
    # trusted, not checked against token_mask (that read would be the sync it saves), but its type and range are host
    # facts: a negative length trimmed the prompt silently (rel L2 0.16 on tiny), a string failed inside prompt_bucket
    prompt_len, slots = getattr(obs, "host_prompt_len", None), tokens.shape[1]
    if prompt_len is not None and (isinstance(prompt_len, bool) or not isinstance(prompt_len, numbers.Integral)
                                   or not 0 <= prompt_len <= slots):  # Integral: numpy's integers too
        raise ValueError(f"obs.host_prompt_len: expected an integer in 0..{slots} (the longest valid prompt of the "
                         f"batch) or None, got {prompt_len!r}")
    if noise is not None:
        expected = (B, cfg.action_horizon, cfg.action_dim)
        if not isinstance(noise, Tensor):  # not a tensor at all: a TypeError, as for the observation's fields
            raise TypeError(f"noise: expected a float tensor {expected} on {device}, got {type(noise).__name__}")
        if not noise.is_floating_point() or tuple(noise.shape) != expected or noise.device != device:
            raise ValueError(f"noise: expected a float tensor {expected} on {device}, got {_shape(noise)}")


@dataclass
class Guidance:
    """Real-time chunking's prefix guidance (Black, Galliker, Levine 2025), in the form LeRobot 0.6 runs it: each
    denoise step's velocity v at time t is pulled toward `target`, the part of the previous chunk the robot will
    still execute, through x1 = x_t - t v (the step's estimate of the finished chunk):

        v <- v - step_weights[i] * weights[h] * (target - x1)      (step i, chunk position h)

    target (B, H, A) float32: the previous chunk's actions not yet executed, zero-padded to the chunk's H x A.
    weights (H,) or (B, H) float32: how strongly each chunk position is held to it (1 for the positions executed
    while this chunk is computed, fading to 0 by the execution horizon: `rtc_prefix_weights`); (B, H) gives each
    sample its own delay, and a row of zeros leaves that sample unguided (a server's batch of robots with and
    without a previous chunk). step_weights (num_steps,) float32: the guidance weight
    of each step, largest at the noise. The paper's guidance multiplies the error by the Jacobian of x1 through the
    model (a vector-Jacobian product); LeRobot evaluates v before x_t requires grad, so its product is the identity
    and the correction is the weighted error itself, as here. All tensors: no host read, so it runs inside a CUDA
    graph, and a call with new values replays the graph captured for the shapes."""

    target: Tensor
    weights: Tensor
    step_weights: Tensor

    def check(self, batch: int, horizon: int, action_dim: int, num_steps: int, device: torch.device) -> None:
        """Shapes, dtypes and device on the host; a wrong one is a ValueError naming the field."""
        for name, shapes in (("target", [(batch, horizon, action_dim)]), ("weights", [(horizon,), (batch, horizon)]),
                             ("step_weights", [(num_steps,)])):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) not in shapes \
                    or t.device != device:
                got = _shape(t) if isinstance(t, Tensor) else type(t).__name__
                expected = " or ".join(str(shape) for shape in shapes)
                raise ValueError(f"guidance.{name}: expected a float32 tensor {expected} on {device}, got {got}")

    def tensors(self) -> list[Tensor]:
        return [self.target, self.weights, self.step_weights]

    @staticmethod
    def apply(v: Tensor, x_t: Tensor, t: Tensor | float, step: int, target: Tensor, weights: Tensor,
              step_weights: Tensor) -> Tensor:
        """The guided velocity of step `step` (v, x_t: (B, H, A) float32; t the step's time)."""
        x1 = x_t - t * v
        return v - step_weights[step] * (weights[..., None] * (target - x1))


def rtc_step_weights(num_steps: int, max_weight: float, device: torch.device | str = "cpu") -> Tensor:
    """RTC's guidance weight at each of `num_steps` Euler steps from t = 1 (noise) toward 0, float32: with the
    paper's time tau = 1 - t, min(c / r^2, max_weight) where c = (1 - tau) / tau and r^2 = (1 - tau)^2 / ((1 -
    tau)^2 + tau^2); at the noise (tau = 0, c infinite) it is max_weight."""
    t = torch.tensor([1.0 + i * (-1.0 / num_steps) for i in range(num_steps)], dtype=torch.float32)
    tau = 1.0 - t
    c = ((1.0 - tau) / tau).nan_to_num(posinf=max_weight)
    inv_r2 = ((1.0 - tau) ** 2 + tau**2) / (1.0 - tau) ** 2
    return (c * inv_r2).nan_to_num(posinf=max_weight).clamp(max=max_weight).to(device)


RTC_SCHEDULES = ("linear", "exp", "ones", "zeros")


def rtc_prefix_weights(delay: int, execution_horizon: int, horizon: int, schedule: str = "linear") -> Tensor:
    """How strongly each of a chunk's `horizon` positions is held to the previous chunk, (horizon,) float32:
    1 at the first `delay` positions (the robot executes them while this chunk is computed, so they are frozen),
    0 from `execution_horizon` on (the new chunk is free there), and between the two falling from 1 toward 0:
    evenly ("linear"), or the paper's exponential soft mask ("exp": w * (e^w - 1) / (e - 1) of the linear w).
    "ones": 1 up to the execution horizon; "zeros": 1 in the delay only. The delay counts at most up to the
    execution horizon. These are the schedules LeRobot's RTCAttentionSchedule names, with its conventions."""
    for name, value in (("delay", delay), ("execution_horizon", execution_horizon), ("horizon", horizon)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    if schedule not in RTC_SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(RTC_SCHEDULES)}, got {schedule!r}")
    frozen = min(delay, execution_horizon)
    weights = torch.zeros(horizon, dtype=torch.float32)
    if schedule == "ones":
        weights[:execution_horizon] = 1.0
        return weights
    if schedule in ("linear", "exp"):
        n = min(execution_horizon, horizon) - frozen  # the positions between the frozen ones and the horizon
        if n > 0:
            ramp = 1.0 - torch.arange(1, n + 1, dtype=torch.float32) / (n + 1)  # strictly between 1 and 0
            if schedule == "exp":
                ramp = ramp * torch.expm1(ramp) / (math.e - 1.0)
            weights[frozen: frozen + n] = ramp
    weights[:frozen] = 1.0
    return weights


@dataclass(frozen=True)
class RtcConfig:
    """Real-time chunking's settings for a policy (LeRobot's RTCConfig defaults): positions past
    `execution_horizon` are not held to the previous chunk; `max_guidance_weight` clamps the per-step weight
    (`rtc_step_weights`); `schedule` shapes the hold between the delay and the horizon (`rtc_prefix_weights`)."""

    execution_horizon: int = 10
    max_guidance_weight: float = 10.0
    schedule: str = "linear"

    def __post_init__(self):
        if isinstance(self.execution_horizon, bool) or not isinstance(self.execution_horizon, int) \
                or self.execution_horizon < 1:
            raise ValueError(f"rtc execution_horizon: expected an integer >= 1, got {self.execution_horizon!r}")
        w = self.max_guidance_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
            raise ValueError(f"rtc max_guidance_weight: expected a finite number > 0, got {w!r}")
        if self.schedule not in RTC_SCHEDULES:
            raise ValueError(f"rtc schedule: expected one of {', '.join(RTC_SCHEDULES)}, got {self.schedule!r}")


def _bump_weights_version(model: "Pi0Model", incompatible_keys) -> None:
    model.weights_version += 1


class Pi0Model(nn.Module):
    """pi0 / pi0.5 policy. Weights are random unless a checkpoint is loaded."""

    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.config = cfg
        # set by Engine.release_reference_weights: the layers' own weights are gone (the ids of those parameters:
        # another engine that reads one refuses to run)
        self.reference_released = False
        self.released_parameters: set[int] = set()
        # bumped by each checkpoint load (checkpoints.load_state): an engine built before it holds copies of
        # the old weights and refuses to run; `checkpoint` says where the weights came from (None: random)
        self.weights_version = 0
        self.checkpoint: dict | None = None
        # torch's own `model.load_state_dict` replaces the weights too: the same bump (a load into a submodule, or
        # an in-place edit of a parameter, is not seen: build the Engine again after one)
        self.register_load_state_dict_post_hook(_bump_weights_version)
        D_e = cfg.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(cfg)
        self.action_in_proj = nn.Linear(cfg.action_dim, D_e)
        self.action_out_proj = nn.Linear(D_e, cfg.action_dim)
        if cfg.pi05:
            self.time_mlp_in = nn.Linear(D_e, D_e)
            self.time_mlp_out = nn.Linear(D_e, D_e)
        else:
            self.state_proj = nn.Linear(cfg.action_dim, D_e)
            self.action_time_mlp_in = nn.Linear(2 * D_e, D_e)
            self.action_time_mlp_out = nn.Linear(D_e, D_e)

    # Short names for the sub-models, used throughout (and by the engine).
    @property
    def vision(self) -> SiglipVisionModel:
        return self.paligemma_with_expert.paligemma.model.vision_tower.vision_model

    @property
    def projector(self) -> nn.Linear:
        return self.paligemma_with_expert.paligemma.model.multi_modal_projector.linear

    @property
    def backbone(self) -> GemmaModel:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def expert(self) -> GemmaModel:
        return self.paligemma_with_expert.gemma_expert.model

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype of the transformers (bf16 on GPU)."""
        return self.backbone.layers[0].self_attn.q_proj.weight.dtype

    @property
    def head_dtype(self) -> torch.dtype:
        """dtype of the small action/state/time heads (float32 in openpi, even under bf16)."""
        return self.action_in_proj.weight.dtype

    # ---- prefix: images + prompt

    def embed_image(self, images: Tensor) -> Tensor:
        """(B, 3, 224, 224) in [-1, 1] -> (B, P, D) backbone-width image tokens."""
        return self.projector(self.vision(images))

    def embed_prefix(self, obs) -> tuple[Tensor, Tensor, Tensor]:
        """Image tokens of every slot (masked ones too, as openpi does) + scaled prompt tokens.

        Returns embeddings (B, T, D), pad mask (B, T) and att mask (B, T) (all False: the
        prefix attends bidirectionally).
        """
        embs, pads = [], []
        B = obs.images.shape[0]
        for s in range(obs.images.shape[1]):
            img = self.embed_image(obs.images[:, s])  # (B, P, D)
            embs.append(img)
            pads.append(obs.image_mask[:, s, None].expand(B, img.shape[1]))
        lang = self.backbone.embed_tokens(obs.tokens)  # (B, L, D)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(obs.token_mask)
        prefix = torch.cat(embs, dim=1)
        pad = torch.cat(pads, dim=1)
        return prefix, pad, torch.zeros_like(pad)

    def prefill(self, prefix: Tensor, pad: Tensor, att: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Run the backbone over the prefix; return the per-layer (k, v) cache."""
        mask = make_attention_mask_2d(pad, att)
        positions = torch.cumsum(pad.long(), dim=1) - 1
        cos, sin = rope_cos_sin(positions, self.config.backbone.head_dim, self.config.backbone.rope_base, prefix.dtype)
        cache = []
        x = prefix
        for layer in self.backbone.layers:
            (x, _), kv = joint_layer([layer, None], [x, None], cos, sin, mask, [None, None])
            cache.append(kv)
        return cache

    # ---- suffix: state + noisy actions + time

    def time_condition(self, t: Tensor) -> Tensor:
        """(B,) -> (B, D_e) sinusoidal embedding, in the heads' dtype (float32)."""
        return sinusoidal_time_embedding(t, self.config.expert.width).to(self.head_dtype)

    def embed_suffix(self, state: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Suffix tokens for one denoise step.

        pi0:   [state token, H action tokens with time mixed in by an MLP]; the state token
               and the first action token each start a causal block.
        pi0.5: [H action tokens]; time enters every expert norm (adaptive RMSNorm).
        Returns embeddings (B, T, D_e), pad (B, T), att (B, T), and the adaRMS condition.
        """
        B, H, _ = x_t.shape
        time_emb = self.time_condition(t)  # (B, D_e), heads' dtype
        actions = self.action_in_proj(x_t.to(self.head_dtype))  # (B, H, D_e)
        if self.config.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time_emb))))
            tokens, att_flags, adarms = actions, [True] + [False] * (H - 1), cond
        else:
            state_tok = self.state_proj(state.to(self.head_dtype))[:, None, :]  # (B, 1, D_e)
            mixed = torch.cat([actions, time_emb[:, None, :].expand(B, H, -1)], dim=-1)
            actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
            tokens = torch.cat([state_tok, actions], dim=1)
            att_flags, adarms = [True, True] + [False] * (H - 1), None
        tokens = tokens.to(self.dtype)  # the heads run in float32, the expert in bf16
        T = tokens.shape[1]
        pad = torch.ones(B, T, dtype=torch.bool, device=tokens.device)
        # Built on the device (not torch.tensor(list)), so no host-to-device copy per step.
        att = torch.zeros(B, T, dtype=torch.bool, device=tokens.device)
        att[:, : att_flags.count(True)] = True
        return tokens, pad, att, adarms

    def denoise_step(
        self, state: Tensor, prefix_pad: Tensor, cache: list[tuple[Tensor, Tensor]], x_t: Tensor, t: Tensor
    ) -> Tensor:
        """Velocity v_t (B, H, A) float32 of the flow at x_t, time t (B,)."""
        suffix, suffix_pad, suffix_att, adarms = self.embed_suffix(state, x_t, t)
        B, Ts, _ = suffix.shape
        Tp = prefix_pad.shape[1]
        # Suffix queries see every valid prefix token, and the suffix by its own block rule.
        to_prefix = prefix_pad[:, None, :].expand(B, Ts, Tp)
        within = make_attention_mask_2d(suffix_pad, suffix_att)
        mask = torch.cat([to_prefix, within], dim=2)  # (B, Ts, Tp + Ts)
        positions = prefix_pad.long().sum(-1, keepdim=True) + torch.cumsum(suffix_pad.long(), dim=1) - 1
        cos, sin = rope_cos_sin(positions, self.config.expert.head_dim, self.config.expert.rope_base, suffix.dtype)
        x = suffix
        for layer, kv in zip(self.expert.layers, cache):
            (_, x), _ = joint_layer([None, layer], [None, x], cos, sin, mask, [None, adarms], past_kv=kv)
        x, _ = self.expert.norm(x, adarms)
        H = x_t.shape[1]
        return self.action_out_proj(x[:, -H:].to(self.action_out_proj.weight.dtype)).float()

    @torch.no_grad()
    def sample_actions(self, obs, noise: Tensor | None = None, num_steps: int = 10,
                       guidance: Guidance | None = None) -> Tensor:
        """Reference sampler: Euler steps of the flow from t=1 (noise) to t=0 (actions).

        Mirrors openpi's PyTorch loop exactly, including its `while` on a device tensor,
        which reads the tensor on the host once per step (num_steps + 1 syncs per call).
        That is the behaviour the `for_loop` lever removes; keep it here so the sync
        detector and the equivalence checks compare against what users run today.
        `guidance`: real-time chunking's pull toward the previous chunk (`Guidance`).
        Returns actions (B, H, A) float32.
        """
        if self.reference_released:
            raise RuntimeError("this model's reference weights were released (Engine.release_reference_weights, "
                               "which `vlaperf serve` calls after its equivalence check); build the model again to run "
                               "the reference path")
        device = self.action_in_proj.weight.device
        check_sample_inputs(self.config, obs, noise, num_steps, device)
        B = obs.state.shape[0]
        if guidance is not None:
            guidance.check(B, self.config.action_horizon, self.config.action_dim, num_steps, device)
        if noise is None:
            noise = torch.randn(B, self.config.action_horizon, self.config.action_dim, device=device)
        prefix, pad, att = self.embed_prefix(obs)
        cache = self.prefill(prefix, pad, att)
        dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=device)
        x_t = noise.float()
        time = torch.tensor(1.0, dtype=torch.float32, device=device)
        step = 0
        while time >= -dt / 2:  # host sync: bool() of a device tensor
            v_t = self.denoise_step(obs.state, pad, cache, x_t, time.expand(B))
            if guidance is not None:
                v_t = Guidance.apply(v_t, x_t, time, step, *guidance.tensors())
            x_t = x_t + dt * v_t
            time = time + dt
            step += 1
        return x_t


# ------------------------------------------------------------------------ building


def init_random_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic random weights (never zeros: zeros run faster on tensor cores and hide bugs).

    Linear/conv weights ~ N(0, 1/fan_in) so activations stay O(1) through deep stacks;
    biases and norm weights small; embeddings ~ N(0, 1/D) (prompt tokens are scaled by sqrt(D)).
    The generator lives on the parameters' device so building on the GPU is fast; the same
    seed gives the same weights on the same device type.
    """
    params = dict(model.named_parameters())
    if not params:
        return model
    device = next(iter(params.values())).device
    if device.type == "meta":
        return model
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(params.items()):
            if name.endswith("bias"):
                std = 0.02
            elif "norm" in name and p.ndim == 1:
                std = 0.05  # RMSNorm weights are (1 + w); LayerNorm weights are set to 1 + noise below
            elif p.ndim == 1:
                std = 0.02
            elif "embed_tokens" in name or "position_embedding" in name:
                std = p.shape[-1] ** -0.5
            else:
                fan_in = p[0].numel()
                std = fan_in**-0.5
            noise = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * std
            if "layer_norm" in name or "post_layernorm" in name:
                noise = noise + (1.0 if name.endswith("weight") else 0.0)
            p.copy_(noise.to(p.dtype))
    return model


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on a GPU (what openpi and LeRobot run), fp32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def device_and_dtype(device, dtype) -> tuple[torch.device, torch.dtype]:
    """A model builder's `device` (a torch.device or its name) and `dtype` (a floating torch dtype or its name,
    e.g. "bfloat16"; None: bfloat16 on CUDA, float32 on the CPU), checked: a ValueError naming the argument."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N' (or a torch.device), got {device!r}") from None
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype) or not getattr(torch, dtype).is_floating_point:
            raise ValueError(f"dtype: expected a floating torch dtype or its name, e.g. 'bfloat16', got {dtype!r}")
        dtype = getattr(torch, dtype)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"dtype: expected a floating torch dtype or its name, e.g. 'bfloat16', got {dtype!r}")
    return device, dtype or default_dtype(device)


def build_model(
    preset: str | Pi0Config,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    seed: int = 0,
) -> Pi0Model:
    """A model of `preset` with deterministic random weights on `device`, eval mode. `dtype` may be a
    torch dtype or its name ("bfloat16", "float32"); None: bfloat16 on CUDA, float32 on the CPU."""
    cfg = preset if isinstance(preset, Pi0Config) else get_config(preset)
    device, dtype = device_and_dtype(device, dtype)
    with torch.device(device):
        model = Pi0Model(cfg)
    init_random_(model, seed)
    return set_openpi_dtypes(model, dtype).eval().requires_grad_(False)


def empty_model(cfg: Pi0Config, device: torch.device | str, dtype: torch.dtype) -> Pi0Model:
    """An uninitialised model (no random init: a strict checkpoint load writes every
    parameter next), with openpi's dtypes and the embedding tied to the LM head."""
    with torch.device("meta"):
        model = Pi0Model(cfg)
    model = model.to_empty(device=device)
    if cfg.unused_heads:  # to_empty unties the embedding and the LM head; tie them again
        model.paligemma_with_expert.paligemma.lm_head.weight = model.backbone.embed_tokens.weight
    return set_openpi_dtypes(model, dtype)


# openpi keeps these in float32 when the model runs in bf16 (its `to_bfloat16_for_selected_params`),
# plus every parameter outside `paligemma_with_expert` (the action/state/time heads).
FLOAT32_PARAMS = ("patch_embedding", "position_embedding", "input_layernorm", "post_attention_layernorm", "model.norm")


def set_openpi_dtypes(model: Pi0Model, dtype: torch.dtype) -> Pi0Model:
    """Cast to `dtype` the way openpi does: transformer weights in `dtype`, the parameters
    named in FLOAT32_PARAMS and the top-level heads in float32."""
    model.to(dtype)
    if dtype != torch.float32:
        for name, p in model.named_parameters():
            if not name.startswith("paligemma_with_expert.") or any(k in name for k in FLOAT32_PARAMS):
                p.data = p.data.float()
    return model
