"""The roofline floor of one policy call: FLOPs over the matmul rate, bytes over bandwidth.

Counted per phase, since the phases sit on opposite sides of the ridge:
  prefix  (SigLIP on the embedded images + the backbone over the prefix): compute-bound;
  denoise (the expert over ~51 suffix tokens, N times): memory-bound, it streams the
          expert's weights and the prefix KV cache every step.
floor = sum over phases of max(flops / matmul_rate, bytes / bandwidth).
Only matmul and attention FLOPs are counted (norms, RoPE, softmax are lower order), and
only the weights and KV cache as bytes (activations are small at batch 1).
The default ceilings are the ones measured on the lent H200 (shared/design/perf-facts.md):
bf16 matmul 780 TFLOP/s, device copy 4.23 TB/s. On another device, `measure_ceilings` takes its
own (`vlaperf bench --ceilings measure`).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from vlaperf.models.pi0 import GemmaConfig, Pi0Config
from vlaperf.workloads import Workload

H200_MATMUL_FLOPS = 780e12
H200_BANDWIDTH = 4.23e12
H200_CEILINGS = {"matmul_flops": H200_MATMUL_FLOPS, "bandwidth": H200_BANDWIDTH, "source": "H200 (perf-facts)"}


def measure_ceilings(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, matmul_size: int | None = None,
                     copy_bytes: int | None = None, reps: int = 10) -> dict:
    """This device's two ceilings, measured as the H200's were: the rate of one large square matmul in `dtype` on
    random data (2 n^3 FLOPs), and a large device-to-device copy, its bytes read plus written, over the time. Each the
    median of `reps` timed runs after one warm-up (CUDA events on a GPU, the host clock elsewhere). Sizes default to
    8192 and 2 GiB on a GPU (well past L2; the copy less where a quarter of the free memory is less), 2048 and 256 MiB
    on the CPU, where a GPU's sizes would take minutes."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    n = matmul_size if matmul_size is not None else 8192 if on_gpu else 2048
    nbytes = copy_bytes if copy_bytes is not None else (
        min(2**31, torch.cuda.mem_get_info(device)[0] // 4 // 2**20 * 2**20) if on_gpu else 2**28)
    if n < 1 or nbytes < 1 or reps < 1:
        raise ValueError(f"measure_ceilings: matmul_size, copy_bytes and reps must be positive, got {n}, {nbytes}, {reps}")
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # random: zeros run faster than real data
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    src = torch.randn(nbytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)

    def seconds(fn) -> float:
        fn()  # warm-up: library handles, kernel choice
        times = []
        for _ in range(reps):
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    matmul_s = seconds(lambda: torch.mm(a, b))
    copy_s = seconds(lambda: dst.copy_(src))
    moved = 2 * src.numel() * src.element_size()
    return {"matmul_flops": 2 * n**3 / matmul_s, "bandwidth": moved / copy_s, "source": "measured on this device",
            "matmul": f"{n} x {n} x {n} {str(dtype).replace('torch.', '')}, median of {reps}",
            "copy": f"{moved / 2 / 2**20:.0f} MiB device to device (read + written), median of {reps}"}


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


# --------------------------------------------------------------- world-action model


def _wam_forward(cfg, batch: int, tokens: int, video_side: int, context_kv: bool,
                 cached_video: int = 0) -> tuple[float, float]:
    """FLOPs and weight bytes (bf16) of one forward over `tokens` tokens per sample, of which
    the first `video_side` attend among themselves only and the rest attend to all
    (video_side 0: `tokens` = the action tokens alone against the finished video's cached keys,
    `cached_video` of them, the kept frames + the state token: then the keys are
    cached_video + tokens). context_kv: the cross-attention keys/values are computed here."""
    d, m, L = cfg.width, cfg.mlp_dim, cfg.text_tokens
    linear = 6 * d * d + 2 * d * m  # self q, k, v, o; cross q, o; the MLP
    flops = 2 * batch * tokens * linear
    if video_side:  # a full forward: video side over itself, actions over everything
        actions = tokens - video_side
        pairs = video_side * video_side + actions * tokens
    else:  # actions alone against the cached video side: the kept frames only (drop_middle caches no dropped frame)
        pairs = tokens * (cached_video + tokens)
    flops += 4 * batch * d * (pairs + tokens * L)  # QK^T and PV, self and cross
    params = linear
    if context_kv:
        flops += 2 * batch * L * 2 * d * d
        params += 2 * d * d
    return flops * cfg.depth, 2.0 * params * cfg.depth


def wam_roofline(cfg, workload, matmul_flops: float = H200_MATMUL_FLOPS, bandwidth: float = H200_BANDWIDTH) -> dict:
    """Floor of one world-action `generate` as vlaperf's best algorithm runs it: the text
    context's cross-attention keys/values once, a full forward a step while the video is
    being denoised plus the one that fills the video cache, the action tokens alone after;
    each forward at max(FLOPs / matmul rate, weight bytes / bandwidth). Guidance doubles the batch."""
    from vlaperf.models.wam import kept_frame_tokens

    b = workload.batch * (2 if workload.cfg_scale > 0 else 1)
    frames = kept_frame_tokens(cfg, workload.sparsity)
    tokens = frames + 1 + cfg.action_horizon
    full = workload.steps if workload.video_steps >= workload.steps else workload.video_steps + 1
    f_full, by_full = _wam_forward(cfg, b, tokens, frames + 1, context_kv=False)
    f_act, by_act = _wam_forward(cfg, b, cfg.action_horizon, 0, context_kv=False, cached_video=frames + 1)
    f_ctx, by_ctx = 2 * b * cfg.text_tokens * 2 * cfg.width**2 * cfg.depth, 2.0 * 2 * cfg.width**2 * cfg.depth
    ms = lambda f, by: 1e3 * max(f / matmul_flops, by / bandwidth)  # noqa: E731
    phases = {
        "context_kv_ms": ms(f_ctx, by_ctx),
        "full_forward_ms": ms(f_full, by_full),
        "action_forward_ms": ms(f_act, by_act),
    }
    floor = phases["context_kv_ms"] + full * phases["full_forward_ms"] + (workload.steps - full) * phases["action_forward_ms"]
    return {
        "tokens": tokens, "full_forwards": full, "action_forwards": workload.steps - full,
        "full_forward_tflop": f_full / 1e12, "flops": f_ctx + full * f_full + (workload.steps - full) * f_act,
        **phases, "floor_ms": floor, "matmul_flops": matmul_flops, "bandwidth": bandwidth,
    }


def wam_forward_roofline(cfg, workload, matmul_flops: float = H200_MATMUL_FLOPS,
                         bandwidth: float = H200_BANDWIDTH) -> dict:
    """Floor of one unguided full forward as `WamEngine.forward_once` (`--mode forward`) runs it: the text context's
    cross-attention keys/values as well as the forward over every kept token, since that call computes both (as the
    reference's `forward` does). The same count as a one-step `generate`, which is one such forward."""
    one = workload.with_overrides(steps=1, video_steps=1, cfg_scale=0.0)
    floor = wam_roofline(cfg, one, matmul_flops, bandwidth)
    return {**floor, "what": "one full forward, with the text context's keys/values"}


def floor_at(result: dict, ceilings: dict) -> float | None:
    """The floor (ms) of a `vlaperf bench` result at other ceilings than the ones its file records: a GPU's own,
    measured by another file, so that every row of that GPU's table is read against one floor. A pi0-family file
    records each phase's FLOPs and bytes; a world-action model's is counted again from its workload's settings.
    None where the file has no floor (a CPU run, an older file), or where the count at the file's own ceilings does
    not give back the floor it recorded (a model the count does not know)."""
    floor = result.get("roofline") or {}
    count = _recount(result, floor)
    if count is None or not math.isclose(count(floor["matmul_flops"], floor["bandwidth"]), floor["floor_ms"],
                                         rel_tol=1e-6):
        return None
    return count(ceilings["matmul_flops"], ceilings["bandwidth"])


def _recount(result: dict, floor: dict):
    """(matmul rate, bandwidth) -> the file's floor in ms, or None for a file without the fields to count it from."""
    if "prefix_tflop" in floor:
        steps = floor["steps"]

        def pi0(rate: float, bandwidth: float) -> float:
            prefix = max(floor["prefix_tflop"] * 1e12 / rate, floor["prefix_weight_gb"] * 1e9 / bandwidth)
            step = max(floor["denoise_tflop"] * 1e12 / steps / rate, floor["denoise_gb_per_step"] * 1e9 / bandwidth)
            return 1e3 * (prefix + steps * step)

        return pi0
    if "full_forwards" in floor:
        from vlaperf.models.wam import PRESETS
        from vlaperf.workloads import get_wam_workload

        w = result["workload"]
        settings = {k: v for k, v in (w.get("settings") or {}).items() if k in WAM_SETTINGS}
        workload = get_wam_workload(w["id"]).with_overrides(**settings)
        count = wam_forward_roofline if result.get("mode") == "forward" else wam_roofline
        return lambda rate, bandwidth: count(PRESETS[workload.preset], workload, rate, bandwidth)["floor_ms"]
    return None


WAM_SETTINGS = ("batch", "steps", "video_steps", "sparsity", "cfg_scale", "shift")  # what a wam file's workload records
