"""The prefix's GEMM shapes through every algorithm cuBLASLt's heuristic offers, against what `best`
runs (F.linear, or the fused GELU epilogue), in CUDA-graph replays.

Session 38 (gemm_probe.py) found no Triton template faster than cuBLAS on these shapes, and
session 47 (splitk_probe.py) no other formulation of the same product; both took cuBLAS's first
choice. SigLIP's o_proj and fc2 still run at 256 and 365 TFLOP/s (M = 512: 36 output tiles of
128 x 128 on 132 SMs). cuBLASLt's heuristic returns a ranked list of algorithms (tiles, split-K,
cluster shapes); torch takes the first. This times each of them, through the engine's binding (vlaperf/engine/kernels/cublaslt.py).

Each timing is a graph of one matmul per weight copy, the copies rotated so that together they
are larger than L2 (as in a call, where each layer's weights come from HBM once), replayed 5
times; the fastest replay over the number of matmuls. Every algorithm's output is checked
against F.linear's (rel L2) before it is timed.

    python benchmarks/cublaslt_probe.py --json $OUT/cublaslt_probe.json
    python benchmarks/cublaslt_probe.py --shapes gemma_down --rows 688,704 --json $OUT/down_rows.json
    python benchmarks/cublaslt_probe.py --shapes gemma_down,gemma_o --rows 512-784:8 --algos 0   # torch's pick only

--rows: the shapes at other row counts M (a list, or first-last:step), each a row named shape@M. Session 36 found
torch's cuBLAS pick for Gemma's down projection (K = 16384, N = 2048) 1.6x slower at pi0.5's 704 prefix rows than
at 688. --algos 0 times torch's pick alone: a sweep over M that shows where such a pick falls.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from gemm_probe import SHAPES, cublas  # benchmarks/ (the script's folder is on sys.path)
from kernel_timing import capture, replay_ms

from vlaperf.engine.kernels import cublaslt
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

L2_COVER_BYTES = 180 << 20  # the weight copies of one timing together: three times the H200's 60 MB of L2
WORKSPACE_BYTES = cublaslt.HEURISTIC_WORKSPACE_BYTES  # what the heuristic may use, and what the probe gives it


def per_matmul_us(fn_for_copy, copies: int) -> float:
    """One graph of `copies` matmuls (one per weight copy), replayed 5 times: the fastest replay / copies, in us."""
    g = capture(lambda: [fn_for_copy(i) for i in range(copies)], reps=1)
    return min(replay_ms(g) for _ in range(5)) / copies * 1e3


def parse_rows(text: str) -> list[int]:
    """`--rows`: a comma list whose items are row counts ("688") or spans first-last:step ("512-784:8", inclusive)."""
    out = []
    try:
        for item in text.split(","):
            if "-" in item:
                span, _, step = item.partition(":")
                first, last = (int(v) for v in span.split("-"))
                out += range(first, last + 1, int(step or 8))
            else:
                out.append(int(item))
    except ValueError:
        raise SystemExit(f"--rows: expected a comma list of row counts or first-last:step, got {text!r}") from None
    if not out or min(out) < 1:
        raise SystemExit(f"--rows: expected row counts >= 1, got {text!r}")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of " + ", ".join(SHAPES))
    p.add_argument("--algos", type=int, default=64, help="how many algorithms to ask the heuristic for (0: none, "
                   "torch's pick alone)")
    p.add_argument("--rows", default=None, help="row counts M to run each shape at instead of its own: a comma "
                   "list of counts or first-last:step spans")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.algos < 0:
        raise SystemExit(f"--algos: expected a count >= 0, got {args.algos}")
    rows = parse_rows(args.rows) if args.rows else None
    dev = "cuda"
    result = {"schema": SCHEMA, "command": "cublaslt-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "gemm shapes, cuBLASLt algorithms", "dtype": "bfloat16"},
              "mode": None, "env": environment_record(dev), "rows": []}
    for name, M in [(n, m) for n in args.shapes.split(",") for m in (rows or [SHAPES[n][0]])]:
        _, K, N, has_bias, epilogue = SHAPES[name]
        copies = max(4, min(64, math.ceil(L2_COVER_BYTES / (N * K * 2))))
        torch.manual_seed(0)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        ws = [(torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) if has_bias else None for _ in range(copies)]
        outs = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        flop = 2 * M * K * N
        ref = cublas(x, ws[0], bs[0], epilogue).float()
        row = {"name": f"{name}@{M}" if rows else name, "M": M, "K": K, "N": N, "bias": has_bias, "epilogue": epilogue, "copies": copies}
        base = [per_matmul_us(lambda i: cublas(x, ws[i], bs[i], epilogue), copies)]
        lt = cublaslt.LtLinear(M, K, N, bias=has_bias, gelu=epilogue == "gelu")
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        algos = []
        for rank, h in enumerate(lt.heuristics(bs[0], WORKSPACE_BYTES, args.algos) if args.algos else []):
            entry = {"rank": rank, **lt.config(h)}
            try:
                outs[0].fill_(float("nan"))
                lt(h, x, ws[0], bs[0], outs[0], workspace)
                torch.cuda.synchronize()
                entry["rel_l2"] = ((outs[0].float() - ref).norm() / ref.norm()).item()
                if not entry["rel_l2"] < 2e-2:  # NaN fails too
                    entry["error"] = "wrong result"
                else:
                    entry["us"] = round(per_matmul_us(lambda i, h=h: lt(h, x, ws[i], bs[i], outs[i], workspace), copies), 2)
                    entry["tflops"] = round(flop / entry["us"] / 1e6, 1)
            except Exception as e:  # one algorithm failing must not lose the others
                entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            algos.append(entry)
        base.append(per_matmul_us(lambda i: cublas(x, ws[i], bs[i], epilogue), copies))
        row["baseline_us"] = [round(b, 2) for b in base]
        row["baseline_tflops"] = round(flop / min(base) / 1e6, 1)
        row["algos"] = algos
        timed = [a for a in algos if "us" in a]
        best = min(timed, key=lambda a: a["us"]) if timed else None
        row["best"] = best
        row["best_vs_baseline"] = round(min(base) / best["us"], 3) if best else None
        result["rows"].append(row)
        print(f"{row['name']:16s} baseline {base[0]:.2f}/{base[1]:.2f} us ({row['baseline_tflops']} TFLOP/s); "
              f"{len(algos)} algos, {len(timed)} timed; best {best and best['us']} us (rank {best and best['rank']}, "
              f"tile {best and best.get('tile')}, splitk {best and best.get('splitk')}, "
              f"cluster {best and best.get('cluster_shape')}) -> {row['best_vs_baseline']}x", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
