"""One engine called from two threads at once on the GPU (CUDA graphs, the step kernel): every result must
equal the same call made alone. Engine.sample_actions serializes its calls (its static KV cache and graph
input buffers are its own); tests/test_engine.py checks the same on the CPU.

    python benchmarks/engine_threads_check.py --workload libero-pi0 --levers best
"""

from __future__ import annotations

import argparse
import threading

import torch

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.workloads import get_workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.model_config(), args.device)
    engine = Engine(model, args.levers)
    cases = [(random_observation(w, model.config, args.device, seed=s), random_noise(w, model.config, args.device, seed=s))
             for s in (1, 2)]
    expected = [engine.sample_actions(o, n, w.steps).clone() for o, n in cases]
    wrong, done = [], []

    def run(i: int) -> None:
        for _ in range(args.calls):
            out = engine.sample_actions(*cases[i], w.steps)
            wrong.append(not torch.equal(out, expected[i]))
            done.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"engine threads check {args.workload} {engine.name}: {len(done)} calls from 2 threads, "
          f"{sum(wrong)} differ from the call made alone")
    raise SystemExit(1 if any(wrong) or len(done) != 2 * args.calls else 0)


if __name__ == "__main__":
    main()
