"""GPU check of vlaperf.engine.kernels.suffix_attention on the denoise step's shape.

pi0's step: 8 query heads x 51 suffix rows over one shared K/V head of dim 256, keys = the
cached prefix (2 images + the 32-token prompt bucket = 544) + the 51 suffix tokens. Checks
bf16 correctness of each configuration against float32 eager attention, times it with
CUDA-graph replays against the engine's folded-matmul path (vlaperf.engine.attention), and
writes a vlaperf.result/1 JSON when --json is given.

    python benchmarks/suffix_attention_bench.py --json $OUT/kernel_suffix_attention.json

--batch N: N samples, each with its own prompt length (12..28 valid of the 32-token bucket, as
`libero-pi0-b4/-b8`), the keys padded to the static cache's 600 (engine.KV_ALIGN). The sweep then
also times the merge with its head dim in parts a program (`block_d`), and the file's "fastest"
holds the fastest correct tiling.

--splits-only: only the key splits (1-8, and the default's pick) on the kernel's default tiles: a sweep of a
minute or so. The step's mask is passed as the engine passes it (aligned rows, loop.SuffixContext.kernel_mask).

--prefix: the prefix's shape instead (8 heads x 544 query rows over the 544 prefix keys, the
bidirectional prefix mask, padded rows attending to themselves), the kernel in one pass per
row block (splits=1, `prefix_attention`), against the engine's SDPA path (cuDNN on the H200).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.attention import attention, folded_mqa_attention, prefix_mask, suffix_mask
from vlaperf.engine.kernels.suffix_attention import PREFIX_TILES, aligned_mask, default_splits, prefix_splits, suffix_attention
from vlaperf.engine.kernels.suffix_attention import whole_tile_splits
from vlaperf.models.pi0 import eager_attention
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

B, N, TS, H, TP = 1, 8, 51, 256, 544


def make_case(prefix: bool, batch: int = B) -> tuple:
    """(q, k, v, mask, float32 reference) in bf16 on the GPU: the step's shape, or with
    `prefix` the prefix's (also what benchmarks/prefix_tiles_ab.py sweeps). At batch 1 the
    prompt holds 20 tokens (libero-pi0); at a batch, sample i holds 12 + 16 i / (batch - 1)
    and the keys are padded to a multiple of KV_ALIGN, as the engine's static cache is."""
    from vlaperf.engine.engine import KV_ALIGN

    torch.manual_seed(0)
    bf = torch.bfloat16
    tk = TP if prefix else TP + TS
    if batch > 1 and not prefix:
        tk = -(-tk // KV_ALIGN) * KV_ALIGN
    tq = TP if prefix else TS
    q = torch.randn(batch, N, tq, H, device="cuda", dtype=bf)
    k = torch.randn(batch, 1, tk, H, device="cuda", dtype=bf)
    v = torch.randn(batch, 1, tk, H, device="cuda", dtype=bf)
    pad = torch.ones(batch, TP, dtype=torch.bool, device="cuda")
    for i in range(batch):  # the prompt's padding: 20 of the bucket's 32 slots at batch 1, 12..28 at a batch
        valid = 20 if batch == 1 else 12 + (16 * i) // (batch - 1)
        pad[i, TP - 32 + valid:] = False
    mask = prefix_mask(pad) if prefix else suffix_mask(pad, TS, pi05=False)
    if mask.shape[-1] < tk:  # the static cache's alignment keys: never attended
        mask = torch.cat([mask, mask.new_zeros(*mask.shape[:-1], tk - mask.shape[-1])], dim=-1)
    return q, k, v, mask, eager_attention(q.float(), k.float(), v.float(), mask)


def effective_splits(tk: int, batch: int, rows: int, cfg: dict) -> int:
    """The key splits the kernel runs for `cfg`: its pick where splits is None, and any count rounded as
    suffix_attention rounds it (whole key tiles a split: with 600 keys in 32-key tiles, 6 splits run as 5)."""
    splits = cfg["splits"] or default_splits(tk, cfg["block_n"], batch * triton.cdiv(rows, cfg["block_m"]))
    return whole_tile_splits(tk, cfg["block_n"], splits)[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--prefix", action="store_true", help="the prefix's shape (544 x 544, one pass) against SDPA")
    p.add_argument("--batch", type=int, default=B, help="samples (the step's shape only): libero-pi0-b4 / -b8")
    p.add_argument("--splits-only", action="store_true", help="only the key splits, on the default tiles (the step's shape)")
    args = p.parse_args()
    if args.prefix and (args.batch != B or args.splits_only):
        raise SystemExit("--batch, --splits-only: the step's shape only")
    q, k, v, mask, ref = make_case(args.prefix, args.batch)
    # the kernel's mask as the engine's step passes it (uint8 rows padded to 16 bytes, made once a call); the
    # baseline and the prefix take the bool mask (prefix_attention aligns its own)
    kmask = mask if args.prefix else aligned_mask(mask)
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
        split_choices = (None, 2, 4, 8) if args.batch == 1 else (None, 1, 2, 3, 5, 8)
        row_choices = (32, 64) if args.batch == 1 else (16, 32, 64)
        configs = [dict(block_m=bm, block_n=bn, splits=sp, num_warps=nw, num_stages=st)
                   for bm in row_choices for bn in (32, 64) for sp in split_choices
                   for nw in (4, 8) for st in (1, 2)]
        if args.splits_only:
            configs = [dict(block_m=32, block_n=32, splits=sp, num_warps=4, num_stages=2) for sp in (None, *range(1, 9))]
        elif args.batch > 1:  # the merge's head dim in parts, on the kernel's default tiles (block_d None: fitted)
            configs += [dict(block_m=32, block_n=32, splits=None, num_warps=4, num_stages=2, block_d=bd)
                        for bd in (256, 128, 64, 32)]
    t_folded = graph_time_ms(baseline)
    print(f"{baseline_name:34s}  {t_folded * 1e3:6.1f} us  rel {rel(baseline()):.1e}")
    rows = []
    for cfg in configs:
        try:
            err = rel(suffix_attention(q, k, v, kmask, **cfg))
            t = graph_time_ms(lambda: suffix_attention(q, k, v, kmask, **cfg))
            rows.append({**cfg, "effective_splits": effective_splits(tk, q.shape[0], q.shape[1] * tq, cfg), "ms": t,
                         "rel_l2": err})
        except Exception as e:  # a configuration the compiler rejects (shared memory, registers)
            rows.append({**cfg, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    ok = sorted((r for r in rows if "ms" in r and r["rel_l2"] < 1e-2), key=lambda r: r["ms"])
    # the kernel's own defaults (suffix_attention's signature) for the step's shape
    tiles = PREFIX_TILES if args.prefix else {"block_m": 32, "block_n": 32, "splits": None, "num_warps": 4, "num_stages": 2}
    if args.prefix:  # the prefix's splits are picked for its shape (suffix_attention.prefix_splits)
        tiles = {**tiles, "splits": prefix_splits(q.shape[0] * triton.cdiv(q.shape[1] * q.shape[2], tiles["block_m"]))}
    default = next(r for r in rows if r == {**r, **tiles} and "block_d" not in r)
    print(f"default config                      {default.get('ms', float('nan')) * 1e3:6.1f} us  rel {default.get('rel_l2', float('nan')):.1e}"
          f"  {default.get('error', '')}")
    shown = rows if args.splits_only else ok[:8] + [r for r in rows if "block_d" in r and "ms" in r]
    for r in (r for r in shown if "ms" in r):
        print(f"bm={r['block_m']:2d} bn={r['block_n']:2d} splits={str(r['splits']):4s} ({r['effective_splits']}) warps={r['num_warps']} stages={r['num_stages']}"
              f" block_d={str(r.get('block_d')):4s}  {r['ms'] * 1e3:6.1f} us  rel {r['rel_l2']:.1e}")
    bad = [r for r in rows if "ms" in r and r["rel_l2"] >= 1e-2]
    print(f"{len(ok)} configs correct, {len(bad)} wrong (rel >= 1e-2), {sum('error' in r for r in rows)} rejected")
    if args.json:
        workload = "libero-pi0" if args.batch == 1 else f"libero-pi0-b{args.batch}"
        fastest = {k: v for k, v in ok[0].items() if k not in ("ms", "rel_l2")} if ok else None
        out = {"schema": SCHEMA, "command": "kernel-bench", "workload": {"id": workload, "overrides": {"query_rows": N * tq, "keys": tk}},
               "variant": {"levers": [], "label": label, "dtype": "bfloat16"}, "mode": None,
               "env": environment_record("cuda"), "folded_ms": t_folded, "baseline": baseline_name, "configs": rows,
               "batch": args.batch, "default": tiles, "fastest": fastest, "splits_only": args.splits_only,
               "kernel_mask": "bool" if args.prefix else "aligned uint8"}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
