"""What the in-process A/B scripts share (heads_ab.py, step_config_ab.py): two engines that
differ in one change, replayed interleaved, one call of each per round, each call synced and
timed on the host clock; the speedup is the median of the per-round ratios (old over new)."""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import torch

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record


def timed(fn: Callable[[], object]) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def sleep_cycles_per_ms() -> float:
    """`torch.cuda._sleep`'s cycles per millisecond at the present clock (one timed sleep)."""
    torch.cuda._sleep(1_000_000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    torch.cuda.synchronize()
    return 20_000_000 / a.elapsed_time(b)


def interleave(variants: dict[str, Callable[[], object]], rounds: int, warmup: int = 10) -> dict[str, list[float]]:
    """Warm each variant up, then `rounds` rounds of one timed call each: wall ms per call."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(timed(fn))
    return samples


def ab_result(command: str, workload, model, engine, samples: dict[str, list[float]], old: str, new: str) -> dict:
    """The common part of an A/B result file: header, medians, per-round speedup old / new."""
    ratios = [a / b for a, b in zip(samples[old], samples[new])]
    deciles = statistics.quantiles(ratios, n=10)
    return {"schema": SCHEMA, "command": command, "workload": {"id": workload.id, "overrides": {}},
            "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
            "env": environment_record("cuda" if torch.cuda.is_available() else "cpu"), "rounds": len(ratios),
            "median_ms": {k: statistics.median(v) for k, v in samples.items()},
            "speedup_median": statistics.median(ratios), "speedup_p10_p90": [deciles[0], deciles[-1]], "samples_ms": samples}


def finish(result: dict, rel_key: str, equivalence_key: str, path: str | None) -> None:
    """Print the summary and the new side's equivalence; write the file if asked."""
    print(json.dumps({k: result[k] for k in ("median_ms", "speedup_median", "speedup_p10_p90", rel_key)}))
    print("equivalence:", result[equivalence_key]["passed"], result[equivalence_key]["rel_l2"])
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
