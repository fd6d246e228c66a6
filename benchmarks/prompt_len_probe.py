"""What a padded prompt token costs `best` (session 30): one engine, the same observation (libero-pi0's
20 valid prompt tokens), its kept prompt padded to several lengths by other bucket sets, the calls
interleaved in one process.

`trim_prompt_padding` pads the kept prompt up to the next of `prefix.PROMPT_BUCKETS` (8, 16, 32, ...):
libero-pi0's 20 tokens run as 32, 544 prefix rows. Session 30's in-graph breakdowns had the prefill at
3.71 ms with a 16-token prompt (policy mode's example) against 3.96 ms with 32 (model mode), in two
processes: 16 us a row, twice the prefill's average per row. If the rows past 20 cost that much here, a
finer bucket set (multiples of 8 below 64) would take ~0.1-0.2 ms off libero-pi0's call. Each length
is its own graph (and, under compile, its own compiled shape); every one is checked against the
reference first (the padding is masked: the actions change only by rounding).

    python3 benchmarks/prompt_len_probe.py --lengths 20,24,32,40,48 --json $OUT/prompt_len_probe.json
    python3 benchmarks/prompt_len_probe.py --valid 8 --lengths 8,12,16,32   # a short prompt: bucket 8 or 16?
    python3 benchmarks/prompt_len_probe.py --lengths 40,48 --kernels $OUT/kernels   # and each length's kernel table

--kernels DIR: after the timing, one call of each length under torch.profiler, its kernel table (GPU time by
kernel, as profile_kernels.py prints) written to DIR/kernels_prompt<length>.txt: what differs between two lengths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics

from engine_ab import interleave  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.check import compare
from vlaperf.engine import Engine, prefix
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record
from vlaperf.workloads import get_workload


@contextlib.contextmanager
def padded_to(length: int):
    """The kept prompt padded to `length` tokens (a bucket set with `length` as its first bucket)."""
    real = prefix.PROMPT_BUCKETS
    prefix.PROMPT_BUCKETS = (length, *(b for b in real if b > length))
    try:
        yield
    finally:
        prefix.PROMPT_BUCKETS = real


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--lengths", default="20,24,32,40,48", help="kept prompt lengths, each >= the valid tokens")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--valid", type=int, default=None, help="valid prompt tokens (default: the workload's)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--kernels", default=None, help="also write each length's kernel table (one profiled call) here")
    p.add_argument("--json")
    args = p.parse_args()

    base_workload = w = get_workload(args.workload)
    if args.valid is not None:
        import dataclasses

        w = dataclasses.replace(w, prompt_valid=(args.valid,) * len(w.prompt_valid))
    model = build_model(w.preset, device=args.device)
    engine = Engine(model, args.levers)
    obs, noise = random_observation(w, model.config, args.device), random_noise(w, model.config, args.device)
    valid = obs.host_prompt_len
    lengths = [int(x) for x in args.lengths.split(",")]
    if min(lengths) < valid:
        raise SystemExit(f"--lengths: each must be >= the {valid} valid prompt tokens, got {lengths}")
    slots = obs.tokens.shape[1]  # the prompt's padded length: a bucket past it is cut to it (pi0: 48)
    if max(lengths) > slots:
        raise SystemExit(f"--lengths: each must be <= the workload's {slots} prompt tokens, got {lengths}")
    reference = model.sample_actions(obs, noise, w.steps)

    def call(length: int):
        def fn():
            with padded_to(length):
                return engine.sample_actions(obs, noise, w.steps)
        return fn

    variants = {f"prompt_{n}": call(n) for n in lengths}
    rel = {}
    for name, fn in variants.items():  # first call: compile / capture for this length, and its check
        out = fn()
        assert engine.last_plan.prompt_len == int(name.split("_")[1]), engine.last_plan
        rel[name] = compare(out, reference, model.dtype)  # rel L2, max abs, and the dtype's tolerance
    samples = interleave(variants, args.rounds)
    base = f"prompt_{32 if 32 in lengths else lengths[-1]}"

    medians = {k: statistics.median(v) for k, v in samples.items()}
    result = {"schema": SCHEMA, "command": "prompt-len-probe", "workload": {"id": w.id, "overrides": w.overrides_vs(base_workload)},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record(args.device), "rounds": args.rounds, "valid_prompt_tokens": valid,
              "prefix_rows": {k: len(engine.last_plan.slots) * model.config.vision.num_patches + int(k.split("_")[1])
                              for k in variants},
              "median_ms": medians,
              "ratio_to": base,
              "speedup_vs_base": {k: statistics.median([a / b for a, b in zip(samples[base], v)]) for k, v in samples.items()},
              "equivalence": rel, "samples_ms": samples}
    print({k: round(v, 3) for k, v in medians.items()}, {k: round(v, 4) for k, v in result["speedup_vs_base"].items()})
    print("vs reference:", {k: (f"{v['rel_l2']:.2e}", v["passed"]) for k, v in rel.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.kernels:
        write_kernel_tables(variants, args.kernels)


def write_kernel_tables(variants: dict, folder: str) -> None:
    """One profiled call per length (each already compiled and captured): its kernels by GPU time."""
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(folder, exist_ok=True)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for name, fn in variants.items():
        fn()
        sync()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            fn()
            sync()
        path = os.path.join(folder, f"kernels_{name.replace('_', '')}.txt")
        with open(path, "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=40) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
