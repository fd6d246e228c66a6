"""A world-action model (seed 000's "XWAM" class) in plain PyTorch, and its reference runner.

A diffusion transformer denoises video latent tokens and action tokens jointly by flow
matching; its blocks are Wan-2.1-1.3B-class (adaLN time modulation, self-attention with q/k
RMSNorm, cross-attention to text-context embeddings, a GELU MLP). The reference runner
`generate` samples with UniPC and computes what a research runner of this kind computes per
call, overheads included: the frame-sparsity keep index rebuilt with `.nonzero()` in every
forward (a host sync), the scheduler's coefficients rebuilt as device tensors at every step,
the sampler on the full latent grid. `vlaperf.engine.wam` removes those one lever at a time and
is checked against this file; nothing here knows about the engine.

The sequence of one sample, in this order (wam-761: 720 + 1 + 40 = 761 tokens):
    frames   F x P latent patch tokens, frame-major. The first `context_frames` frames are the
             observed frame(s) (clean, sigma 0, never denoised); the rest are predicted video.
    state    one token from the robot state (clean).
    actions  H action tokens (the policy's output).
Attention: frame and state tokens attend to frame and state tokens only; action tokens attend
to everything. So the video never depends on the actions, and once the video is finished its
keys and values are constants: what makes the engine's `video_kv_cache` exact.

Frame sparsity (`SPARSITY`):
    none         all tokens.
    drop_middle  the two middle frames' tokens are not in the sequence (761 -> 521): the model
                 never sees them, their x0 prediction is 0, so they end at exactly 0.
    mae_middle   in the two middle frames, 3 of every 4 patch tokens are replaced by a learned
                 mask token at the input (a quarter of all frame tokens; the count stays 761).

Time: each token group has its own sigma: clean tokens 0, video sigma_v, actions sigma_a. The
video has its own schedule of `video_steps` steps (<= `steps`, the action schedule): with
`video_steps < steps` ("early stop" of the video tokens) the video is finished after
`video_steps` model calls and held clean while the actions go on.

Axis letters: B batch, F frames, P patches a frame, C latent patch channels, H action horizon,
A action dim, T tokens in the sequence, L text tokens, D width, N heads, h head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlaperf.models.unipc import ReferenceUniPC, flow_sigmas, x0_from_velocity

SPARSITY = ("none", "drop_middle", "mae_middle")

# token groups (per-token time conditioning and the attention rule)
CLEAN, VIDEO, ACTION = 0, 1, 2


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class WamConfig:
    name: str
    depth: int = 30
    width: int = 1536
    num_heads: int = 12
    mlp_dim: int = 8960
    text_dim: int = 4096  # the text encoder's embedding width (umT5-XXL class); the encoder is not part of the call
    text_tokens: int = 512
    frames: int = 6
    context_frames: int = 1  # observed frames at the start of the clip (clean conditioning)
    patches: int = 120  # latent patch tokens a frame (e.g. a 20 x 24 latent in 2 x 2 patches)
    patch_channels: int = 64  # 16 latent channels x a 2 x 2 patch
    action_horizon: int = 40
    action_dim: int = 32
    state_dim: int = 32
    freq_dim: int = 256  # sinusoidal time embedding width
    eps: float = 1e-6

    def __post_init__(self):
        # a size that is 0, negative or a float would fail far from here: num_heads 0 in the modulo below, mlp_dim 0
        # in init_random_, frames 4.0 in torch.randn, state_dim 0 as a ZeroDivisionError
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or (value < 1 and f.name != "context_frames")):  # context_frames: its range below
                raise ValueError(f"{f.name} must be an integer >= 1, got {value!r}")
        if self.freq_dim % 2:  # cos and sin halves: an odd width would embed freq_dim - 1 features into the time MLP
            raise ValueError(f"freq_dim must be even (a cos and a sin half), got {self.freq_dim}")
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} must be a multiple of num_heads {self.num_heads}")
        if self.frames < 4:  # before context_frames' range, which names frames - 1: frames 1 is the field at fault
            raise ValueError(f"frames must be >= 4 (two middle frames besides the first and last), got {self.frames}")
        if not 0 < self.context_frames < self.frames:
            raise ValueError(f"context_frames must be in 1..frames-1, got {self.context_frames} of {self.frames}")
        if self.frames // 2 - 1 < self.context_frames:  # middle_frames: sparsity may only touch predicted frames
            raise ValueError(f"the two middle frames ({self.frames // 2 - 1}, {self.frames // 2}) that frame sparsity drops "
                             f"or masks must be predicted frames, after the {self.context_frames} observed one(s): "
                             f"frames must be >= {2 * self.context_frames + 2}")

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def video_frames(self) -> int:
        return self.frames - self.context_frames

    @property
    def frame_tokens(self) -> int:
        return self.frames * self.patches

    @property
    def seq_len(self) -> int:
        return self.frame_tokens + 1 + self.action_horizon


PRESETS: dict[str, WamConfig] = {
    "wam": WamConfig("wam"),
    "wam-tiny": WamConfig("wam-tiny", depth=2, width=64, num_heads=4, mlp_dim=128, text_dim=32, text_tokens=8,
                          patches=8, patch_channels=16, action_horizon=4, action_dim=8, state_dim=8, freq_dim=32),
}


def get_config(preset: str, **overrides) -> WamConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown world-action model preset {preset!r}; expected one of: {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **overrides) if overrides else PRESETS[preset]


# ------------------------------------------------------------------- inputs


@dataclass
class WamObservation:
    context: Tensor  # (B, context_frames, P, C) the observed frame's latent patches
    text: Tensor  # (B, L, text_dim) text-encoder embeddings of the instruction
    state: Tensor  # (B, state_dim)

    @property
    def batch(self) -> int:
        return self.context.shape[0]


@dataclass
class WamNoise:
    video: Tensor  # (B, video_frames, P, C) float32
    actions: Tensor  # (B, H, A) float32


def check_inputs(cfg: WamConfig, obs: WamObservation, noise: WamNoise, dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> None:
    """A call's inputs against the config (shapes) and the model (`dtype`, `device`): a ValueError naming the
    field, what was expected and what came (otherwise a failure deep inside a block, or, for float16 noise, a
    sampler run in float16 that returned float16)."""
    for name, value, kind in (("obs", obs, WamObservation), ("noise", noise, WamNoise)):
        if not isinstance(value, kind):
            raise TypeError(f"{name}: expected a {kind.__name__}, got {type(value).__name__}")
    if not isinstance(obs.context, Tensor):
        raise ValueError(f"obs.context: expected a tensor, got {type(obs.context).__name__}")
    b = obs.context.shape[0] if obs.context.ndim else None
    expected = {
        "obs.context": (obs.context, (b, cfg.context_frames, cfg.patches, cfg.patch_channels)),
        "obs.text": (obs.text, (b, cfg.text_tokens, cfg.text_dim)),
        "obs.state": (obs.state, (b, cfg.state_dim)),
        "noise.video": (noise.video, (b, cfg.video_frames, cfg.patches, cfg.patch_channels)),
        "noise.actions": (noise.actions, (b, cfg.action_horizon, cfg.action_dim)),
    }
    obs_dtype = obs.context.dtype if isinstance(obs.context, Tensor) else None
    for name, (t, shape) in expected.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a tensor of shape {shape}, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} (batch, ...; {cfg.name}), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating tensor, got {t.dtype}")
        # the observation in one dtype (the model's); the noise is the sampler's state, float32
        if name.startswith("obs.") and t.dtype != (dtype or obs_dtype):
            raise ValueError(f"{name}: expected the model's dtype {dtype or obs_dtype}, got {t.dtype}")
        if name.startswith("noise.") and t.dtype != torch.float32:
            raise ValueError(f"{name}: expected float32 (the sampler's state, whatever the model's dtype), got {t.dtype}")
        if device is not None and t.device != device:
            raise ValueError(f"{name}: on {t.device}, the model is on {device}")


def random_wam_inputs(cfg: WamConfig, batch: int, device, dtype: torch.dtype, seed: int = 0) -> tuple[WamObservation, WamNoise]:
    """Random observation and starting noise (never zeros). The noise is float32: the sampler's state."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    obs = WamObservation(
        context=randn(batch, cfg.context_frames, cfg.patches, cfg.patch_channels).to(device, dtype),
        text=randn(batch, cfg.text_tokens, cfg.text_dim).to(device, dtype),
        state=randn(batch, cfg.state_dim).to(device, dtype),
    )
    noise = WamNoise(video=randn(batch, cfg.video_frames, cfg.patches, cfg.patch_channels).to(device),
                     actions=randn(batch, cfg.action_horizon, cfg.action_dim).to(device))
    return obs, noise


# --------------------------------------------------------------- token layout


def middle_frames(cfg: WamConfig) -> tuple[int, int]:
    """The two frames that frame sparsity drops or masks (frames 2 and 3 of 6)."""
    m = cfg.frames // 2
    return m - 1, m


def keep_mask(cfg: WamConfig, sparsity: str, device=None) -> Tensor:
    """(T,) bool over the full sequence: the tokens the transformer sees."""
    if sparsity not in SPARSITY:
        raise ValueError(f"sparsity must be one of {', '.join(SPARSITY)}, got {sparsity!r}")
    keep = torch.ones(cfg.seq_len, dtype=torch.bool, device=device)
    if sparsity == "drop_middle":
        a, b = middle_frames(cfg)
        keep[a * cfg.patches : (b + 1) * cfg.patches] = False
    return keep


def kept_frame_tokens(cfg: WamConfig, sparsity: str) -> int:
    """How many frame tokens the transformer sees (known on the host from the mode)."""
    return cfg.frame_tokens - (2 * cfg.patches if sparsity == "drop_middle" else 0)


def mae_mask(cfg: WamConfig, sparsity: str, device=None) -> Tensor:
    """(T,) bool: tokens replaced by the learned mask token (mae_middle only)."""
    masked = torch.zeros(cfg.seq_len, dtype=torch.bool, device=device)
    if sparsity == "mae_middle":
        a, b = middle_frames(cfg)
        for f in (a, b):
            p = torch.arange(cfg.patches, device=device)
            masked[f * cfg.patches + p[p % 4 != 0]] = True
    return masked


def token_groups(cfg: WamConfig, device=None) -> Tensor:
    """(T,) long: CLEAN for the context frames and the state, VIDEO for the predicted frames, ACTION."""
    g = torch.full((cfg.seq_len,), CLEAN, dtype=torch.long, device=device)
    g[cfg.context_frames * cfg.patches : cfg.frame_tokens] = VIDEO
    g[cfg.frame_tokens + 1 :] = ACTION
    return g


# ----------------------------------------------------------------------- parts


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def layer_norm(x: Tensor, eps: float) -> Tensor:
    """LayerNorm without affine, in float32 (adaLN supplies scale and shift)."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps)


def modulate(x: Tensor, shift: Tensor, scale: Tensor, eps: float) -> Tensor:
    return (layer_norm(x, eps) * (1 + scale.float()) + shift.float()).to(x.dtype)


def sinusoidal_embedding(t: Tensor, dim: int) -> Tensor:
    """t (...,) in [0, 1000] -> (..., dim) [cos, sin] over geometric frequencies, float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device, dtype=torch.float64) / half)
    angle = t.double()[..., None] * freqs
    return torch.cat([angle.cos(), angle.sin()], dim=-1).float()


def eager_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """q (B, N, Tq, h), k/v (B, N, Tk, h), allowed (Tq, Tk) bool or None; softmax in float32."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(scores.softmax(-1).to(v.dtype), v)


def heads(x: Tensor, n: int) -> Tensor:
    """(B, T, D) -> (B, N, T, h)"""
    b, t, d = x.shape
    return x.view(b, t, n, d // n).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    b, n, t, h = x.shape
    return x.transpose(1, 2).reshape(b, t, n * h)


class Attention(nn.Module):
    """q, k, v, o projections with q/k RMSNorm over the whole width (Wan's attention weights)."""

    def __init__(self, cfg: WamConfig):
        super().__init__()
        d = cfg.width
        self.num_heads = cfg.num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(d, cfg.eps), RMSNorm(d, cfg.eps)


class SelfAttention(Attention):
    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, D) -> q, k, v as (B, N, T, h), q and k RMS-normalised over the whole width."""
        n = self.num_heads
        return heads(self.norm_q(self.q(x)), n), heads(self.norm_k(self.k(x)), n), heads(self.v(x), n)


class CrossAttention(Attention):
    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, D) -> k, v (B, N, L, h): the same at every denoise step."""
        return heads(self.norm_k(self.k(context)), self.num_heads), heads(self.v(context), self.num_heads)

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], attend) -> Tensor:
        q = heads(self.norm_q(self.q(x)), self.num_heads)
        return self.o(merge_heads(attend(q, kv[0], kv[1], None)))


class WamBlock(nn.Module):
    def __init__(self, cfg: WamConfig):
        super().__init__()
        self.eps = cfg.eps
        self.self_attn = SelfAttention(cfg)
        self.norm3 = nn.LayerNorm(cfg.width, eps=cfg.eps)  # before cross-attention (affine, no modulation)
        self.cross_attn = CrossAttention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.width, cfg.mlp_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.mlp_dim, cfg.width))
        # per-block learned offsets of the six modulation vectors (shift, scale, gate x 2)
        self.modulation = nn.Parameter(torch.randn(1, 6, cfg.width) / cfg.width**0.5)

    def forward(self, x: Tensor, e: Tensor, context_kv: tuple[Tensor, Tensor], attend_self, attend_cross,
                cached_kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D); e (B, T, 6, D) float32 per-token modulation from the time embedding.

        attend_self(q, k, v) does the self-attention with the model's attention rule for these
        tokens. cached_kv: keys and values of tokens that are not in x (the finished video),
        put before x's own. Returns x and this block's own k, v (for a cache)."""
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation.float() + e).unbind(2)
        q, k, v = self.self_attn.qkv(modulate(x, shift1, scale1, self.eps))
        k_all, v_all = (k, v) if cached_kv is None else (torch.cat([cached_kv[0], k], 2), torch.cat([cached_kv[1], v], 2))
        y = self.self_attn.o(merge_heads(attend_self(q, k_all, v_all)))
        x = (x.float() + y.float() * gate1).to(x.dtype)
        x = x + self.cross_attn(self.norm3(x), context_kv, attend_cross)
        y = self.ffn(modulate(x, shift2, scale2, self.eps))
        x = (x.float() + y.float() * gate2).to(x.dtype)
        return x, k, v


class Head(nn.Module):
    def __init__(self, cfg: WamConfig, out_dim: int):
        super().__init__()
        self.eps = cfg.eps
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.width) / cfg.width**0.5)
        self.proj = nn.Linear(cfg.width, out_dim)

    def forward(self, x: Tensor, t_emb: Tensor) -> Tensor:
        """x (B, T, D), t_emb (B, T, D) float32 -> (B, T, out) float32."""
        shift, scale = (self.modulation.float() + t_emb[:, :, None]).unbind(2)
        return self.proj(modulate(x, shift, scale, self.eps)).float()


# ----------------------------------------------------------------------- model


class WorldActionModel(nn.Module):
    def __init__(self, cfg: WamConfig):
        super().__init__()
        self.config = cfg
        d = cfg.width
        self.patch_embedding = nn.Linear(cfg.patch_channels, d)
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.action_in_proj = nn.Linear(cfg.action_dim, d)
        self.pos_embedding = nn.Parameter(torch.randn(cfg.seq_len, d) / d**0.5)
        self.mask_token = nn.Parameter(torch.randn(d) / d**0.5)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList(WamBlock(cfg) for _ in range(cfg.depth))
        self.video_head = Head(cfg, cfg.patch_channels)
        self.action_head = Head(cfg, cfg.action_dim)
        self.reference_released = False  # set by WamEngine.release_reference_weights

    def _check_reference(self) -> None:
        if self.reference_released:
            raise RuntimeError("this model's reference weights were released (WamEngine.release_reference_weights, "
                               "which `vlaperf serve` calls after its equivalence check); build the model again to run "
                               "the reference path")

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embedding.weight.device

    # ----------------------------------------------------------- pieces shared with the engine

    def embed_context(self, text: Tensor) -> Tensor:
        """(B, L, text_dim) -> (B, L, D): constant over a call."""
        return self.text_embedding(text)

    def time_tables(self, sigmas: Tensor) -> tuple[Tensor, Tensor]:
        """sigmas (B, 3) per group (CLEAN, VIDEO, ACTION) -> t_emb (B, 3, D), e0 (B, 3, 6, D), float32.
        Wan conditions on t = 1000 sigma."""
        t = sinusoidal_embedding(sigmas * 1000.0, self.config.freq_dim).to(self.dtype)
        t_emb = self.time_embedding(t)
        e0 = self.time_projection(t_emb).unflatten(-1, (6, self.config.width))
        return t_emb.float(), e0.float()

    def embed_tokens(self, frames: Tensor, state: Tensor, actions: Tensor, masked: Tensor | None) -> Tensor:
        """frames (B, F, P, C), state (B, S), actions (B, H, A) -> (B, T_full, D) with positions;
        `masked` (T,) bool replaces those tokens by the learned mask token (mae_middle)."""
        dt = self.dtype
        f = self.patch_embedding(frames.to(dt)).flatten(1, 2)
        s = self.state_proj(state.to(dt))[:, None]
        a = self.action_in_proj(actions.to(dt))
        x = torch.cat([f, s, a], dim=1)
        if masked is not None:
            x = torch.where(masked[None, :, None], self.mask_token.to(dt), x)
        return x + self.pos_embedding.to(dt)

    # ------------------------------------------------------------------------ reference

    def forward(self, frames: Tensor, state: Tensor, actions: Tensor, sigma_video: Tensor, sigma_action: Tensor,
                context: Tensor, sparsity: str = "none") -> tuple[Tensor, Tensor]:
        """One model forward, the reference way. frames (B, F, P, C) with the context frames
        first; sigma_video, sigma_action (B,). Returns the velocity of every frame token
        (B, F, P, C; 0 where a token was dropped) and of the actions (B, H, A), float32."""
        self._check_reference()
        cfg = self.config
        device = frames.device
        b = frames.shape[0]
        # The research code's way: the keep index rebuilt in every forward, and `.nonzero()`
        # waits for the device (its size is data-dependent): one host sync a forward.
        keep_idx = keep_mask(cfg, sparsity, device).nonzero().squeeze(1)
        masked = mae_mask(cfg, sparsity, device) if sparsity == "mae_middle" else None
        x = self.embed_tokens(frames, state, actions, masked)[:, keep_idx]
        groups = token_groups(cfg, device)[keep_idx]
        zero = torch.zeros_like(sigma_video)
        t_emb, e0 = self.time_tables(torch.stack([zero, sigma_video, sigma_action], dim=1).float())
        t_tok = t_emb[:, groups]  # (B, T, D)
        e_tok = e0[:, groups]  # (B, T, 6, D)
        allowed = (groups[None, :] != ACTION) | (groups[:, None] == ACTION)  # (Tq, Tk): video side never sees actions
        ctx = self.embed_context(context)

        def attend_self(q, k, v):
            return eager_attention(q, k, v, allowed)

        for block in self.blocks:
            x, _, _ = block(x, e_tok, block.cross_attn.context_kv(ctx), attend_self, eager_attention)
        n_frames = kept_frame_tokens(cfg, sparsity)
        vel_kept = self.video_head(x[:, :n_frames], t_tok[:, :n_frames])
        vel_frames = torch.zeros(b, cfg.frame_tokens, cfg.patch_channels, device=device)
        vel_frames[:, keep_idx[:n_frames]] = vel_kept
        vel_actions = self.action_head(x[:, n_frames + 1 :], t_tok[:, n_frames + 1 :])
        return vel_frames.view(b, cfg.frames, cfg.patches, cfg.patch_channels), vel_actions

    @torch.no_grad()
    def generate(self, obs: WamObservation, noise: WamNoise, steps: int, video_steps: int | None = None,
                 sparsity: str = "none", cfg_scale: float = 0.0, shift: float = 3.0) -> tuple[Tensor, Tensor]:
        """One policy call: joint UniPC sampling of the video and the actions.

        steps: model calls (the action schedule); video_steps (<= steps, default steps): the
        video's schedule; the video is held clean once it is finished. cfg_scale > 0 runs the
        conditional and an unconditional (zero text context) forward as one doubled batch and
        guides with v = v_c + cfg_scale (v_c - v_u). Returns actions (B, H, A) and the
        predicted video latents (B, video_frames, P, C), float32."""
        self._check_reference()
        cfg = self.config
        video_steps = steps if video_steps is None else video_steps
        check_sampling_args(steps, video_steps, sparsity, cfg_scale, shift)
        check_inputs(cfg, obs, noise, self.dtype, self.device)
        b = obs.batch
        action_sampler = ReferenceUniPC(flow_sigmas(steps, shift))
        video_sampler = ReferenceUniPC(flow_sigmas(video_steps, shift))
        # the runner keeps its schedules as device tensors and reads them per step
        sig_a = torch.tensor(flow_sigmas(steps, shift), device=obs.context.device)
        sig_v = torch.tensor(flow_sigmas(video_steps, shift), device=obs.context.device)
        video, actions = noise.video.clone(), noise.actions.clone()
        context, state = obs.text, obs.state
        if cfg_scale > 0:
            context, state = torch.cat([context, torch.zeros_like(context)]), torch.cat([state, state])
        for i in range(steps):
            video_live = i < video_steps
            sv = sig_v[min(i, video_steps)].expand(b)
            sa = sig_a[i].expand(b)
            frames = torch.cat([obs.context.float(), video], dim=1)
            if cfg_scale > 0:
                frames, a_in, sv2, sa2 = torch.cat([frames, frames]), torch.cat([actions, actions]), sv.repeat(2), sa.repeat(2)
            else:
                a_in, sv2, sa2 = actions, sv, sa
            vel_f, vel_a = self.forward(frames, state, a_in, sv2, sa2, context, sparsity)
            if cfg_scale > 0:
                vel_f = vel_f[:b] + cfg_scale * (vel_f[:b] - vel_f[b:])
                vel_a = vel_a[:b] + cfg_scale * (vel_a[:b] - vel_a[b:])
            actions = action_sampler.step(i, actions, x0_from_velocity(actions, vel_a, sa[:, None, None]))
            if video_live:
                vel_v = vel_f[:, cfg.context_frames :]
                x0_v = x0_from_velocity(video, vel_v, sv[:, None, None, None])
                if sparsity == "drop_middle":  # the dropped frames are never predicted: their x0 is 0
                    x0_v = x0_v * drop_factor(cfg, video.device)
                video = video_sampler.step(i, video, x0_v)
        return actions, video


def drop_factor(cfg: WamConfig, device) -> Tensor:
    """(video_frames, 1, 1) float: 0 for the frames drop_middle removes, 1 elsewhere."""
    f = torch.ones(cfg.video_frames, 1, 1, device=device)
    a, b = middle_frames(cfg)
    f[a - cfg.context_frames : b - cfg.context_frames + 1] = 0.0
    return f


# Beyond these the run is a mistake, not a setting: a million steps would also tabulate ~129 GB of host
# schedules (host_schedule), and a guidance scale this large gives non-finite velocities
MAX_STEPS, MAX_CFG_SCALE = 1000, 100.0


def check_sampling_args(steps: int, video_steps: int, sparsity: str, cfg_scale: float, shift: float) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer in 1..{MAX_STEPS}, got {steps!r}")
    if isinstance(video_steps, bool) or not isinstance(video_steps, int) or not 1 <= video_steps <= steps:
        raise ValueError(f"video_steps must be an integer in 1..steps ({steps}), got {video_steps!r}")
    if sparsity not in SPARSITY:
        raise ValueError(f"sparsity must be one of {', '.join(SPARSITY)}, got {sparsity!r}")
    for name, value in (("cfg_scale", cfg_scale), ("shift", shift)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if not 0 <= cfg_scale <= MAX_CFG_SCALE:
        raise ValueError(f"cfg_scale must be in [0, {MAX_CFG_SCALE:g}] (0: no guidance), got {cfg_scale!r}")
    if not 0 < shift < math.inf:
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}")


# ------------------------------------------------------------------------ building


def init_random_(model: WorldActionModel, seed: int = 0) -> WorldActionModel:
    """Deterministic random weights (never zeros): linears ~ N(0, 1/fan_in), biases and norm
    offsets small, so activations stay O(1) through 30 blocks."""
    device = model.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("bias"):
                std, base = 0.02, 0.0
            elif p.ndim == 1 and ("norm" in name):
                std, base = 0.05, 1.0  # RMSNorm / LayerNorm weights multiply: around 1
            elif name.endswith("modulation") or p.ndim == 1 or "pos_embedding" in name:
                std, base = p.shape[-1] ** -0.5, 0.0
            else:
                std, base = p[0].numel() ** -0.5, 0.0
            p.copy_((torch.randn(p.shape, generator=gen, device=device) * std + base).to(p.dtype))
        # gates start small, as in a trained DiT, so 30 residual blocks do not blow up
        for block in model.blocks:
            block.modulation[:, 2].mul_(0.2)
            block.modulation[:, 5].mul_(0.2)
    return model


def build_wam(preset: str | WamConfig, device="cpu", dtype: torch.dtype | None = None, seed: int = 0) -> WorldActionModel:
    """A world-action model of `preset` with deterministic random weights, eval mode; bf16 on a
    GPU, float32 on the CPU (norms, modulation tables and heads compute in float32 either way). `device` and
    `dtype` may be names, as build_model takes them."""
    from vlaperf.models.pi0 import device_and_dtype

    cfg = preset if isinstance(preset, WamConfig) else get_config(preset)
    device, dtype = device_and_dtype(device, dtype)
    with torch.device(device):
        model = WorldActionModel(cfg)
    init_random_(model, seed)
    return model.to(dtype).eval().requires_grad_(False)
