"""Which specializations of each engine kernel a process compiled: after one call of a fresh
engine, every key in each Triton kernel's cache, and where the keys of one kernel differ. A
kernel with two keys was compiled twice, e.g. when the first call's kernel-compile thread
(Engine._precompile_kernels) saw arguments that specialize differently from the compiled path's.

    python benchmarks/kernel_keys.py --workload libero-pi05 > $OUT/kernel_keys_libero-pi05.txt
"""

from __future__ import annotations

import argparse
import re
import tempfile

from vlaperf.engine.compile import use_compile_cache
from vlaperf.timing import require_cuda


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi05")
    p.add_argument("--levers", default="best")
    args = p.parse_args()
    use_compile_cache(tempfile.mkdtemp())  # empty caches: every kernel compiles in this process
    import torch

    from vlaperf.engine import Engine
    from vlaperf.engine.kernels import expert_step, rope_qkv, small_m_matmul, suffix_attention
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    engine = Engine(model, args.levers)
    engine.sample_actions(obs, noise, w.steps)
    torch.cuda.synchronize()
    print(f"{w.id} {engine.name}; kernel-compile thread error: {engine.precompile_error!r}")
    for module in (expert_step, rope_qkv, small_m_matmul, suffix_attention):
        for name in sorted(vars(module)):
            kernel = getattr(module, name)
            if not hasattr(kernel, "device_caches"):
                continue
            keys = [str(k) for entry in kernel.device_caches.values() for k in entry[0]]
            print(f"{module.__name__.split('.')[-1]}.{name}: {len(keys)} key(s)")
            if len(keys) > 1:
                parts = [re.split(r",\s*", k) for k in keys]
                for i, column in enumerate(zip(*parts)):
                    if len(set(column)) > 1:
                        print(f"  differ at field {i}: " + " | ".join(column))
                if len({len(x) for x in parts}) > 1:
                    print("  keys of different lengths:", [len(x) for x in parts])


if __name__ == "__main__":
    require_cuda(__file__)
    main()
