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

from engine_ab import ab_result, finish, interleave  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.check import check_equivalence
from vlaperf.engine import Engine, loop
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.timing import require_cuda
from vlaperf.workloads import get_workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    real = loop.head_linear
    loop.head_linear = lambda x, weight, bias, kernels: real(x, weight, bias, False)  # noqa: E731
    cublas = Engine(model, args.levers)
    out_cublas = cublas.sample_actions(obs, noise, w.steps)  # compiled and captured with cuBLAS heads
    loop.head_linear = real
    kernel = Engine(model, args.levers)
    out_kernel = kernel.sample_actions(obs, noise, w.steps)
    samples = interleave({"cublas_heads": lambda: cublas.sample_actions(obs, noise, w.steps),
                          "kernel_heads": lambda: kernel.sample_actions(obs, noise, w.steps)}, args.rounds)
    result = ab_result("heads-ab", w, model, kernel, samples, "cublas_heads", "kernel_heads")
    result["rel_l2_kernel_vs_cublas_heads"] = ((out_kernel - out_cublas).norm() / out_cublas.norm()).item()
    result["equivalence_kernel_heads"] = check_equivalence(model, kernel, w)
    finish(result, "rel_l2_kernel_vs_cublas_heads", "equivalence_kernel_heads", args.json)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
