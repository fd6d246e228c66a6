"""Does a TMA load raise the per-program load rate of the step kernel's matmul tasks?

The step kernel's matmul tasks (docs/perf-notes.md, sessions 5-6) each move 20-45 KB a
microsecond, whatever they read (HBM or L2), far below what one SM can pull from L2. They load
with plain pointer loads that Triton pipelines as 16-byte asynchronous copies, one per thread
per chunk. This probe isolates that: a persistent kernel streams 18 layers of one of the
expert's weight matrices against 51 activation rows, with the step kernel's tiling (64-row
blocks, BN columns x BK deep, split K in KS slices), no barriers and no epilogue, and loads
either through pointers (as the step kernel does) or through TMA descriptors (one bulk copy a
tile, issued by one thread), for the weights only or for both operands. Same shapes, same
tasks a program, interleaved in one process.

    python benchmarks/tma_probe.py --json $OUT/tma_probe.json
    python benchmarks/tma_probe.py --l2 --json $OUT/tma_probe_l2.json

--l2: pointer loads only, weights streamed from HBM (18 distinct layers) against weights
resident in L2 (every layer reads layer 0's), at 3-6 pipeline stages: does a task read faster
when its weights are in L2, i.e. would prefetching a phase's weights into L2 pay?
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

M, BLOCK_M, LAYERS = 51, 64, 18
# (name, N, K, BN, BK, KS): the step kernel's tasks for pi0's expert (width 1024, MLP 4096)
SHAPES = [
    ("gate_up", 8192, 1024, 64, 128, 1),   # 128 tiles of gate 32 + up 32 columns
    ("qkv", 2560, 1024, 32, 128, 1),       # 80 tiles
    ("down", 1024, 4096, 32, 256, 4),      # 32 tiles x 4 K-slices = 128 tasks
]


@triton.jit
def _stream_kernel(x_src, w_src, out_ptr, M, N: tl.constexpr, K: tl.constexpr, L: tl.constexpr, LW: tl.constexpr,
                   BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr,
                   STAGES: tl.constexpr, X_TMA: tl.constexpr, W_TMA: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    K_SLICE: tl.constexpr = K // KS
    for layer in range(L):
        wl = layer % LW  # LW distinct weight layers: 1 keeps them in L2
        for task in range(pid, (N // BN) * KS, nprog):
            tile = task // KS
            s = task % KS
            cols = tile * BN + tl.arange(0, BN)
            acc = tl.zeros((BLOCK_M, BN), tl.float32)
            for k0 in tl.range(s * K_SLICE, (s + 1) * K_SLICE, BK, num_stages=STAGES):
                if X_TMA:  # rows past M come back as zeros (the descriptor's shape is M x K)
                    a = x_src.load([0, k0])
                else:
                    ks = k0 + tl.arange(0, BK)
                    a = tl.load(x_src + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0)
                if W_TMA:
                    w = w_src.load([wl * N + tile * BN, k0])
                else:
                    ks = k0 + tl.arange(0, BK)
                    w = tl.load(w_src + (wl * N + cols[:, None]).to(tl.int64) * K + ks[None, :])
                acc = tl.dot(a, tl.trans(w), acc)
            out = out_ptr + ((layer * KS + s) * BLOCK_M + rows[:, None]) * N + cols[None, :]
            tl.store(out, acc, mask=row_ok[:, None])


def run(x, w, out, N, K, BN, BK, KS, warps, stages, mode, programs, lw=LAYERS):
    x_src = TensorDescriptor.from_tensor(x, [BLOCK_M, BK]) if mode == "tma_both" else x
    w_src = TensorDescriptor.from_tensor(w, [BN, BK]) if mode in ("tma_w", "tma_both") else w
    _stream_kernel[(programs,)](x_src, w_src, out, M, N, K, LAYERS, lw, BLOCK_M, BN, BK, KS, stages,
                                mode == "tma_both", mode in ("tma_w", "tma_both"), num_warps=warps)


def time_us(fn, reps=20, rounds=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="8 warps, 4 stages only")
    p.add_argument("--l2", action="store_true", help="pointer loads, weights from HBM against weights in L2")
    args = p.parse_args()
    torch.manual_seed(0)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, N, K, BN, BK, KS in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(LAYERS * N, K, device="cuda", dtype=torch.bfloat16) / K**0.5).contiguous()
        out = torch.zeros(LAYERS * KS * BLOCK_M, N, device="cuda", dtype=torch.float32)
        ref = torch.stack([x.float() @ w[i * N:(i + 1) * N].float().T for i in (0, LAYERS - 1)])
        ref_l2 = torch.stack([x.float() @ w[:N].float().T] * 2)
        w_bytes = w.numel() * 2
        tasks = (N // BN) * KS
        per_task = (BLOCK_M * K // KS + BN * K // KS) * 2  # activation + weight bytes a task loads
        for warps in ((8,) if args.quick else (4, 8)):
            for stages in ((4,) if args.quick else (3, 4, 5, 6) if args.l2 else (3, 4)):
                if args.l2:  # mode names the weights' source; lw = distinct weight layers
                    cfgs = {src: dict(N=N, K=K, BN=BN, BK=BK, KS=KS, warps=warps, stages=stages, mode="ptr",
                                      programs=programs, lw=lw) for src, lw in (("hbm", LAYERS), ("l2", 1))}
                else:
                    cfgs = {mode: dict(N=N, K=K, BN=BN, BK=BK, KS=KS, warps=warps, stages=stages, mode=mode,
                                       programs=programs) for mode in ("ptr", "tma_w", "tma_both")}
                results = {}
                for mode, cfg in cfgs.items():
                    try:
                        out.zero_()
                        run(x, w, out, **cfg)
                        got = out.view(LAYERS, KS, BLOCK_M, N)[[0, LAYERS - 1]].sum(1)[:, :M]
                        want = ref_l2 if cfg.get("lw") == 1 else ref
                        err = ((got - want).norm() / want.norm()).item()
                        results[mode] = {"rel_l2": err}
                    except Exception as e:  # a tiling the compiler or the descriptor rejects
                        results[mode] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                # interleaved: each round times every mode once
                for mode in cfgs:
                    results[mode]["us_rounds"] = []
                for _ in range(3):
                    for mode, cfg in cfgs.items():
                        if "error" not in results[mode]:
                            results[mode]["us_rounds"].append(time_us(lambda: run(x, w, out, **cfg)))
                for mode, r in results.items():
                    cfg = cfgs[mode]
                    row = {"shape": name, "N": N, "K": K, "BN": BN, "BK": BK, "KS": KS, "warps": warps,
                           "stages": stages, "mode": mode, "tasks_per_layer": tasks, **r}
                    if r.get("us_rounds"):
                        us = min(r["us_rounds"])
                        tasks_per_prog = -(-tasks // programs)
                        streamed = w_bytes * cfg.get("lw", LAYERS) // LAYERS  # bytes of distinct weights
                        row.update(us=us, weights_tb_per_s=w_bytes / us / 1e6, distinct_weight_bytes=streamed,
                                   kb_per_us_per_program=tasks_per_prog * per_task * LAYERS / us / 1e3)
                        print(f"{name:8s} w{warps} s{stages} {mode:8s} {us:8.1f} us  weights {row['weights_tb_per_s']:.2f} TB/s"
                              f"  {row['kb_per_us_per_program']:5.1f} KB/us a program  rel {r['rel_l2']:.1e}")
                    else:
                        print(f"{name:8s} w{warps} s{stages} {mode:8s} {r.get('error')}")
                    rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": SCHEMA, "command": "kernel-bench",
                       "workload": {"id": "libero-pi0", "overrides": {"rows": M, "layers": LAYERS}},
                       "variant": {"levers": [], "label": "tma_probe_l2" if args.l2 else "tma_probe", "dtype": "bfloat16"}, "mode": None,
                       "env": environment_record("cuda"), "programs": programs, "configs": rows}, f, indent=2)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
