"""The Gemma prefix's attention (pi0: 8 query heads over one K/V head, head dim 256) by other
kernels than the engine's Triton kernel, on libero-pi0's prefix (2 images + a 32-token prompt
bucket with 20 valid tokens: 544 tokens, the last 12 padding keys): whether one of PyTorch's
fused kernels, given the valid key count instead of a mask, beats the engine's 24 us a layer
(docs/perf-notes.md, version 27).

  ours          vlaperf's prefix_attention (the `triton_kernels` path): the exact mask as bytes (aligned in the call)
  ours_aligned  the same, its mask aligned beforehand as the engine's is; its loads bounded by the rows' padded
                columns (session 36)
  ours_aligned_keys_bound  the same, the mask loads bounded by the keys (before session 36): at a token count
                that is not a multiple of 16 (712) the bound keeps the loads from vectorizing
  flash_varlen  FlashAttention-2 (PyTorch's build) in its varlen form with seqused_k: the keys
                past the valid count are not read; one K/V head (MQA) natively
  efficient     the memory-efficient (CUTLASS) kernel with seqlen_k, K/V expanded to 8 heads
  cudnn_ragged  cuDNN with ragged key lengths (cum_seq_k), K/V expanded
  cudnn_folded_lse / flash_folded_lse (session 24): no mask at all. The 8 heads fold into 8 x 544 rows of
                one head (the token-major q is already that matrix), the padding keys' K and V are zero, so
                each adds exp(0) to the softmax's sum and nothing to its numerator; the kernel's log-sum-exp
                takes that back out: out / (1 - pads * exp(-lse)). Timed with that correction (one
                elementwise kernel); the zeroing would be the RoPE kernel's store, not timed

Only the valid query rows are compared (padded rows are never read by the engine), against
float32 eager attention. Times: CUDA-graph replays of 200 calls (kernel_timing.graph_time_ms).

    python benchmarks/prefix_attention_probe.py --json $OUT/prefix_attention_probe.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.attention import prefix_mask
from vlaperf.engine.kernels.suffix_attention import (PREFIX_TILES, aligned_mask, prefix_attention, prefix_splits,
                                                     suffix_attention)
from vlaperf.models.pi0 import eager_attention
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=544)
    p.add_argument("--valid", type=int, default=532)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev, T, V, N, h = "cuda", args.tokens, args.valid, 8, 256
    torch.manual_seed(0)
    q = torch.randn(1, T, N, h, device=dev, dtype=torch.bfloat16)  # token-major, as the projection writes it
    k = torch.randn(1, T, 1, h, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, T, 1, h, device=dev, dtype=torch.bfloat16)
    pad = torch.zeros(1, T, dtype=torch.bool, device=dev)
    pad[:, :V] = True
    mask = prefix_mask(pad)
    ref = eager_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), mask)
    ref = ref.transpose(1, 2)[:, :V]  # (1, V, N, h): valid query rows
    scale = h**-0.5
    mask_u8 = mask.to(torch.uint8)
    cum = torch.tensor([0, T], dtype=torch.int32, device=dev)
    used = torch.tensor([V], dtype=torch.int32, device=dev)
    cum_k_ragged = torch.tensor([0, V], dtype=torch.int32, device=dev)
    k8, v8 = k.expand(1, T, N, h), v.expand(1, T, N, h)
    q_hm, k_hm, v_hm = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # the engine's layouts (rope_qkv's q)
    pads = T - V
    kz, vz = k.clone(), v.clone()
    kz[:, V:], vz[:, V:] = 0, 0
    q1, k1, v1 = q.view(1, 1, T * N, h), kz.view(1, 1, T, h), vz.view(1, 1, T, h)

    def unpadded(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """(1, 1, T*N, h) with the zero keys' exp(0) in its sum -> the masked result, token-major (1, T, N, h)."""
        keep = 1.0 / (1.0 - pads * torch.exp(-lse.float().reshape(1, 1, T * N, 1)))
        return (out * keep).to(out.dtype).view(1, T, N, h)

    mask_al = aligned_mask(mask_u8)
    splits = prefix_splits(triton.cdiv(N * T, PREFIX_TILES["block_m"]))  # what prefix_attention picks at this shape
    variants = {
        "ours": lambda: prefix_attention(q_hm, k_hm, v_hm, mask_u8).transpose(1, 2),
        "ours_aligned": lambda: prefix_attention(q_hm, k_hm, v_hm, mask_al).transpose(1, 2),
        "ours_aligned_keys_bound": lambda: suffix_attention(q_hm, k_hm, v_hm, mask_al, token_major=True, mask_cols=T,
                                                            **{**PREFIX_TILES, "splits": splits}).transpose(1, 2),
        "flash_varlen": lambda: torch.ops.aten._flash_attention_forward(
            q[0], k[0], v[0], cum, cum, T, T, 0.0, False, False, scale=scale, seqused_k=used)[0][None],
        "efficient": lambda: torch.ops.aten._efficient_attention_forward(
            q, k8, v8, None, None, None, None, None, 0.0, 0, False, scale=scale, seqlen_k=used)[0],
        "cudnn_ragged": lambda: torch.ops.aten._cudnn_attention_forward(
            q.transpose(1, 2), k8.transpose(1, 2), v8.transpose(1, 2), None, cum, cum_k_ragged, T, T, False,
            scale=scale)[0].transpose(1, 2),
        "cudnn_folded_lse": lambda: unpadded(*torch.ops.aten._scaled_dot_product_cudnn_attention(
            q1, k1, v1, None, True, 0.0, False, False, scale=scale)[:2]),
        "flash_folded_lse": lambda: unpadded(*torch.ops.aten._scaled_dot_product_flash_attention(
            q1, k1, v1, 0.0, False, False, scale=scale)[:2]),
    }
    result = {"schema": SCHEMA, "command": "prefix-attention-probe",
              "workload": {"id": "libero-pi0", "overrides": {"tokens": T, "valid_keys": V, "heads": N, "head_dim": h}},
              "variant": {"levers": ["triton_kernels"], "label": "prefix attention", "dtype": "bfloat16"}, "mode": None,
              "env": environment_record(dev), "rows": []}
    for name, fn in variants.items():
        row = {"name": name}
        try:
            out = fn()[:, :V].float()
            row["rel_l2_vs_fp32"] = ((out - ref).norm() / ref.norm()).item()
            row["us"] = graph_time_ms(fn) * 1e3
            print(f"{name:14s} {row['us']:7.2f} us  rel {row['rel_l2_vs_fp32']:.1e}")
        except Exception as e:  # a kernel this build or GPU does not have is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{name:14s} ERROR {row['error']}")
        result["rows"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
