"""The prefix's weakest GEMMs (SigLIP's o_proj and fc2 at M = 512, 230-300 TFLOP/s in the kernel
sequence) written other ways that cuBLAS may tile better, each in CUDA-graph replays:

  linear      F.linear(a, w, b): what `best` runs
  transposed  (w @ a^T)^T + b: the same product with M and N swapped (cuBLAS picks other tiles)
  split S     K cut into S slices as one strided batched GEMM (S, M, N), summed afterwards
              (bf16 partials, or float32 with bmm's out_dtype where this torch has it); the sum
              is timed with it, compiled, as inductor would fuse it with the residual add

    python benchmarks/splitk_probe.py --json $OUT/splitk_probe.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

# name: (M, K, N, bias), libero-pi0 at batch 1 (two images, a 32-token prompt bucket)
SHAPES = {"siglip_o": (512, 1152, 1152, True), "siglip_fc2": (512, 4304, 1152, True),
          "gemma_o": (544, 2048, 2048, False), "gemma_qkv": (544, 2048, 2560, False)}


def split_product(a, w, b, s: int, fp32: bool):
    M, K = a.shape
    N = w.shape[0]
    parts_a = a.view(M, s, K // s).transpose(0, 1)  # (s, M, K/s)
    parts_w = w.view(N, s, K // s).permute(1, 2, 0)  # (s, K/s, N)
    parts = torch.bmm(parts_a, parts_w, out_dtype=torch.float32) if fp32 else torch.bmm(parts_a, parts_w)
    out = parts.float().sum(0)
    return (out if b is None else out + b.float()).to(a.dtype)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = "cuda"
    result = {"schema": SCHEMA, "command": "splitk-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "prefix GEMM formulations", "dtype": "bfloat16"}, "mode": None,
              "env": environment_record(dev), "rows": []}
    for name, (M, K, N, has_bias) in SHAPES.items():
        torch.manual_seed(0)
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16)
        b = torch.randn(N, device=dev, dtype=torch.bfloat16) if has_bias else None
        ref = F.linear(a.float(), w.float(), None if b is None else b.float())
        flop = 2 * M * K * N
        variants = {"linear": lambda: F.linear(a, w, b),  # noqa: B023
                    "transposed": (lambda: torch.addmm(b[:, None], w, a.t()).t()) if has_bias  # noqa: B023
                    else (lambda: torch.mm(w, a.t()).t())}  # noqa: B023
        for s in (2, 3, 4, 8):
            if K % s == 0:
                for fp32 in (False, True):
                    fn = torch.compile(lambda s=s, fp32=fp32: split_product(a, w, b, s, fp32), dynamic=False)  # noqa: B023
                    variants[f"split {s}" + (" fp32" if fp32 else "")] = fn
        row = {"name": name, "M": M, "K": K, "N": N, "variants": {}}
        for label, fn in variants.items():
            try:
                out = fn()
                us = graph_time_ms(fn, reps=100) * 1e3
                row["variants"][label] = {"us": round(us, 2), "tflops": round(flop / us / 1e6, 1),
                                          "rel_l2": ((out.float() - ref).norm() / ref.norm()).item()}
            except Exception as e:  # a formulation this torch cannot run is a finding, not the end
                row["variants"][label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(name, label, row["variants"][label], flush=True)
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        torch._dynamo.reset()


if __name__ == "__main__":
    require_cuda(__file__)
    main()
