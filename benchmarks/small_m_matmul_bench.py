"""GPU check of vlaperf.engine.kernels.small_m_matmul on the expert's shapes (M = 51).

For each of the four per-layer matmuls of the pi0 expert it checks bf16 correctness against
a float32 reference, then times cuBLAS (F.linear + the elementwise ops the fused version
replaces) and several kernel configurations with CUDA-graph replays, and prints achieved
weight bandwidth. Writes a vlaperf.result/1 JSON when --json is given.

    python benchmarks/small_m_matmul_bench.py --json $OUT/small_m_matmul.json
    python benchmarks/small_m_matmul_bench.py --heads --json $OUT/small_m_matmul_heads.json

--heads times the denoise step's float32 heads instead (pi0: action in 32 -> 1024, the time
MLP's 1024 -> 1024, action out 1024 -> 32, each + bias, 50 rows) against cuBLAS, with full
float32 products ("ieee", FMA) and with three TF32 tensor-core products ("tf32x3"); a tiling
counts only within 1e-5 of float32. (Session 5 measured "ieee" no faster than cuBLAS in the
engine: docs/perf-notes.md, version 17.)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from kernel_timing import graph_time_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.kernels.small_m_matmul import small_m_matmul
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda

M, D, HID, QKV, O_IN = 51, 1024, 4096, 2048 + 512, 2048
EPS = 1e-6


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--heads", action="store_true", help="the step's float32 heads instead of the expert's bf16 matmuls")
    args = p.parse_args()
    if args.heads:
        return heads(args.json)
    torch.manual_seed(0)
    dev = "cuda"
    bf = torch.bfloat16
    x = torch.randn(M, D, device=dev, dtype=bf)
    xo = torch.randn(M, O_IN, device=dev, dtype=bf)
    xh = torch.randn(M, HID, device=dev, dtype=bf)
    res = torch.randn(M, D, device=dev, dtype=bf)
    w = {
        "qkv": torch.randn(QKV, D, device=dev, dtype=bf) / D**0.5,
        "o": torch.randn(D, O_IN, device=dev, dtype=bf) / O_IN**0.5,
        "gate": torch.randn(HID, D, device=dev, dtype=bf) / D**0.5,
        "up": torch.randn(HID, D, device=dev, dtype=bf) / D**0.5,
        "down": torch.randn(D, HID, device=dev, dtype=bf) / HID**0.5,
    }

    def rms(t):
        tf = t.float()
        return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + EPS)).to(bf)

    cases = {
        # name: (cuBLAS path incl. the elementwise it replaces, kernel call(**cfg), reference fp32, weight bytes)
        "qkv (rms prologue)": (lambda: F.linear(rms(x), w["qkv"]),
                               lambda **c: small_m_matmul(x, w["qkv"], rms_eps=EPS, **c),
                               lambda: F.linear(rms(x).float(), w["qkv"].float()), w["qkv"].numel() * 2),
        "o_proj (+residual)": (lambda: res + F.linear(xo, w["o"]),
                               lambda **c: small_m_matmul(xo, w["o"], residual=res, **c),
                               lambda: res.float() + xo.float() @ w["o"].float().T, w["o"].numel() * 2),
        "gate_up (rms + geglu)": (lambda: F.gelu(F.linear(rms(x), w["gate"]), approximate="tanh") * F.linear(rms(x), w["up"]),
                                  lambda **c: small_m_matmul(x, w["gate"], w_up=w["up"], rms_eps=EPS, **c),
                                  lambda: F.gelu(rms(x).float() @ w["gate"].float().T, approximate="tanh") * (rms(x).float() @ w["up"].float().T),
                                  2 * w["gate"].numel() * 2),
        "down (+residual)": (lambda: res + F.linear(xh, w["down"]),
                             lambda **c: small_m_matmul(xh, w["down"], residual=res, **c),
                             lambda: res.float() + xh.float() @ w["down"].float().T, w["down"].numel() * 2),
    }
    configs = [dict(block_n=bn, block_k=bk, split_k=sk) for bn in (16, 32, 64) for bk in (64, 128, 256) for sk in (None, 1, 2, 4)]
    write(args.json, run_cases(cases, configs, tolerance=1e-2), "small_m_matmul", "bfloat16", M)


def run_cases(cases: dict, configs: list[dict], tolerance: float) -> list[dict]:
    """Each case: cuBLAS and every kernel configuration, timed with CUDA-graph replays; the
    fastest configuration within `tolerance` (relative L2 against float32) is the case's best."""
    rows = []
    for name, (cublas, kernel, reference, nbytes) in cases.items():
        ref = reference()
        t_cublas = graph_time_ms(cublas)
        row = {"case": name, "weight_bytes": nbytes, "cublas_ms": t_cublas, "cublas_tb_s": nbytes / t_cublas / 1e9,
               "cublas_rel_l2": rel(cublas(), ref), "tolerance": tolerance, "configs": []}
        for cfg in configs:
            try:
                err = rel(kernel(**cfg), ref)
                t = graph_time_ms(lambda: kernel(**cfg))
                row["configs"].append({**cfg, "ms": t, "tb_s": nbytes / t / 1e9, "rel_l2": err})
            except Exception as e:  # a config the compiler rejects (shared memory, registers)
                row["configs"].append({**cfg, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        ok = [c for c in row["configs"] if "ms" in c and c["rel_l2"] < tolerance]
        best = min(ok, key=lambda c: c["ms"]) if ok else None
        row["best"] = best
        rows.append(row)
        print(f"{name:28s} cuBLAS {t_cublas * 1e3:7.1f} us ({row['cublas_tb_s']:.2f} TB/s)  "
              + (f"kernel {best['ms'] * 1e3:7.1f} us ({best['tb_s']:.2f} TB/s, rel {best['rel_l2']:.1e}) "
                 f"bn={best['block_n']} bk={best['block_k']} split={best['split_k']} {best.get('precision', '')}"
                 if best else "kernel: no passing config"))
    return rows


def write(path: str | None, rows: list[dict], label: str, dtype: str, rows_m: int) -> None:
    if path:
        out = {"schema": SCHEMA, "command": "kernel-bench", "workload": {"id": "libero-pi0", "overrides": {"rows": rows_m}},
               "variant": {"levers": [], "label": label, "dtype": dtype}, "mode": None,
               "env": environment_record("cuda"), "cases": rows}
        with open(path, "w") as f:
            json.dump(out, f, indent=2)


def heads(path: str | None) -> None:
    """The step's float32 heads (pi0, batch 1: 50 action rows), bias as a broadcast residual."""
    torch.manual_seed(0)
    dev, rows_m, A = "cuda", 50, 32
    shapes = {"action in (32 -> 1024)": (A, D), "time MLP out (1024 -> 1024)": (D, D), "action out (1024 -> 32)": (D, A)}
    cases = {}
    for name, (k, n) in shapes.items():
        x = torch.randn(rows_m, k, device=dev)
        w, b = torch.randn(n, k, device=dev) / k**0.5, torch.randn(n, device=dev)
        cases[name] = (lambda x=x, w=w, b=b: F.linear(x, w, b),
                       lambda x=x, w=w, b=b, **c: small_m_matmul(x, w, residual=b.expand(x.shape[0], -1), **c),
                       lambda x=x, w=w, b=b: (x.double() @ w.double().T + b.double()).float(), w.numel() * 4)
    configs = [dict(block_n=bn, block_k=bk, split_k=sk, precision=pr) for pr in ("ieee", "tf32x3")
               for bn in (16, 32) for bk in (64, 128) for sk in (None, 4)]
    write(path, run_cases(cases, configs, tolerance=1e-5), "small_m_matmul float32 heads", "float32", rows_m)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
