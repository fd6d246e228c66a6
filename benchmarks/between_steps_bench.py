"""`_between_steps_kernel` alone on pi0's shapes (kernels/denoise_loop.py): every tiling, timed
over many launches, each checked against the same math in float32 torch.

    python benchmarks/between_steps_bench.py --json $OUT/kernel_between_steps.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from vlaperf.engine.kernels.denoise_loop import between_steps
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record


def make(H=50, A=32, D=1024, L=18, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    heads = {"w_out": r(A, D, scale=D**-0.5), "b_out": r(A, scale=0.1), "w_proj": r(D, A, scale=A**-0.5),
             "w_mlp": r(D, D, scale=D**-0.5), "b_mlp": r(D, scale=0.1), "state": r(D).bfloat16()}
    x = r(H + 1, D).bfloat16()
    return dict(x=x, xt=r(H, A), heads=heads, time_row=r(D, scale=0.1), scale=1.0 + r(D, scale=0.1),
                counters=(torch.ones(L * 8, dtype=torch.int32, device=device), torch.ones(L * 300, dtype=torch.int32, device=device)))


def reference(d, dt, eps):
    x, h = d["x"][1:].float(), d["heads"]
    xn = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * d["scale"]).bfloat16().float()
    xt = d["xt"] + dt * F.linear(xn, h["w_out"], h["b_out"])
    tokens = F.linear(F.silu(F.linear(xt, h["w_proj"]) + d["time_row"]), h["w_mlp"], h["b_mlp"])
    return xt, tokens


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    d = make()
    dt, eps = -0.1, 1e-6
    ref_xt, ref_tok = reference(d, dt, eps)
    tok, xt_out = torch.empty_like(d["x"]), torch.empty_like(d["xt"])
    rows = []
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (32, 64, 128, 256), (4, 8), (1, 2, 3)):
        run = lambda: between_steps(d["x"], tok, d["xt"], xt_out, d["heads"], d["time_row"], dt, eps, 1,  # noqa: E731
                                    d["counters"], d["scale"], block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
        row = {"config": [bn, bk, warps, stages]}
        try:
            run()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                run()
            end.record()
            torch.cuda.synchronize()
            row["us"] = start.elapsed_time(end) * 1e3 / args.iters
            row["rel_l2_xt"] = ((xt_out - ref_xt).norm() / ref_xt.norm()).item()
            row["rel_l2_tokens"] = ((tok[1:].float() - ref_tok).norm() / ref_tok.norm()).item()
            row["state_row_ok"] = bool(torch.equal(tok[0], d["heads"]["state"]))
        except Exception as e:  # tiles that do not fit: recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(row, flush=True)
    ok = [r for r in rows if "us" in r and r["rel_l2_xt"] < 1e-3 and r["rel_l2_tokens"] < 1e-2 and r["state_row_ok"]]
    best = min(ok, key=lambda r: r["us"]) if ok else None
    print("fastest correct:", best)
    if args.json:
        result = {"schema": SCHEMA, "command": "kernel-bench", "kernel": "between_steps",
                  "variant": {"label": "between_steps", "levers": [], "dtype": "bfloat16"}, "workload": {"id": "libero-pi0", "overrides": {}},
                  "env": environment_record("cuda"), "shapes": {"H": 50, "A": 32, "D": 1024}, "rows": rows, "fastest": best}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
