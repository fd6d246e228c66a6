"""GPU check of vlaperf.engine.kernels.suffix_attention on the denoise step's shape.

pi0's step: 8 query heads x 51 suffix rows over one shared K/V head of dim 256, keys = the
cached prefix (2 images + the 32-token prompt bucket = 544) + the 51 suffix tokens. Checks
bf16 correctness of each configuration against float32 eager attention, times it with
CUDA-graph replays against the engine's folded-matmul path (vlaperf.engine.attention), and
writes a vlaperf.result/1 JSON when --json is given.

    python benchmarks/suffix_attention_bench.py --json $OUT/kernel_suffix_attention.json

--prefix: the prefix's shape instead (8 heads x 544 query rows over the 544 prefix keys, the
bidirectional prefix mask, padded rows attending to themselves), the kernel in one pass per
row block (splits=1, `prefix_attention`), against the engine's SDPA path (cuDNN on the H200).
"""

from __future__ import annotations

import argparse
import json

import torch

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.attention import attention, folded_mqa_attention, prefix_mask, suffix_mask
from vlaperf.engine.kernels.suffix_attention import PREFIX_TILES, suffix_attention
from vlaperf.models.pi0 import eager_attention
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record

B, N, TS, H, TP = 1, 8, 51, 256, 544


def make_case(prefix: bool) -> tuple:
    """(q, k, v, mask, float32 reference) in bf16 on the GPU: the step's shape, or with
    `prefix` the prefix's (also what benchmarks/prefix_tiles_ab.py sweeps)."""
    torch.manual_seed(0)
    bf = torch.bfloat16
    tq, tk = (TP, TP) if prefix else (TS, TP + TS)
    q = torch.randn(B, N, tq, H, device="cuda", dtype=bf)
    k = torch.randn(B, 1, tk, H, device="cuda", dtype=bf)
    v = torch.randn(B, 1, tk, H, device="cuda", dtype=bf)
    pad = torch.ones(B, TP, dtype=torch.bool, device="cuda")
    pad[:, 532:] = False  # 20 of the bucket's 32 prompt slots hold tokens
    mask = prefix_mask(pad) if prefix else suffix_mask(pad, TS, pi05=False)
    return q, k, v, mask, eager_attention(q.float(), k.float(), v.float(), mask)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--prefix", action="store_true", help="the prefix's shape (544 x 544, one pass) against SDPA")
    args = p.parse_args()
    q, k, v, mask, ref = make_case(args.prefix)
    tq, tk = q.shape[2], k.shape[2]

    def rel(out):
        return ((out.float() - ref).norm() / ref.norm()).item()

    if args.prefix:
        label, baseline_name = "prefix_attention", "SDPA (engine sdpa path)"
        baseline = lambda: attention(q, k, v, mask, use_sdpa=True)  # noqa: E731
        configs = [dict(block_m=bm, block_n=bn, splits=1, num_warps=nw, num_stages=st)
                   for bm in (32, 64, 128) for bn in (32, 64) for nw in (4, 8) for st in (1, 2)]
    else:
        label, baseline_name = "suffix_attention", "folded matmuls (engine sdpa path)"
        baseline = lambda: folded_mqa_attention(q, k, v, mask)  # noqa: E731
        configs = [dict(block_m=bm, block_n=bn, splits=sp, num_warps=nw, num_stages=st)
                   for bm in (32, 64) for bn in (32, 64) for sp in (None, 2, 4, 8)
                   for nw in (4, 8) for st in (1, 2)]
    t_folded = graph_time_ms(baseline)
    print(f"{baseline_name:34s}  {t_folded * 1e3:6.1f} us  rel {rel(baseline()):.1e}")
    rows = []
    for cfg in configs:
        try:
            err = rel(suffix_attention(q, k, v, mask, **cfg))
            t = graph_time_ms(lambda: suffix_attention(q, k, v, mask, **cfg))
            rows.append({**cfg, "ms": t, "rel_l2": err})
        except Exception as e:  # a configuration the compiler rejects (shared memory, registers)
            rows.append({**cfg, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    ok = sorted((r for r in rows if "ms" in r and r["rel_l2"] < 1e-2), key=lambda r: r["ms"])
    tiles = PREFIX_TILES if args.prefix else {"block_m": 64, "block_n": 32, "splits": None, "num_warps": 4, "num_stages": 2}
    default = next(r for r in rows if r == {**r, **tiles})
    print(f"default config                      {default.get('ms', float('nan')) * 1e3:6.1f} us  rel {default.get('rel_l2', float('nan')):.1e}"
          f"  {default.get('error', '')}")
    for r in ok[:8]:
        print(f"bm={r['block_m']:2d} bn={r['block_n']:2d} splits={str(r['splits']):4s} warps={r['num_warps']} stages={r['num_stages']}"
              f"  {r['ms'] * 1e3:6.1f} us  rel {r['rel_l2']:.1e}")
    bad = [r for r in rows if "ms" in r and r["rel_l2"] >= 1e-2]
    print(f"{len(ok)} configs correct, {len(bad)} wrong (rel >= 1e-2), {sum('error' in r for r in rows)} rejected")
    if args.json:
        out = {"schema": SCHEMA, "command": "kernel-bench", "workload": {"id": "libero-pi0", "overrides": {"query_rows": N * tq, "keys": tk}},
               "variant": {"levers": [], "label": label, "dtype": "bfloat16"}, "mode": None,
               "env": environment_record("cuda"), "folded_ms": t_folded, "baseline": baseline_name, "configs": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
