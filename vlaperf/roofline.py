"""The roofline floor of one policy call: FLOPs over the matmul rate, bytes over bandwidth.

Counted per phase, since the phases sit on opposite sides of the ridge:
  prefix  (SigLIP on the embedded images + the backbone over the prefix): compute-bound;
  denoise (the expert over ~51 suffix tokens, N times): memory-bound, it streams the
          expert's weights and the prefix KV cache every step.
floor = sum over phases of max(flops / matmul_rate, bytes / bandwidth).
Only matmul and attention FLOPs are counted (norms, RoPE, softmax are lower order), and
only the weights and KV cache as bytes (activations are small at batch 1).
The default ceilings are the ones measured on the lent H200 (shared/design/perf-facts.md):
bf16 matmul 780 TFLOP/s, device copy 4.23 TB/s.
"""

from __future__ import annotations

from vlaperf.models.pi0 import GemmaConfig, Pi0Config
from vlaperf.workloads import Workload

H200_MATMUL_FLOPS = 780e12
H200_BANDWIDTH = 4.23e12


def _gemma_layer_flops(c: GemmaConfig, tokens: int, keys: int) -> float:
    proj = c.width * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.width
    mlp = 3 * c.width * c.mlp_dim
    attn = 2 * keys * c.num_heads * c.head_dim  # QK^T and PV, per query token
    return 2 * tokens * (proj + mlp) + 2 * tokens * attn


def _gemma_layer_params(c: GemmaConfig) -> int:
    return c.width * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.width + 3 * c.width * c.mlp_dim


def roofline(cfg: Pi0Config, workload: Workload, images: int, prompt_len: int, steps: int | None = None,
             bytes_per_param: int = 2, matmul_flops: float = H200_MATMUL_FLOPS, bandwidth: float = H200_BANDWIDTH) -> dict:
    """Floor of one call with `images` embedded slots and `prompt_len` prompt tokens computed."""
    steps = steps or workload.steps
    B = workload.batch
    v, b, e = cfg.vision, cfg.backbone, cfg.expert
    P = v.num_patches
    vis_layer = 2 * P * (4 * v.width**2 + 2 * v.width * v.mlp_dim) + 4 * P * P * v.width
    vis_flops = B * images * (v.depth * vis_layer + 2 * P * 3 * v.patch_size**2 * v.width + 2 * P * v.width * b.width)
    Tp = images * P + prompt_len
    bb_flops = B * b.depth * _gemma_layer_flops(b, Tp, Tp)
    Ts = cfg.action_horizon + (0 if cfg.pi05 else 1)
    ex_flops = steps * B * e.depth * _gemma_layer_flops(e, Ts, Tp + Ts)
    vis_params = v.depth * (4 * v.width**2 + 2 * v.width * v.mlp_dim) + v.width * b.width
    prefix_bytes = bytes_per_param * (vis_params + b.depth * _gemma_layer_params(b))
    kv_bytes = bytes_per_param * e.depth * 2 * B * (Tp + Ts) * e.num_kv_heads * e.head_dim
    step_bytes = bytes_per_param * e.depth * _gemma_layer_params(e) + kv_bytes
    prefix_ms = max((vis_flops + bb_flops) / matmul_flops, prefix_bytes / bandwidth) * 1e3
    denoise_ms = steps * max(ex_flops / steps / matmul_flops, step_bytes / bandwidth) * 1e3
    return {
        "prefix_tokens": Tp, "suffix_tokens": Ts, "steps": steps,
        "prefix_tflop": (vis_flops + bb_flops) / 1e12, "denoise_tflop": ex_flops / 1e12,
        "prefix_weight_gb": prefix_bytes / 1e9, "denoise_gb_per_step": step_bytes / 1e9,
        "prefix_ms": prefix_ms, "denoise_ms": denoise_ms, "floor_ms": prefix_ms + denoise_ms,
        "matmul_flops": matmul_flops, "bandwidth": bandwidth,
    }
