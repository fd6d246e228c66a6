"""What an idle between calls costs the next call, against the idle's length, asleep and spinning.

Why: `vlaperf bench --idle-ms 50` (session 49, an H100) read the served call (policy mode, libero-pi0 `best`) 1.034x
slower after 50 ms asleep than back to back, and `breakdown --idle-ms 50` found every host stage 1.4-2x slower. Two
causes fit: the core's sleep (its clock or its idle state, which a core that spins keeps away) or state that decays
with time whatever the core does (caches shared with other processes, the kernel's timer work, a hypervisor's other
guests). The first predicts the cost with `--idle-spin` gone and not growing with the idle once the core is asleep;
the second predicts the same cost spinning as asleep, growing with the idle's length. One bench run per point cannot
draw that curve; this probe does, in one process.

For each idle length (`--gaps`, ms) and each way of spending it (asleep, spinning on the clock), the call is timed
after the idle against itself back to back, interleaved (`vlaperf.timing.interleaved`, as `bench --idle-ms` does),
and the per-round ratio's median and p10..p90 recorded. A third way, `rewarming`, spends the idle spinning but calls
the target again every `--rewarm-every-ms` (untimed, synchronized; none starts later than that long before the idle
ends): what a server that keeps its own call warm between requests could win back at best, and, against `spinning`,
whether the cost is the state the call itself leaves behind (its code, its allocator, the driver's paths) rather than
the core or its data. For the policy target a fourth way, `rewarming_host`, reruns only the call's host stages
(the transform, the upload, the device preprocess; no model call, no copy back): what a server could keep warm
without holding the GPU for a whole call. Two more split that run in two, to see whose warmth matters:
`rewarming_transform` reruns only the transform (host arrays from the request; no CUDA call), `rewarming_upload`
only the upload and the device preprocess (of arrays the transform made once). `--ways` picks the ways. Targets:
- `policy`: the served call (`vlaperf.policy.served_call`: transform, copies, model call, actions back), as bench
  --mode policy times it;
- `model`: the engine's `sample_actions` on device tensors, as bench --mode model;
- `small_torch_ops`: a control with no vlaperf in it, ~300 small CPU operators (a 64-wide linear, GELU, adds): host
  work only, whose cost after the idle says what the machine does to any host code.

    python benchmarks/idle_decay_probe.py --workload libero-pi0 --levers best --json out.json
    python benchmarks/idle_decay_probe.py --workload tiny --device cpu --levers exact --json out.json   (try it)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vlaperf.cli import pair_cost
from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.policy import Policy, example_request
from vlaperf.report.schema import SCHEMA, write_result
from vlaperf.timing import environment_record, interleaved
from vlaperf.workloads import get_workload

WAYS = ("asleep", "spinning", "rewarming")
HOST_WAYS = ("rewarming_host", "rewarming_transform", "rewarming_upload")  # the policy target's, its host stages


def small_torch_ops(width: int = 64, ops: int = 300):
    """The control: `ops` small CPU operators through torch's dispatcher, no vlaperf code, nothing on a device."""
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(width, width)
    xs = [torch.randn(width, generator=gen) for _ in range(8)]

    @torch.no_grad()
    def call():
        y = xs[0]
        for i in range(ops):
            y = torch.nn.functional.gelu(lin(y)) + xs[i % 8]
            y = y * 0.5
        return y

    return call


def gaps_arg(text: str) -> list[float]:
    try:
        gaps = [float(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds separated by commas (e.g. 0.2,2,10,50), got {text!r}")
    if not gaps or any(not 0 < g <= 10_000 for g in gaps):
        raise argparse.ArgumentTypeError(f"expected one or more idles in (0, 10000] ms, got {text!r}")
    return gaps


def rewarmed_pair(fn, device: torch.device, gap_ms: float, every_ms: float, rounds: int, warmup: int,
                  warm=None) -> dict:
    """`pair_cost`'s fields for the call after `gap_ms` of spinning during which `warm` (default: `fn` itself) runs
    (untimed, synchronized) every `every_ms`, none started within that period of the idle's end (wait_idle's
    rewarm), against the call back to back, interleaved."""
    timing = interleaved({"back_to_back": fn, "after_idle": fn}, device=device, warmup=warmup, iters=rounds,
                         baseline="back_to_back", progress=False, idle_ms={"after_idle": gap_ms}, idle_spin=True,
                         idle_rewarm={"after_idle": fn if warm is None else warm}, rewarm_every_ms=every_ms)
    return pair_cost(timing, "back_to_back", "after_idle")


def decay(fn, device: torch.device, gaps: list[float], rounds: int, warmup: int, rewarm_every_ms: float,
          ways: list[str] | None = None, host_parts: dict | None = None) -> list[dict]:
    """One row per (way, gap): the call after that idle against itself back to back (`pair_cost`'s fields), plus the
    difference of the two wall-clock medians in ms. `host_parts`: for each of HOST_WAYS, what it reruns (the call's
    host stages or a part of them); without it those ways are skipped. `ways`: default all."""
    rows = []
    for way in ways or WAYS + HOST_WAYS:
        if way in HOST_WAYS and host_parts is None:
            continue
        for gap in gaps:
            t0 = time.perf_counter()
            if way == "rewarming" or way in HOST_WAYS:
                cost = rewarmed_pair(fn, device, gap, rewarm_every_ms, rounds, warmup,
                                     warm=host_parts[way] if way in HOST_WAYS else None)
            else:
                timing = interleaved({"back_to_back": fn, "after_idle": fn}, device=device, warmup=warmup,
                                     iters=rounds, baseline="back_to_back", progress=False, idle_ms={"after_idle": gap},
                                     idle_spin=way == "spinning")
                cost = pair_cost(timing, "back_to_back", "after_idle")
            w = cost["wall_ms"]
            rows.append({"way": way, "idle_ms": gap, **cost,
                         "extra_ms": w["after_idle_median"] - w["back_to_back_median"],
                         "seconds": time.perf_counter() - t0})
            print(f"  {way:19s} {gap:7.1f} ms: {w['after_idle_over_back_to_back']:.3f}x "
                  f"({w['after_idle_median']:.3f} vs {w['back_to_back_median']:.3f} ms; per round p10-p90 "
                  f"{w['per_round_p10']:.3f}-{w['per_round_p90']:.3f})", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--device", default="cuda", help="cuda, or cpu with --workload tiny to try the script")
    p.add_argument("--targets", default="policy,model,small_torch_ops",
                   help="which calls, comma-separated: policy, model, small_torch_ops (default: all three)")
    p.add_argument("--gaps", type=gaps_arg, default=gaps_arg("0.2,2,10,50,200"),
                   help="idle lengths in ms, comma-separated (default: 0.2,2,10,50,200)")
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds per point (default: 40)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls of each copy per point (default: 5)")
    p.add_argument("--ways", default=",".join(WAYS + HOST_WAYS),
                   help="how the idle is spent, comma-separated, of: " + ", ".join(WAYS + HOST_WAYS) + " (default: all; "
                        "the last three for the policy target only)")
    p.add_argument("--rewarm-every-ms", type=float, default=5.0,
                   help="the rewarming way's period: one untimed call this often through the idle (default: 5)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - {"policy", "model", "small_torch_ops"})
    if unknown or not targets:
        p.error(f"--targets: expected some of policy, model, small_torch_ops; got {args.targets!r}")
    ways = [t.strip() for t in args.ways.split(",") if t.strip()]
    unknown = sorted(set(ways) - set(WAYS + HOST_WAYS))
    if unknown or not ways:
        p.error(f"--ways: expected some of {', '.join(WAYS + HOST_WAYS)}; got {args.ways!r}")
    if args.rounds < 3 or args.warmup < 1:
        p.error("--rounds: at least 3, --warmup: at least 1 (the first call of each copy carries its capture)")
    if not args.rewarm_every_ms > 0:
        p.error(f"--rewarm-every-ms: expected a period > 0 ms, got {args.rewarm_every_ms}")

    device = torch.device(args.device)
    w = get_workload(args.workload)
    model = build_model(w.model_config(), device)
    engine = Engine(model, args.levers)
    noise = random_noise(w, model.config, device)
    obs = random_observation(w, model.config, device)
    # the served call as vlaperf.policy.served_call builds it, kept apart so that its host stages can run alone
    policy = Policy(model, engine.sample_actions, w, num_steps=w.steps, noise=noise, verify=engine.raise_on_kernel_fault)
    request = example_request(w)
    transform = policy.transform
    calls = {"policy": lambda: policy.infer(request),
             "model": lambda: engine.sample_actions(obs, noise, w.steps),
             "small_torch_ops": small_torch_ops()}
    arrays = transform.host_arrays(request)  # the upload way's input, made once
    host_parts = {"policy": {
        "rewarming_host": lambda: transform.preprocess(transform.upload(transform.host_arrays(request))),
        "rewarming_transform": lambda: transform.host_arrays(request),
        "rewarming_upload": lambda: transform.preprocess(transform.upload(arrays))}}
    result = {"schema": SCHEMA, "command": "idle-decay-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name,
                          "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record(device), "gaps_ms": args.gaps, "rounds": args.rounds, "warmup": args.warmup,
              "rewarm_every_ms": args.rewarm_every_ms, "ways": ways,
              "targets": {}}
    for name in targets:
        print(f"{name}:", flush=True)
        # the control runs on the host whatever the device: its timer syncs nothing
        target_device = torch.device("cpu") if name == "small_torch_ops" else device
        result["targets"][name] = decay(calls[name], target_device, args.gaps, args.rounds, args.warmup,
                                        args.rewarm_every_ms, ways, host_parts=host_parts.get(name))
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    else:
        print(json.dumps(result["targets"], indent=1))


if __name__ == "__main__":
    main()
