"""The prefix's Gemma gate_up GEMM with its GELU x up, two ways, in CUDA-graph replays:
what `best` runs (cuBLAS's GEMM through inductor, then inductor's GELU x up kernel) against
kernels/geglu_matmul.py (one Triton GEMM, the GEGLU in its epilogue), every tiling in
geglu_matmul.CONFIGS, at batch 1 (M = 544) and batch 4 (M = 2176).

    python benchmarks/geglu_matmul_bench.py --json $OUT/kernel_geglu_matmul.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.kernels import geglu_matmul as geglu
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record

D, FF = 2048, 16384  # Gemma-2B width and MLP width


def reference_mlp_input(h, w):
    gate, up = F.linear(h, w).chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="544,2176", help="comma-separated M (prefix tokens x batch)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = "cuda"
    result = {"schema": SCHEMA, "command": "geglu-bench", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "gate_up + GELU x up", "dtype": "bfloat16"}, "mode": None,
              "env": environment_record(dev), "rows": []}
    torch.manual_seed(0)
    w = (torch.randn(2 * FF, D, device=dev) / D**0.5).to(torch.bfloat16)
    compiled = torch.compile(reference_mlp_input, dynamic=False, fullgraph=True)
    for M in (int(m) for m in args.rows.split(",")):
        h = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
        ref = reference_mlp_input(h.float(), w.float())
        flop = 2 * M * D * 2 * FF
        row = {"M": M, "D": D, "F": FF, "configs": []}
        out = compiled(h, w)
        base_us = graph_time_ms(lambda: compiled(h, w), reps=50) * 1e3  # noqa: B023
        row["inductor_cublas"] = {"us": round(base_us, 2), "tflops": round(flop / base_us / 1e6, 1),
                                  "rel_l2": ((out.float() - ref).norm() / ref.norm()).item()}
        print(M, "inductor + cuBLAS", row["inductor_cublas"], flush=True)
        for cfg in geglu.CONFIGS:
            try:
                out = geglu.geglu_matmul(h, w, cfg)
                us = graph_time_ms(lambda: geglu.geglu_matmul(h, w, cfg), reps=50) * 1e3  # noqa: B023
                r = {"config": list(cfg), "us": round(us, 2), "tflops": round(flop / us / 1e6, 1),
                     "rel_l2": ((out.float() - ref).norm() / ref.norm()).item(), "speedup": round(base_us / us, 3)}
            except Exception as e:  # a tiling that does not fit is a finding, not the end of the sweep
                r = {"config": list(cfg), "error": f"{type(e).__name__}: {str(e)[:200]}"}
            row["configs"].append(r)
            print(M, r, flush=True)
        timed = [r for r in row["configs"] if "us" in r and r["rel_l2"] < 1e-2]
        row["fastest"] = min(timed, key=lambda r: r["us"])["config"] if timed else None
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
