"""The denoise step's float32 heads through the small_m_matmul kernel (what `triton_kernels`
does since session 6: three TF32 tensor-core products, "tf32x3") against cuBLAS, in one
process, interleaved. (Session 5 ran it with float32 FMA products: 0.999x, taken out again.)

Both engines run `best`; the only difference is `vlaperf.engine.loop.head_linear`, which the
first engine is captured with forced to F.linear (cuBLAS). With cuda_graph the captured call
does not go back through Python, so the two can be replayed side by side afterwards.

    python benchmarks/heads_ab.py --workload libero-pi0 --json $OUT/heads_ab_libero-pi0.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlaperf.check import check_equivalence
from vlaperf.engine import Engine, loop
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record
from vlaperf.workloads import get_workload


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.preset, "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    real = loop.head_linear
    loop.head_linear = lambda x, weight, bias, kernels: real(x, weight, bias, False)  # noqa: E731
    cublas = Engine(model, args.levers)
    out_cublas = cublas.sample_actions(obs, noise, w.steps)  # compiled and captured with cuBLAS heads
    loop.head_linear = real
    kernel = Engine(model, args.levers)
    out_kernel = kernel.sample_actions(obs, noise, w.steps)
    variants = {"cublas_heads": lambda: cublas.sample_actions(obs, noise, w.steps),
                "kernel_heads": lambda: kernel.sample_actions(obs, noise, w.steps)}
    for fn in variants.values():
        for _ in range(10):
            fn()
    samples = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            samples[name].append(timed(fn))
    ratios = [a / b for a, b in zip(samples["cublas_heads"], samples["kernel_heads"])]
    rel = ((out_kernel - out_cublas).norm() / out_cublas.norm()).item()
    result = {"schema": SCHEMA, "command": "heads-ab", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": kernel.levers.names(), "label": kernel.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record("cuda"), "rounds": args.rounds,
              "median_ms": {k: statistics.median(v) for k, v in samples.items()},
              "speedup_median": statistics.median(ratios),
              "speedup_p10_p90": [statistics.quantiles(ratios, n=10)[0], statistics.quantiles(ratios, n=10)[-1]],
              "rel_l2_kernel_vs_cublas_heads": rel,
              "equivalence_kernel_heads": check_equivalence(model, kernel, w), "samples_ms": samples}
    print(json.dumps({k: result[k] for k in ("median_ms", "speedup_median", "speedup_p10_p90", "rel_l2_kernel_vs_cublas_heads")}))
    print("equivalence:", result["equivalence_kernel_heads"]["passed"], result["equivalence_kernel_heads"]["rel_l2"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
