"""What a graphed call costs besides its kernels: the whole `sample_actions` against the graph
replay alone and the input copies alone (per tensor, and in one `_foreach_copy_`), interleaved
in one process, each synced and timed on the host clock (no profiler: CUPTI's kernel tracing
adds its own launch cost to graphs). Also the host cost of the contexts every engine call enters
(`contexts_host_us`): the engine's GPU made current, and the check for the caller's inference
mode, each entered and left in a loop of 20,000 (too short to resolve against a synced call).

    python benchmarks/call_overhead.py --workload libero-pi0 --json $OUT/call_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
from engine_ab import interleave  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine import Engine
from vlaperf.engine.engine import _out_of_inference_mode
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda
from vlaperf.workloads import get_workload


def context_us(make, loops: int = 20_000, repeats: int = 21) -> float:
    """Median host microseconds to enter and leave the context `make()` returns (its construction included)."""
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            with make():
                pass
        per_call.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(per_call)


def contexts_host_us(engine: Engine) -> dict[str, float]:
    """The per-call contexts of `Engine.sample_actions`, each against an empty context, outside and inside
    torch.inference_mode() (where the check enters inference_mode(False))."""
    result = {"nullcontext": context_us(contextlib.nullcontext),
              "engine_device_current": context_us(engine._on_device),
              "out_of_inference_mode_outside": context_us(_out_of_inference_mode)}
    with torch.inference_mode():
        result["out_of_inference_mode_inside"] = context_us(_out_of_inference_mode)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    engine = Engine(model, args.levers)
    engine.sample_actions(obs, noise, w.steps)
    if engine.graphs is None:
        raise SystemExit("call_overhead.py needs an engine with cuda_graph")
    (entry,) = engine.graphs.entries.values()
    inputs = [obs.images, obs.image_mask, obs.tokens, obs.token_mask, obs.state, noise]

    def copies():  # one copy_ per input, as GraphCache.run did before session 8
        for static, x in zip(entry.static_inputs, inputs):
            static.copy_(x, non_blocking=True)

    samples = interleave({"call": lambda: engine.sample_actions(obs, noise, w.steps),
                          "replay": entry.graph.replay, "copies": copies,
                          "copies_foreach": lambda: torch._foreach_copy_(entry.static_inputs, inputs, non_blocking=True),
                          "output_clone": entry.output.clone, "sync_only": lambda: None}, args.rounds)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    contexts = contexts_host_us(engine)
    result = {"schema": SCHEMA, "command": "call-overhead", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record("cuda"), "rounds": args.rounds, "median_ms": medians,
              "input_bytes": sum(x.numel() * x.element_size() for x in inputs),
              "contexts_host_us": contexts, "samples_ms": samples}
    print(json.dumps(medians))
    print(json.dumps({"contexts_host_us": contexts}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
