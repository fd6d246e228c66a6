"""Run the step kernel a few times on pi0's expert shapes: a target for Nsight Compute.

    ncu --clock-control none -k regex:_expert_step_kernel -s 2 -c 1 --set full \\
        python3 benchmarks/step_kernel_once.py att_bm=16 splits=5

Arguments are StepKernelConfig fields (name=value), as in kernel_resources.py.
"""

from __future__ import annotations

import sys
from dataclasses import fields, replace

import torch

from expert_step_bench import make_inputs  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.kernels import expert_step as S
from vlaperf.timing import require_cuda


def parse_config(argv: list[str]) -> S.StepKernelConfig:
    types = {f.name: f.type for f in fields(S.StepKernelConfig)}
    overrides = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in types:
            raise SystemExit(f"unknown StepKernelConfig field {key!r}; expected one of: {', '.join(types)}")
        overrides[key] = value.lower() in ("1", "true", "yes") if types[key] in (bool, "bool") else int(value)
    return replace(S.StepKernelConfig(), **overrides)


def main() -> None:
    cfg = parse_config(sys.argv[1:])
    inputs = make_inputs("cuda")
    for _ in range(3):
        S.expert_step(*inputs, config=cfg)
    torch.cuda.synchronize()
    print(cfg)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
