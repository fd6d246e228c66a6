"""The prefix attention's key splits against its row count (session 36): the kernel alone (partials and merge), each
split count from 1 to 6 at the prefix shapes that pi0's and pi0.5's prompt buckets make, in CUDA-graph replays,
beside what `suffix_attention.prefix_splits` picks and the fixed 3 of before session 36. (The file of session 36's
part d was written before `prefix_splits` existed: its "model_pick" is a wave model without the partials' traffic,
which that run showed wrong, and "today" the fixed 3.)

Part c of session 36 timed the kernel at 35.8 us for 712 prefix rows and 34.3 for 720 against 24.0 for 704: with 64
rows a block and 3 splits, 704 rows make 88 x 3 = 264 programs (one wave at two a multiprocessor on 132), 712 and
720 three and six more. This says which split count each shape wants, and whether the wave model picks it.

    python benchmarks/prefix_splits_probe.py --json $OUT/prefix_splits_probe.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.attention import prefix_mask
from vlaperf.engine.kernels.suffix_attention import PREFIX_TILES, aligned_mask, prefix_attention, prefix_splits
from vlaperf.models.pi0 import eager_attention
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

# (batch, prefix rows): two images and pi0's buckets 8-48, pi0.5's 64, 128 and its cut 200; 1 and 3 images; batches
CASES = [(1, t) for t in (520, 528, 544, 560, 576, 640, 704, 712, 720, 776, 800, 968, 264, 456)] + [(4, 544), (8, 544)]
N, H = 8, 256


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--splits", default="1,2,3,4,5,6")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    result = {"schema": SCHEMA, "command": "prefix-splits-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": ["triton_kernels"], "label": "prefix attention key splits", "dtype": "bfloat16"},
              "mode": None, "env": environment_record(dev), "tiles": PREFIX_TILES, "rows": []}
    for batch, T in CASES:
        torch.manual_seed(0)
        q = torch.randn(batch, N, T, H, device=dev, dtype=bf)
        k, v = (torch.randn(batch, 1, T, H, device=dev, dtype=bf) for _ in range(2))
        pad = torch.ones(batch, T, dtype=torch.bool, device=dev)
        pad[:, T - 8:] = False  # a few padded prompt slots, as a bucket leaves
        mask = aligned_mask(prefix_mask(pad))
        ref = eager_attention(q.float(), k.float(), v.float(), mask.bool())
        blocks = batch * triton.cdiv(N * T, PREFIX_TILES["block_m"])
        row = {"batch": batch, "rows": T, "blocks": blocks, "model_pick": prefix_splits(blocks),
               "today": 3, "us": {}, "rel_l2": {}}
        for s in (int(x) for x in args.splits.split(",")):
            fn = lambda s=s: prefix_attention(q, k, v, mask, splits=s)  # noqa: E731
            out = fn().float()
            valid = pad[:, None, :, None]
            row["rel_l2"][s] = ((out - ref) * valid).norm().item() / (ref * valid).norm().item()
            row["us"][s] = round(graph_time_ms(fn, reps=100) * 1e3, 2)
        best = min(row["us"], key=row["us"].get)
        row["best"] = best
        print(f"b{batch} {T:4d} rows: " + " ".join(f"s{s} {u:6.2f}" for s, u in row["us"].items())
              + f" | best s{best}, prefix_splits s{row['model_pick']} ({row['us'][row['model_pick']] / row['us'][best]:.3f}x "
              f"of best), before s{row['today']} ({row['us'][row['today']] / row['us'][best]:.3f}x)", flush=True)
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
