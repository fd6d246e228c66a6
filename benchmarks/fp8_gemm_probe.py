"""Would float8 (e4m3) matmuls pay on libero-pi0's shapes? bf16 `F.linear` (what `best` runs) against
`torch._scaled_mm` with float8 operands and row-wise scales (one per activation row, one per weight
row), each in CUDA-graph replays over enough weight copies that the weights come from HBM, as in
the call (every layer has its own).

The prefix is compute-bound (floor: FLOPs over the bf16 matmul rate) and the denoise step
memory-bound (weight bytes over bandwidth); float8 halves both the bytes and, on Hopper's tensor
cores, the time per FLOP. The activations must be quantized per call: that cost is timed on its
own (`quant`, a compiled row-wise amax + scale + cast) and added (`fp8+quant`).

    python benchmarks/fp8_gemm_probe.py --json $OUT/fp8_gemm_probe.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch
import torch.nn.functional as F

from kernel_timing import capture, replay_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

E4M3_MAX = 448.0
# name: (M, K, N) for libero-pi0 at batch 1 (two images, a 32-token prompt bucket; 51 suffix rows)
SHAPES = {
    "siglip_qkv": (512, 1152, 3456),
    "siglip_o": (512, 1152, 1152),
    "siglip_fc1": (512, 1152, 4304),
    "siglip_fc2": (512, 4304, 1152),
    "gemma_qkv": (544, 2048, 2560),
    "gemma_o": (544, 2048, 2048),
    "gemma_gate_up": (544, 2048, 32768),
    "gemma_down": (544, 16384, 2048),
    "expert_qkv": (51, 1024, 2560),
    "expert_o": (51, 2048, 1024),
    "expert_gate_up": (51, 1024, 8192),
    "expert_down": (51, 4096, 1024),
}


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise float8: each row scaled so its largest magnitude is e4m3's largest value."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def timed_graph_us(fn, calls: int, replays: int = 7) -> float:
    """`fn(i)` for i in range(calls) captured in one graph (after one pass of the same calls as warm-up); the median
    replay over `calls`, in us. `calls` is a multiple of every period `fn` cycles its inputs with."""
    step = itertools.count()
    g = capture(lambda: fn(next(step)), reps=calls, warmup=calls)
    return statistics.median(replay_ms(g) for _ in range(replays)) * 1e3 / calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of " + ", ".join(SHAPES))
    p.add_argument("--weight-bytes", type=float, default=400e6, help="bf16 weight copies to cycle through (bytes)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = "cuda"
    result = {"schema": SCHEMA, "command": "fp8-gemm-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "gemm shapes, bf16 against float8 row-wise", "dtype": "bfloat16"},
              "mode": None, "env": environment_record(dev), "rows": []}
    quant = torch.compile(quantize_rows, dynamic=False, fullgraph=True)
    for name in args.shapes.split(","):
        M, K, N = SHAPES[name]
        copies = max(2, min(64, int(args.weight_bytes // (2 * N * K))))
        torch.manual_seed(0)
        xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(4)]
        ws = [(torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
        w8 = [quantize_rows(w) for w in ws]  # (N, K) fp8, (N, 1) scales
        x8 = [quant(x) for x in xs]
        ref = F.linear(xs[0].double(), ws[0].double())
        out16 = F.linear(xs[0], ws[0])
        out8 = torch._scaled_mm(x8[0][0], w8[0][0].t(), scale_a=x8[0][1], scale_b=w8[0][1].t(), out_dtype=torch.bfloat16)
        rel = lambda o: float((o.double() - ref).norm() / ref.norm())  # noqa: E731
        flop, calls = 2 * M * K * N, 4 * copies
        bf16_us = timed_graph_us(lambda i: F.linear(xs[i % 4], ws[i % copies]), calls)
        fp8_us = timed_graph_us(lambda i: torch._scaled_mm(x8[i % 4][0], w8[i % copies][0].t(), scale_a=x8[i % 4][1],
                                                           scale_b=w8[i % copies][1].t(), out_dtype=torch.bfloat16), calls)
        quant_us = timed_graph_us(lambda i: quant(xs[i % 4]), 64)
        row = {"name": name, "M": M, "K": K, "N": N, "weight_copies": copies,
               "bf16": {"us": round(bf16_us, 2), "tflops": round(flop / bf16_us / 1e6, 1),
                        "weight_tb_s": round(2 * N * K / bf16_us / 1e6, 2), "rel_l2": rel(out16)},
               "fp8": {"us": round(fp8_us, 2), "tflops": round(flop / fp8_us / 1e6, 1),
                       "weight_tb_s": round(N * K / fp8_us / 1e6, 2), "rel_l2": rel(out8)},
               "quant_us": round(quant_us, 2)}
        row["speedup_fp8"] = round(bf16_us / fp8_us, 3)
        row["speedup_fp8_with_quant"] = round(bf16_us / (fp8_us + quant_us), 3)
        print(name, row, flush=True)
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        ws = w8 = x8 = None  # this shape's copies freed before the next shape allocates its own
        torch.cuda.empty_cache()
    print(f"{'shape':15s} {'M x K x N':>20s} {'bf16 us':>8s} {'fp8 us':>8s} {'quant us':>8s} {'x':>6s} {'x+q':>6s} {'rel bf16':>9s} {'rel fp8':>9s}")
    for r in result["rows"]:
        print(f"{r['name']:15s} {r['M']:>6d}x{r['K']:>6d}x{r['N']:>6d} {r['bf16']['us']:>8} {r['fp8']['us']:>8} "
              f"{r['quant_us']:>8} {r['speedup_fp8']:>6} {r['speedup_fp8_with_quant']:>6} "
              f"{r['bf16']['rel_l2']:>9.2e} {r['fp8']['rel_l2']:>9.2e}")


if __name__ == "__main__":
    require_cuda(__file__)
    main()
