"""`compile`: torch.compile of the prefix and of one denoise step (not the whole call).

Compiling the step once and running it N times keeps first-call compile time to what two
functions cost, instead of tracing N unrolled steps (LeRobot compiles the whole sampler and
its first call takes minutes). `fullgraph=True` turns any graph break into an error, and
`dynamic=False` keeps shapes static: new prompt lengths map to a few buckets (prefix.py).
"""

from __future__ import annotations

import os
import shutil

import torch


class CompileUnavailable(RuntimeError):
    pass


def compile_blockers(backend: str = "inductor") -> list[str]:
    """Reasons torch.compile would be silently off or fail here (seed 000 lost weeks to the first)."""
    reasons = []
    for var in ("TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE"):
        if os.environ.get(var, "") not in ("", "0"):
            reasons.append(f"{var}={os.environ[var]} disables torch.compile (it would run eager, silently)")
    if backend == "inductor" and not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        reasons.append("no C compiler (cc/gcc/clang) on PATH: inductor cannot build its kernels' launchers")
    return reasons


def compile_fn(fn, mode: str, backend: str = "inductor"):
    blockers = compile_blockers(backend)
    if blockers:
        raise CompileUnavailable("compile lever cannot apply: " + "; ".join(blockers))
    # Each prompt bucket / image layout is a distinct static shape; allow a few of them.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    if backend != "inductor":
        return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
    return torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)
