"""The prefix's GEMM shapes alone: cuBLAS (what `best` runs, through F.linear or the GELU
epilogue) against inductor's max-autotune choice (its Triton templates and cuBLAS, timed at
compile time), each in CUDA-graph replays, in TFLOP/s.

The kernel sequence of a libero-pi0 call (profiles/kernel_sequence_best_s8.txt) has SigLIP's
GEMMs (M = 512: two images x 256 patches) at 220-430 TFLOP/s against 650-710 for Gemma's
gate_up and down (M = 544), and Gemma's qkv / o_proj at 450-480. Whether a different tiling
is worth building depends on what else reaches these shapes; this asks inductor's autotuner
first. It prints inductor's table of choices for each shape too.

    python benchmarks/gemm_probe.py --json $OUT/gemm_probe.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

# name: (M, K, N, bias, epilogue) for libero-pi0 at batch 1 (two images, a 32-token prompt bucket)
SHAPES = {
    "siglip_qkv": (512, 1152, 3456, True, None),
    "siglip_o": (512, 1152, 1152, True, None),
    "siglip_fc1_gelu": (512, 1152, 4304, True, "gelu"),
    "siglip_fc2": (512, 4304, 1152, True, None),
    "gemma_qkv": (544, 2048, 2560, False, None),
    "gemma_o": (544, 2048, 2048, False, None),
    "gemma_gate_up": (544, 2048, 32768, False, None),
    "gemma_down": (544, 16384, 2048, False, None),
}


def linear(a, w, b, epilogue):
    if epilogue == "gelu":
        return F.gelu(F.linear(a, w, b), approximate="tanh")
    return F.linear(a, w, b)


def cublas(a, w, b, epilogue):
    """What the engine runs: F.linear, or the fused GELU epilogue (layers.siglip_fc1_gelu)."""
    if epilogue == "gelu":
        return torch._addmm_activation(b, a, w.t(), use_gelu=True)
    return F.linear(a, w, b)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of " + ", ".join(SHAPES))
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch._inductor.config as inductor_config

    inductor_config.max_autotune_gemm_backends = "TRITON,ATEN"
    dev = "cuda"
    result = {"schema": SCHEMA, "command": "gemm-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "gemm shapes", "dtype": "bfloat16"}, "mode": None,
              "env": environment_record(dev), "rows": []}
    for name in args.shapes.split(","):
        M, K, N, has_bias, epilogue = SHAPES[name]
        torch.manual_seed(0)
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16)
        b = torch.randn(N, device=dev, dtype=torch.bfloat16) if has_bias else None
        flop = 2 * M * K * N
        ref = linear(a.float(), w.float(), None if b is None else b.float(), epilogue)
        row = {"name": name, "M": M, "K": K, "N": N, "bias": has_bias, "epilogue": epilogue}
        for side, fn in (("cublas", lambda: cublas(a, w, b, epilogue)), ("max_autotune", None)):
            try:
                if fn is None:
                    compiled = torch.compile(linear, mode="max-autotune-no-cudagraphs", dynamic=False, fullgraph=True)
                    start = time.perf_counter()
                    compiled(a, w, b, epilogue)
                    torch.cuda.synchronize()
                    row["autotune_s"] = round(time.perf_counter() - start, 1)
                    fn = lambda: compiled(a, w, b, epilogue)  # noqa: E731
                out = fn()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                us = graph_time_ms(fn, reps=100) * 1e3
                row[side] = {"us": round(us, 2), "tflops": round(flop / us / 1e6, 1), "rel_l2": err}
            except Exception as e:  # a failed side is a finding, not the end of the probe
                row[side] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(name, side, row[side], flush=True)
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        torch._dynamo.reset()
    print(f"{'shape':18s} {'M x K x N':>20s} {'cuBLAS us':>10s} {'TFLOP/s':>8s} {'autotune us':>12s} {'TFLOP/s':>8s}")
    for r in result["rows"]:
        c, t = r.get("cublas", {}), r.get("max_autotune", {})
        print(f"{r['name']:18s} {r['M']:>6d}x{r['K']:>6d}x{r['N']:>6d} {c.get('us', '-'):>10} {c.get('tflops', '-'):>8} "
              f"{t.get('us', '-'):>12} {t.get('tflops', '-'):>8}")


if __name__ == "__main__":
    require_cuda(__file__)
    main()
