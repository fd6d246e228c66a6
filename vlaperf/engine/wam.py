"""The world-action model's fast `generate`: the reference runner's overheads as named levers.

`WamEngine(model, "best")` builds a `generate` that computes what `WorldActionModel.generate`
computes (checked by `vlaperf check --workload wam-tiny`), with each of these switched on or off:

    host_schedule      UniPC's coefficients planned once on the host (Python floats) and the
                       time-conditioning tables of every step computed once per schedule; the
                       reference rebuilds both as device tensors at every step
    cached_keep_index  the frame-sparsity keep index, token groups and attention rule built once,
                       as static tensors; the reference calls `.nonzero()` in every forward (a host
                       sync: seed 000's open question)
    sparse_sampler     with drop_middle, the sampler runs on the kept frames only (the dropped ones
                       end at exactly 0, written once) instead of the full latent grid
    context_kv_cache   the text embedding and every block's cross-attention keys and values once
                       a call instead of at every step
    video_kv_cache     once the video is finished (video_steps < steps), its tokens' keys and values
                       are constants (the video side never attends to the actions): later steps run
                       the action tokens alone against the cached keys and values
    sdpa               torch's fused attention; the attention rule as two unmasked calls (video side
                       over the video side, actions over everything), so the flash kernel applies
    fuse_projections   each block's q, k, v projections as one matmul of stacked weights, the text
                       context's k, v as one, and on CUDA fc1 with its GELU(tanh) as one cuBLASLt
                       call (the activation in the GEMM's epilogue)
    cuda_graph         the whole call captured in one CUDA graph per input shape, replayed per call
    compile=<mode>     torch.compile of the transformer block and of the text context's key/value
                       projection, each once for all blocks (regional)
    group_modulation   the blocks get the time modulation as its per-group table (B, 3, 6, D) and the
                       token groups, and index it themselves; with compile the index folds into the
                       norms' loads, instead of every block reading a (B, T, 6, D) float32 tensor
                       (28 MB a wam-761 forward) that the reference builds per token
    flash_actions      the attention calls of the few action queries (40 at wam-761) through the flash
                       kernel, cuDNN's left for the long ones: `benchmarks/wam_attention_probe.py`
                       measured flash at 10.8 us against cuDNN's 15.8 for 40 x 761 (and cuDNN at 15.9
                       against 30.2 for the video side's 721 x 721) on an H200
                       (bf16/fp16 only: the flash kernel refuses float32, whose calls stay with sdpa)

Sparsity, guidance and the schedules are workload settings (they change the result), not levers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vlaperf.engine.compile import compile_fn
from vlaperf.profile.markers import NULL_RECORDER, active_recorder, mark, marks_to
from vlaperf.engine.graphs import GraphCache
from vlaperf.engine.levers import COMPILE_MODES, LeverError, lever_items, refuse_empty_mode, several_variants
from vlaperf.models.unipc import (
    ReferenceUniPC,
    UniPCSampler,
    flow_sigmas,
    unipc_plan,
    x0_from_velocity,
)
from vlaperf.models.wam import (
    ACTION,
    WamNoise,
    WamObservation,
    WorldActionModel,
    check_inputs,
    check_sampling_args,
    drop_factor,
    eager_attention,
    heads,
    keep_mask,
    kept_frame_tokens,
    mae_mask,
    merge_heads,
    middle_frames,
    modulate,
    token_groups,
)

WAM_LEVERS: dict[str, str] = {
    "host_schedule": "UniPC's coefficients and each step's time tables planned once on the host",
    "cached_keep_index": "the frame-sparsity keep index, token groups and attention rule as static tensors",
    "sparse_sampler": "with drop_middle, the sampler on the kept frames only, not the full latent grid",
    "context_kv_cache": "the text embedding and each block's cross-attention keys/values once a call",
    "video_kv_cache": "once the video is finished, its keys/values are constants: later steps run the actions",
    "sdpa": "scaled_dot_product_attention as two unmasked calls, so the flash kernel applies",
    "fuse_projections": "q/k/v as one matmul, the context's k/v as one; on CUDA fc1 + GELU(tanh) in cuBLASLt",
    "cuda_graph": "the whole generate call in one CUDA graph per input shape, replayed per call",
    "compile": "torch.compile the block and the context's k/v projection, once for all blocks (regional)",
    "group_modulation": "the time modulation as a per-group table indexed inside each block, not a per-token tensor",
    "flash_actions": "the action queries' attention through the flash kernel, cuDNN's for long calls (CUDA)",
}
# name -> the rest of what a lever does: `vlaperf levers NAME`
WAM_LEVER_NOTES: dict[str, str] = {
    "host_schedule": "The reference rebuilds UniPC's coefficients and the time-conditioning tables as device tensors "
                     "at every step.",
    "cached_keep_index": "The reference calls `.nonzero()` in every forward, a host sync each.",
    "sparse_sampler": "The dropped frames end at exactly 0 either way.",
    "context_kv_cache": "The reference embeds the text and projects its keys/values at every step.",
    "video_kv_cache": "Applies where the video stops early (video_steps < steps): the later steps run the action "
                      "tokens alone against the video's cached keys/values.",
    "sdpa": "The attention rule as two unmasked calls instead of eager softmax with a mask.",
    "fuse_projections": "The activation runs in cuBLASLt's epilogue.",
    "compile": "Modes: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs.",
    "group_modulation": "With compile, the table is read in the norms' loads, instead of a per-token float32 tensor "
                        "that every block reads.",
    "flash_actions": "The flash kernel is faster than cuDNN's for the few action queries.",
}
WAM_EXACT = ("host_schedule", "cached_keep_index", "sparse_sampler", "context_kv_cache", "video_kv_cache", "sdpa",
             "fuse_projections")
WAM_REQUIRES = {"cuda_graph": ("host_schedule", "cached_keep_index"), "compile": ("cached_keep_index",),
                "group_modulation": ("cached_keep_index",), "flash_actions": ("sdpa",)}
WAM_PRESETS = {
    "reference": (),
    "exact": WAM_EXACT,
    "graph": WAM_EXACT + ("cuda_graph",),
    # group_modulation pays only where compile folds its index into the norms (eager, it adds a
    # gather a block), so it is in best, not in exact
    "best": WAM_EXACT + ("cuda_graph", "compile=default", "group_modulation", "flash_actions"),  # CPU: exact
}
WAM_CUDA_ONLY = ("cuda_graph", "flash_actions")
# a few-query attention call (the action tokens) goes to the flash kernel under flash_actions
FLASH_MAX_QUERIES = 64
# the CUDA flash kernel takes half precision only (float32 raises "FlashAttention only support fp16 and bf16"):
# a float32 model on a GPU (`--dtype float32`, which `best` allows) keeps sdpa's own choice for those calls
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def block_step(block, x: Tensor, e_tok: Tensor, context_kv: tuple[Tensor, Tensor], allowed: Tensor | None,
               n_video_side: int, use_sdpa: bool, cached_kv: tuple[Tensor, Tensor] | None = None,
               fused: tuple[Tensor, Tensor] | None = None, gelu_epilogue: bool = False,
               groups: Tensor | None = None, flash_actions: bool = False):
    """One transformer block with the engine's attention. The attention rule comes as data
    (`allowed`, or `n_video_side` for sdpa's two calls; neither for the action tokens alone,
    which see everything), not as a closure, so `compile` traces this function once and reuses
    it for every block (a closure made per call would be a new guard each time). So do the
    fused weights: `fused` is this block's stacked q/k/v weight and bias (fuse_projections).
    With `groups` (group_modulation), e_tok is the per-group table (B, 3, 6, D) and the block
    takes its tokens' rows here, inside the compiled graph."""
    if groups is not None:
        e_tok = e_tok[:, groups]
    if use_sdpa:
        def attend(q, k, v):
            if flash_actions and q.shape[2] <= FLASH_MAX_QUERIES and q.dtype in FLASH_DTYPES:
                return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]
            return F.scaled_dot_product_attention(q, k, v)

        def attend_self(q, k, v):
            if n_video_side <= 0:
                return attend(q, k, v)
            # video side over the video side, actions over everything: two unmasked calls (flash)
            video = attend(q[:, :, :n_video_side], k[:, :, :n_video_side], v[:, :, :n_video_side])
            actions = attend(q[:, :, n_video_side:], k, v)
            return torch.cat([video, actions], dim=2)

        def attend_cross(q, k, v, mask=None):
            return attend(q, k, v)
    else:
        def attend_self(q, k, v):
            return eager_attention(q, k, v, allowed)

        attend_cross = eager_attention
    if fused is None:
        return block(x, e_tok, context_kv, attend_self, attend_cross, cached_kv=cached_kv)
    return fused_block_forward(block, fused, gelu_epilogue, x, e_tok, context_kv, attend_self, attend_cross, cached_kv)


def fused_block_forward(block, qkv_weight: tuple[Tensor, Tensor], gelu_epilogue: bool, x: Tensor, e: Tensor,
                        context_kv: tuple[Tensor, Tensor], attend_self, attend_cross,
                        cached_kv: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
    """WamBlock.forward (models/wam.py) with its projections fused: q, k, v from one matmul of
    the stacked (3D, D) weight, and with `gelu_epilogue` fc1 and GELU(tanh) as one cuBLASLt
    GEMM (`_addmm_activation`: the activation taken on the float32 accumulator before the one
    rounding; CUDA only, on the CPU that call computes the erf GELU). The same math otherwise,
    line for line; tests/test_wam.py checks it against the model's block."""
    sa, n = block.self_attn, block.self_attn.num_heads
    shift1, scale1, gate1, shift2, scale2, gate2 = (block.modulation.float() + e).unbind(2)
    q, k, v = F.linear(modulate(x, shift1, scale1, block.eps), *qkv_weight).chunk(3, dim=-1)
    q, k, v = heads(sa.norm_q(q), n), heads(sa.norm_k(k), n), heads(v, n)
    k_all, v_all = (k, v) if cached_kv is None else (torch.cat([cached_kv[0], k], 2), torch.cat([cached_kv[1], v], 2))
    y = sa.o(merge_heads(attend_self(q, k_all, v_all)))
    x = (x.float() + y.float() * gate1).to(x.dtype)
    x = x + block.cross_attn(block.norm3(x), context_kv, attend_cross)
    fc1, fc2 = block.ffn[0], block.ffn[2]
    h = modulate(x, shift2, scale2, block.eps)
    if gelu_epilogue:
        h = torch._addmm_activation(fc1.bias, h.flatten(0, 1), fc1.weight.t(), use_gelu=True).view(*h.shape[:2], -1)
    else:
        h = F.gelu(fc1(h), approximate="tanh")
    x = (x.float() + fc2(h).float() * gate2).to(x.dtype)
    return x, k, v


def context_kv_step(cross, context: Tensor, fused: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """A block's cross-attention keys and values of the text context, (B, N, L, h) each; with
    `fused` (fuse_projections) k and v from one matmul of the stacked (2D, D) weight. One
    function for every block, so `compile` traces it once."""
    if fused is None:
        return cross.context_kv(context)
    k, v = F.linear(context, *fused).chunk(2, dim=-1)
    return heads(cross.norm_k(k), cross.num_heads), heads(v, cross.num_heads)


@dataclass(frozen=True)
class WamLevers:
    host_schedule: bool = False
    cached_keep_index: bool = False
    sparse_sampler: bool = False
    context_kv_cache: bool = False
    video_kv_cache: bool = False
    sdpa: bool = False
    fuse_projections: bool = False
    cuda_graph: bool = False
    compile: str | None = None
    group_modulation: bool = False
    flash_actions: bool = False

    @classmethod
    def parse(cls, spec: str, device: torch.device) -> "WamLevers":
        """A comma list of lever names (compile=<mode>) and presets ('reference', 'exact', 'graph',
        'best'; best is exact on the CPU)."""
        if ";" in spec:
            raise LeverError(several_variants(spec))
        names: list[str] = []
        items = lever_items(spec)
        if items == ["none"]:  # the reference, as the pi0 family's parser takes it
            items = ["reference"]
        for item in items:  # an empty name among others refused, as for the pi0 family
            if item in WAM_PRESETS:  # a preset may start a list: "exact,compile=default"
                if item == "graph" and device.type != "cuda":
                    raise LeverError("preset 'graph' needs a CUDA device (CUDA graphs); use 'exact' on the CPU")
                names += WAM_EXACT if item == "best" and device.type != "cuda" else WAM_PRESETS[item]
            else:
                names.append(item)
        kw: dict = {}
        for item in names:
            name, _, arg = item.partition("=")
            if name not in WAM_LEVERS:
                raise LeverError(f"unknown world-action-model lever {name!r}; expected one of: {', '.join(WAM_LEVERS)} "
                                 f"or a preset ({', '.join(WAM_PRESETS)})")
            if name == "compile":
                refuse_empty_mode(item)
                mode = arg or "default"
                if mode not in COMPILE_MODES:
                    raise LeverError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
                kw["compile"] = mode
            elif arg:
                raise LeverError(f"lever {name!r} takes no argument, got {item!r}")
            else:
                kw[name] = True
        levers = cls(**kw)
        levers.validate(device)
        return levers

    def validate(self, device: torch.device) -> None:
        """LeverError where this set cannot run on `device` (WamEngine runs it for a WamLevers built directly too)."""
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise LeverError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.cuda_graph and device.type != "cuda":  # before what it needs beside it: none of that would help here
            raise LeverError("cuda_graph needs a CUDA device; drop it on the CPU")
        for lever, needs in WAM_REQUIRES.items():
            if getattr(self, lever):
                missing = [n for n in needs if not getattr(self, n)]
                if missing:
                    raise LeverError(f"lever {lever!r} needs {', '.join(missing)} beside it")
        if self.cuda_graph and self.compile == "reduce-overhead":
            raise LeverError("compile=reduce-overhead brings its own CUDA graphs; drop cuda_graph beside it")
        if self.compile == "reduce-overhead" and device.type != "cuda":
            raise LeverError("compile=reduce-overhead uses CUDA graphs and needs a CUDA device")
        if self.flash_actions and device.type != "cuda":
            raise LeverError("flash_actions needs a CUDA device (the flash kernel); drop it on the CPU")

    def names(self) -> list[str]:
        out = []
        for n in WAM_LEVERS:
            if n == "compile":
                out += [f"compile={self.compile}"] if self.compile else []
            elif getattr(self, n):
                out.append(n)
        return out


class WamEngine:
    def __init__(self, model: WorldActionModel, levers: str | WamLevers = "best", compile_backend: str = "inductor"):
        """compile_backend: "eager" traces exactly as inductor would (graph breaks, guards) without
        generating kernels: what the CPU tests use."""
        if model.reference_released:
            raise RuntimeError("this model's reference weights were released (WamEngine.release_reference_weights): build "
                               "the model again to build another engine")
        self.model = model
        self.cfg = model.config
        self.device = model.device
        self.levers = levers if isinstance(levers, WamLevers) else WamLevers.parse(levers, self.device)
        self.levers.validate(self.device)  # a WamLevers built directly: cuda_graph on a CPU, an unknown compile mode
        self.name = ",".join(self.levers.names()) or "reference"
        self._layouts: dict[str, dict] = {}
        self._time_tables: dict = {}
        self._graphs = GraphCache() if self.levers.cuda_graph else None
        # compile is regional: the block function compiled once and reused by all blocks (a first
        # call in seconds, not a 30-block graph per shape); the glue around the blocks runs eager.
        # compile_fn raises CompileUnavailable where inductor cannot run (seed 000's trap).
        where = self.device.type  # which compiler inductor needs: Triton's C one on a GPU, a C++ one on the CPU
        self.block = (compile_fn(block_step, self.levers.compile, compile_backend, device_type=where)
                      if self.levers.compile else block_step)
        self.context_kv_fn = (compile_fn(context_kv_step, self.levers.compile, compile_backend, device_type=where)
                              if self.levers.compile else context_kv_step)
        if self.levers.compile == "reduce-overhead":
            # inductor's CUDA-graph trees reuse a graph's output buffers at its next replay, and the
            # engine keeps block outputs across calls of the same compiled block (the next block's
            # input, the video cache, every block's context keys): keep copies
            compiled_block, compiled_context = self.block, self.context_kv_fn
            self.block = lambda *a: tuple(t.clone() for t in compiled_block(*a))
            self.context_kv_fn = lambda *a: tuple(t.clone() for t in compiled_context(*a))
        # fuse_projections: per block, the stacked q/k/v and context k/v weights (made once; the
        # model's own weights stay as they are, so a reference beside the engine is unchanged,
        # until release_reference_weights frees the copies)
        self._fused_qkv: list[tuple[Tensor, Tensor] | None] = [None] * len(model.blocks)
        self._fused_context: list[tuple[Tensor, Tensor] | None] = [None] * len(model.blocks)
        self._gelu_epilogue = self.levers.fuse_projections and self.device.type == "cuda"
        if self.levers.fuse_projections:
            with torch.no_grad():
                for i, block in enumerate(model.blocks):
                    sa, ca = block.self_attn, block.cross_attn
                    self._fused_qkv[i] = (torch.cat([sa.q.weight, sa.k.weight, sa.v.weight]),
                                          torch.cat([sa.q.bias, sa.k.bias, sa.v.bias]))
                    self._fused_context[i] = (torch.cat([ca.k.weight, ca.v.weight]), torch.cat([ca.k.bias, ca.v.bias]))

    def release_reference_weights(self) -> int:
        """Free the model's parameters this engine holds stacked copies of (with fuse_projections:
        each block's self-attention q/k/v and cross-attention k/v weights and biases, 0.7 GB in
        bfloat16 at wam); returns the bytes freed (0 without it). The engine runs as before; the
        model's reference `generate` and `forward` refuse from then on, so check first."""
        if not self.levers.fuse_projections:
            return 0
        freed = 0
        for block in self.model.blocks:
            sa, ca = block.self_attn, block.cross_attn
            for linear in (sa.q, sa.k, sa.v, ca.k, ca.v):
                for p in (linear.weight, linear.bias):
                    freed += p.numel() * p.element_size()
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.model.reference_released = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    # ------------------------------------------------------------------ static layout

    def layout(self, sparsity: str) -> dict:
        """Everything about the token sequence that depends on the sparsity mode alone."""
        if sparsity in self._layouts:
            return self._layouts[sparsity]
        cfg, dev = self.cfg, self.device
        keep = keep_mask(cfg, sparsity)  # built on the host: no device round trip
        keep_idx = keep.nonzero().squeeze(1)
        groups = token_groups(cfg)[keep_idx]
        n_frames = kept_frame_tokens(cfg, sparsity)
        lay = {
            "keep_idx": None if bool(keep.all()) else keep_idx.to(dev),
            "frame_idx": keep_idx[:n_frames].to(dev),
            "masked": mae_mask(cfg, sparsity, dev) if sparsity == "mae_middle" else None,
            "groups": groups.to(dev),
            "allowed": ((groups[None, :] != ACTION) | (groups[:, None] == ACTION)).to(dev),
            "n_frames": n_frames,
            "n_video_side": n_frames + 1,  # frames + state
            "action_pos": torch.arange(cfg.frame_tokens + 1, cfg.seq_len, device=dev),
        }
        if sparsity == "drop_middle":
            a, b = middle_frames(cfg)
            c = cfg.context_frames
            # a device index (a Python list would be copied to the device at every use: not capturable)
            lay["video_keep"] = torch.tensor([f for f in range(cfg.video_frames) if not a - c <= f <= b - c], device=dev)
        self._layouts[sparsity] = lay
        return lay

    def _layout_per_forward(self, sparsity: str) -> dict:
        """Without cached_keep_index: rebuilt on the device in every forward, as the reference does."""
        if self.levers.cached_keep_index:
            return self.layout(sparsity)
        cfg, dev = self.cfg, self.device
        keep_idx = keep_mask(cfg, sparsity, dev).nonzero().squeeze(1)  # the host sync of the research code
        groups = token_groups(cfg, dev)[keep_idx]
        n_frames = kept_frame_tokens(cfg, sparsity)
        return {**self.layout(sparsity), "keep_idx": keep_idx, "frame_idx": keep_idx[:n_frames], "groups": groups,
                "allowed": (groups[None, :] != ACTION) | (groups[:, None] == ACTION),
                "masked": mae_mask(cfg, sparsity, dev) if sparsity == "mae_middle" else None}

    # -------------------------------------------------------------------- forwards

    def _context_kv(self, text: Tensor) -> list[tuple[Tensor, Tensor]]:
        ctx = self.model.embed_context(text)
        return [self.context_kv_fn(block.cross_attn, ctx, fused)
                for block, fused in zip(self.model.blocks, self._fused_context)]

    def _full_forward(self, frames: Tensor, state: Tensor, actions: Tensor, t_emb: Tensor, e0: Tensor,
                      context_kv: list, lay: dict, want_video: bool, want_kv: bool):
        """All kept tokens. t_emb (B, 3, D), e0 (B, 3, 6, D) per group. Returns the kept frames'
        velocity (B, n_frames, C) or None, the actions' (B, H, A), and the video side's keys and
        values per block (for video_kv_cache) or None."""
        model = self.model
        x = model.embed_tokens(frames, state, actions, lay["masked"])
        if lay["keep_idx"] is not None:
            x = x[:, lay["keep_idx"]]
        groups = lay["groups"]
        t_tok = t_emb[:, groups]
        lv = self.levers
        # group_modulation: each block indexes the per-group table itself (see block_step)
        e_tok, block_groups = (e0, groups) if lv.group_modulation else (e0[:, groups], None)
        n, sdpa = lay["n_video_side"], lv.sdpa
        allowed = None if sdpa else lay["allowed"]
        kv_cache = []
        for block, ckv, fused in zip(model.blocks, context_kv, self._fused_qkv):
            x, k, v = self.block(block, x, e_tok, ckv, allowed, n, sdpa, None, fused, self._gelu_epilogue,
                                 block_groups, lv.flash_actions)
            if want_kv:
                kv_cache.append((k[:, :, :n], v[:, :, :n]))
        nf = lay["n_frames"]
        vel_frames = model.video_head(x[:, :nf], t_tok[:, :nf]) if want_video else None
        vel_actions = model.action_head(x[:, nf + 1 :], t_tok[:, nf + 1 :])
        return vel_frames, vel_actions, (kv_cache if want_kv else None)

    def _action_forward(self, actions: Tensor, t_emb: Tensor, e0: Tensor, context_kv: list, video_kv: list,
                        lay: dict) -> Tensor:
        """The action tokens alone, attending to the finished video's cached keys and values."""
        model = self.model
        dt = model.dtype
        x = model.action_in_proj(actions.to(dt)) + model.pos_embedding[lay["action_pos"]].to(dt)
        e_tok = e0[:, ACTION : ACTION + 1].expand(-1, x.shape[1], -1, -1)
        t_tok = t_emb[:, ACTION : ACTION + 1].expand(-1, x.shape[1], -1)
        for block, ckv, vkv, fused in zip(model.blocks, context_kv, video_kv, self._fused_qkv):
            x, _, _ = self.block(block, x, e_tok, ckv, None, 0, self.levers.sdpa, vkv, fused, self._gelu_epilogue,
                                 None, self.levers.flash_actions)
        return model.action_head(x, t_tok)

    # -------------------------------------------------------------------- schedule

    def _tables(self, steps: int, video_steps: int, shift: float, batch: int) -> list[tuple[Tensor, Tensor]]:
        """Per step i, the time-conditioning tables (t_emb, e0) for sigmas (0, sigma_v, sigma_a)."""
        key = (steps, video_steps, shift, batch)
        if self.levers.host_schedule and key in self._time_tables:
            return self._time_tables[key]
        sig_a = flow_sigmas(steps, shift)
        sig_v = flow_sigmas(video_steps, shift)
        rows = torch.tensor([[0.0, sig_v[min(i, video_steps)], sig_a[i]] for i in range(steps)], device=self.device)
        tables = []
        for i in range(steps):
            t_emb, e0 = self.model.time_tables(rows[i].expand(batch, 3))
            tables.append((t_emb, e0))
        if self.levers.host_schedule:
            self._time_tables[key] = tables
        return tables

    # ---------------------------------------------------------------------- generate

    @torch.no_grad()
    @torch.inference_mode(False)  # plain tensors in the engine's caches and graph inputs, whatever the caller's mode
    def generate(self, obs: WamObservation, noise: WamNoise, steps: int, video_steps: int | None = None,
                 sparsity: str = "none", cfg_scale: float = 0.0, shift: float = 3.0) -> tuple[Tensor, Tensor]:
        """As WorldActionModel.generate: actions (B, H, A) and the video (B, video_frames, P, C)."""
        video_steps = steps if video_steps is None else video_steps
        check_sampling_args(steps, video_steps, sparsity, cfg_scale, shift)
        check_inputs(self.cfg, obs, noise, self.model.dtype, self.device)
        if self.levers.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new call: the trees may reuse the last call's buffers
        if self._graphs is None:
            return self._generate(obs.context, obs.text, obs.state, noise.video, noise.actions,
                                  steps=steps, video_steps=video_steps, sparsity=sparsity, cfg_scale=cfg_scale, shift=shift)
        cfg = self.cfg
        b = obs.batch
        key = (b, steps, video_steps, sparsity, cfg_scale, shift)

        def build():
            self.layout(sparsity)
            self._tables(steps, video_steps, shift, 2 * b if cfg_scale > 0 else b)

            def fn(context, text, state, video, actions):
                a, v = self._generate(context, text, state, video, actions, steps=steps, video_steps=video_steps,
                                      sparsity=sparsity, cfg_scale=cfg_scale, shift=shift)
                return torch.cat([a.flatten(1), v.flatten(1)], dim=1)

            return fn

        # Under a profiler's recorder, the graph with a timing-event node at each stage mark (a capture of its own),
        # whose events this replay recorded are handed to the recorder after it (engine/graphs.py)
        recorder = active_recorder()
        timed = recorder is not NULL_RECORDER
        with marks_to(self._graphs.record_stage) if timed else contextlib.nullcontext(), torch.cuda.device(self.device):
            # the engine's GPU current: a capture on another device's current stream recorded an empty graph
            out = self._graphs.run(key, build, [obs.context, obs.text, obs.state, noise.video, noise.actions],
                                   timed=timed)
        for name, event in self._graphs.last_stage_events:
            recorder.mark(name, token=event)
        n_a = cfg.action_horizon * cfg.action_dim
        return (out[:, :n_a].view(b, cfg.action_horizon, cfg.action_dim),
                out[:, n_a:].view(b, cfg.video_frames, cfg.patches, cfg.patch_channels))

    def _generate(self, context: Tensor, text: Tensor, state: Tensor, video0: Tensor, actions0: Tensor, *,
                  steps: int, video_steps: int, sparsity: str, cfg_scale: float, shift: float):
        mark("setup")
        lv = self.levers
        b = context.shape[0]
        guided = cfg_scale > 0
        if lv.host_schedule:
            action_sampler = UniPCSampler(unipc_plan(flow_sigmas(steps, shift)))
            video_sampler = UniPCSampler(unipc_plan(flow_sigmas(video_steps, shift)))
        else:
            action_sampler = ReferenceUniPC(flow_sigmas(steps, shift))
            video_sampler = ReferenceUniPC(flow_sigmas(video_steps, shift))
        sig_a, sig_v = flow_sigmas(steps, shift), flow_sigmas(video_steps, shift)
        tables = self._tables(steps, video_steps, shift, 2 * b if guided else b)
        sparse = lv.sparse_sampler and sparsity == "drop_middle"
        lay0 = self.layout(sparsity)
        video = video0[:, lay0["video_keep"]].clone() if sparse else video0.clone()
        actions = actions0.clone()
        if guided:
            text, state = torch.cat([text, torch.zeros_like(text)]), torch.cat([state, state])
        mark("context_kv")  # stage marks for `vlaperf breakdown` (no-ops unless a recorder is active)
        context_kv = self._context_kv(text) if lv.context_kv_cache else None
        use_video_cache = lv.video_kv_cache and video_steps < steps
        video_kv = None
        for i in range(steps):
            mark(f"{'action' if use_video_cache and video_kv is not None else 'full'}_denoise_step_{i}")
            lay = self._layout_per_forward(sparsity)
            ckv = context_kv if context_kv is not None else self._context_kv(text)
            t_emb, e0 = tables[i]
            a_in = torch.cat([actions, actions]) if guided else actions
            video_live = i < video_steps
            if use_video_cache and video_kv is not None:
                vel_a = self._action_forward(a_in, t_emb, e0, ckv, video_kv, lay)
                vel_f = None
            else:
                if sparse:  # the full grid back for the embedding: dropped frames never reach the sequence
                    full = video0.new_zeros(video0.shape)
                    full[:, lay0["video_keep"]] = video
                else:
                    full = video
                frames = torch.cat([context.float(), full], dim=1)
                if guided:
                    frames = torch.cat([frames, frames])
                # the forward right after the video finished fills the cache
                want_kv = use_video_cache and i >= video_steps
                vel_kept, vel_a, kv = self._full_forward(frames, state, a_in, t_emb, e0, ckv, lay,
                                                        want_video=video_live, want_kv=want_kv)
                if want_kv:
                    video_kv = kv
                vel_f = vel_kept
            if guided:
                vel_a = vel_a[:b] + cfg_scale * (vel_a[:b] - vel_a[b:])
                if vel_f is not None:
                    vel_f = vel_f[:b] + cfg_scale * (vel_f[:b] - vel_f[b:])
            actions = action_sampler.step(i, actions, x0_from_velocity(actions, vel_a, sig_a[i]))
            if video_live:
                x0_v = self._video_x0(video, vel_f, lay, sig_v[i], sparse, sparsity)
                video = video_sampler.step(i, video, x0_v)
        mark("output")
        if sparse:
            full = video0.new_zeros(video0.shape)
            full[:, lay0["video_keep"]] = video
            video = full
        return actions, video

    def _video_x0(self, video: Tensor, vel_kept: Tensor, lay: dict, sigma: float, sparse: bool, sparsity: str) -> Tensor:
        """The x0 prediction of the sampler's video tokens from the kept frames' velocity."""
        cfg = self.cfg
        b = video.shape[0]
        c0 = cfg.context_frames * cfg.patches
        if sparse:  # kept frames only, in order; the context frames come first in the sequence
            vel = vel_kept[:, c0:].reshape(video.shape)
            return x0_from_velocity(video, vel, sigma)
        vel_frames = vel_kept.new_zeros(b, cfg.frame_tokens, cfg.patch_channels)
        vel_frames[:, lay["frame_idx"]] = vel_kept
        vel = vel_frames.view(b, cfg.frames, cfg.patches, cfg.patch_channels)[:, cfg.context_frames :]
        x0 = x0_from_velocity(video, vel, sigma)
        if sparsity == "drop_middle":
            x0 = x0 * drop_factor(cfg, video.device)
        return x0

    # -------------------------------------------------------------------- one forward

    @torch.inference_mode(False)  # as generate
    def forward_once(self, obs: WamObservation, noise: WamNoise, sparsity: str = "none", sigma: float = 0.5):
        """One full model forward (seed 000's first measurement level) at sigma for both groups."""
        lay = self._layout_per_forward(sparsity)
        t_emb, e0 = self.model.time_tables(torch.tensor([[0.0, sigma, sigma]], device=self.device).expand(obs.batch, 3))
        frames = torch.cat([obs.context.float(), noise.video], dim=1)
        ckv = self._context_kv(obs.text)
        return self._full_forward(frames, obs.state, noise.actions, t_emb, e0, ckv, lay, want_video=True, want_kv=False)[1]
