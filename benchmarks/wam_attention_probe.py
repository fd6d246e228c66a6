"""The world-action model's attention calls under each SDPA backend, on the GPU.

    python benchmarks/wam_attention_probe.py --json $OUT/wam_attention_probe.json

session 18's kernel table of wam-761 `best` had torch picking cuDNN's fused attention for
every call, each with a memset before it and 2-4 us of idle GPU between the kernels. This times
the call shapes of one generate call (batch 1, 12 heads of 128) under the cuDNN, flash and
memory-efficient backends: 20 calls back to back in one CUDA graph, the graph replayed, median
of the replays divided by 20, and each backend's output against the math backend's.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

# (name, query tokens, key tokens): wam-761 (720 frame tokens + state = 721 on the video side, 40 actions,
# 512 text tokens); drop_middle keeps 480 frame tokens (481 on the video side, 521 in all)
SHAPES = [
    ("self video side", 721, 721),
    ("self actions over all", 40, 761),
    ("cross", 761, 512),
    ("self video side, drop_middle", 481, 481),
    ("self actions over all, drop_middle", 40, 521),
    ("cross, drop_middle", 521, 512),
    ("cross, actions alone", 40, 512),
]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def time_backend(backend, q, k, v, calls: int = 20, replays: int = 30) -> float:
    with sdpa_kernel([backend]):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                F.scaled_dot_product_attention(q, k, v)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, tq, tk in SHAPES:
        q = torch.randn(args.batch, 12, tq, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(args.batch, 12, tk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(args.batch, 12, tk, 128, device="cuda", dtype=torch.bfloat16)
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        row = {"shape": name, "q_tokens": tq, "k_tokens": tk}
        for bname, backend in BACKENDS.items():
            try:
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q, k, v)
                rel = float((out.float() - ref).norm() / ref.norm())
                row[bname] = {"us": round(time_backend(backend, q, k, v), 2), "rel_l2_vs_fp32": rel}
            except RuntimeError as e:
                row[bname] = {"error": str(e).splitlines()[0][:200]}
        rows.append(row)
        cells = "  ".join(f"{b} {row[b].get('us', 'n/a')} us" for b in BACKENDS)
        print(f"{name:38s} {tq:4d} x {tk:4d}  {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": SCHEMA, "command": "wam-attention-probe",
                       "workload": {"id": "wam-761", "overrides": {"batch": args.batch}},
                       "variant": {"levers": [], "label": "attention calls, SDPA backends", "dtype": "bfloat16"},
                       "mode": None, "batch": args.batch, "env": environment_record("cuda"), "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    require_cuda(__file__)
    main()
