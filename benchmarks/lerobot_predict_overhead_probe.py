"""Where LeRobot's accelerated `predict_action_chunk` spends the time outside vlaperf's CUDA graph.

Why: on an H100 (session 47, `vlaperf compare --accelerate`, libero-pi0, bf16) LeRobot's predict with vlaperf's
engine installed took 17.18 ms against 13.60 ms for the same engine called directly: 3.6 ms, where 0.2-1.5 ms was
predicted. The graph is the same (no new capture on that row's first call), so the rest is host work before the
replay, while the GPU idles: LeRobot's own predict wrapper (`self.eval()` over the whole module tree, its image
preprocessing, the state's padding) and the accelerator's conversion of its inputs (one device-to-host read of the
masks). Timed here interleaved in one process, each piece alone, and one accelerated call under torch.profiler.

    python benchmarks/lerobot_predict_overhead_probe.py --json out.json --profile out.txt

`--rtc` (session 48): LeRobot's real-time chunking on, as `vlaperf compare --accelerate --rtc` times it (its
RTCConfig defaults, the second half of a previous chunk as the leftover, delay 3), and each accelerated row again
guided: vlaperf's guided call inside LeRobot's pi0.5 predict cost 1.27-1.30 ms over its unguided one on an H100
while the engine's guided replay costs pi0.5 0.18 ms, and on the CPU both models' guided predicts run the same
extra operators. The guided rows, the engine's guided replay alone and the accelerator's guidance build alone say
which part of the call holds the difference.

`--neighbours` (session 49): LeRobot's own predict (unguided, and guided with `--rtc`) as rows, each followed in the
rotating order by a second copy of the accelerated predict (`after_lerobot_predict`, `after_lerobot_predict_rtc`).
`vlaperf compare --accelerate --rtc` interleaves its accelerated rows right after LeRobot's eager ones (a 240-300 ms
call, the guided one under autograd); the copies say what that neighbour costs the next accelerated call, against
the same call after another accelerated row.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from vlaperf.compare import lerobot as lr
from vlaperf.compare.accelerate import accelerate_lerobot
from vlaperf.inputs import random_noise, random_observation
from vlaperf.timing import environment_record, interleaved
from vlaperf.workloads import get_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="libero-pi0")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reduced", action="store_true", help="LeRobot's reduced sizes in float32 (a CPU check of the script)")
    ap.add_argument("--rtc", action="store_true", help="also the guided calls (LeRobot's RTC on)")
    ap.add_argument("--neighbours", action="store_true",
                    help="also LeRobot's own predict, each followed by a copy of the accelerated predict")
    ap.add_argument("--neighbour-variants", action="store_true",
                    help="with --rtc --neighbours: after LeRobot's guided predict, the engine's guided replay alone, "
                         "the unguided accelerated predict, and the guided one after a gc.collect() or 50 ms idle")
    ap.add_argument("--profile-after", default=None,
                    help="with --rtc --neighbours: torch.profiler tables of the accelerated guided predict after "
                         "another one and after LeRobot's guided predict, written to this file")
    args = ap.parse_args()
    if (args.neighbour_variants or args.profile_after) and not (args.rtc and args.neighbours):
        ap.error("--neighbour-variants and --profile-after need --rtc and --neighbours")
    device, dtype = torch.device(args.device), torch.float32 if args.reduced else torch.bfloat16
    wl = get_workload(args.workload)
    cfg = lr.matching_config(wl, lr.Reduced() if args.reduced else None)
    policy = lr.build_lerobot(cfg, device, dtype, reduced=args.reduced)
    lr.randomize_lerobot_(policy, 0)
    obs, noise = random_observation(wl, cfg, device), random_noise(wl, cfg, device)
    lr.set_predict_features(policy, obs)
    batch = lr.predict_batch(obs)
    fast = accelerate_lerobot(policy, levers="best" if device.type == "cuda" else "exact")
    steps = wl.steps
    core_inputs = lr.lerobot_inputs(obs, cfg.pi05)

    fns = {
        "predict_accelerated": lambda: policy.predict_action_chunk(batch, noise=noise.clone(), num_steps=steps),
        "core_accelerated": lambda: policy.model.sample_actions(*core_inputs, noise=noise.clone(), num_steps=steps),
        "engine_direct": lambda: fast.engine.sample_actions(obs, noise, steps),
        "policy_eval": lambda: policy.eval(),
        # pi0.5's policy has no prepare_state: its state travels in the prompt's tokens
        "predict_preprocess": lambda: (policy._preprocess_images(batch),
                                       policy.prepare_state(batch) if not cfg.pi05 else None),
    }
    if args.rtc:
        from vlaperf.compare.lerobot import RTC_TIMING, _rtc_config_class

        policy.config.rtc_config = _rtc_config_class()(enabled=True)
        policy.init_rtc_processor()
        H = policy.config.chunk_size
        previous = policy.predict_action_chunk(batch, noise=noise.clone(), num_steps=steps)
        rtc = {"inference_delay": RTC_TIMING["inference_delay"],
               "prev_chunk_left_over": previous[:, int(H * RTC_TIMING["leftover_from"]):], "execution_horizon": None}
        guidance = fast._guidance(obs.batch, steps, device, **rtc)
        fns.update({
            "predict_accelerated_rtc": lambda: policy.predict_action_chunk(batch, noise=noise.clone(), num_steps=steps,
                                                                           **rtc),
            "core_accelerated_rtc": lambda: policy.model.sample_actions(*core_inputs, noise=noise.clone(),
                                                                        num_steps=steps, **rtc),
            "engine_direct_rtc": lambda: fast.engine.sample_actions(obs, noise, steps, guidance),
            "accelerator_guidance": lambda: fast._guidance(obs.batch, steps, device, **rtc),
        })
    if args.neighbours:
        def shipped(**kw):
            def call():
                fast.restore()
                try:
                    return policy.predict_action_chunk(batch, noise=noise.clone(), num_steps=steps, **kw)
                finally:
                    fast.install()
            return call

        # the rotating order calls each row after the one before it in this order: each copy follows LeRobot's call
        fns["lerobot_predict"] = shipped()
        fns["after_lerobot_predict"] = fns["predict_accelerated"]
        if args.rtc:
            fns["lerobot_predict_rtc"] = shipped(**rtc)
            fns["after_lerobot_predict_rtc"] = fns["predict_accelerated_rtc"]
    if args.neighbour_variants:
        def then(fn, settle):
            def call():
                out = fn()
                settle()
                return out
            return call

        def sleep():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            time.sleep(0.05)

        # which call pays after LeRobot's guided one (the engine alone? an unguided call?), and whether a garbage
        # collection or 50 ms of idle in between takes the cost away
        guided_lerobot = shipped(**rtc)
        for suffix, before, after in (("engine", guided_lerobot, fns["engine_direct_rtc"]),
                                      ("unguided", guided_lerobot, fns["predict_accelerated"]),
                                      ("gc", then(guided_lerobot, gc.collect), fns["predict_accelerated_rtc"]),
                                      ("sleep", then(guided_lerobot, sleep), fns["predict_accelerated_rtc"])):
            fns[f"lerobot_predict_rtc_{suffix}"] = before
            fns[f"after_lerobot_predict_rtc_{suffix}"] = after
    # Python's garbage collections that start inside each row's calls, by generation: an allocation-heavy neighbour
    # (LeRobot's guided call builds an autograd graph each step) can leave the next call to pay for a collection
    collections = {name: [0, 0, 0] for name in fns}
    current = [None]

    def count(phase, info):
        if phase == "start" and current[0] is not None:
            collections[current[0]][info["generation"]] += 1

    def counted(name, fn):
        def call():
            current[0] = name
            try:
                return fn()
            finally:
                current[0] = None
        return call

    fns = {name: counted(name, fn) for name, fn in fns.items()}
    gc.callbacks.append(count)
    timing = interleaved(fns, device=device, warmup=5, iters=args.iters, baseline="engine_direct", progress=False)
    rows = {}
    for name, v in timing["variants"].items():
        w, e = v["timers"]["wall_ms"], v["timers"]["cuda_event_ms"]
        rows[name] = {"wall_ms_median": w["median"], "event_ms_median": e["median"] if e else None,
                      "first_call_s": v["first_call_s"], "gc_collections_by_generation": collections[name]}
        print(f"{name:22s} wall {w['median']:8.3f} ms  event {e['median'] if e else float('nan'):8.3f} ms  "
              f"first call {v['first_call_s']:.2f} s  gc {collections[name]}")
    print("modules in the policy:", sum(1 for _ in policy.modules()))
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            fns["predict_accelerated"]()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(5):
                fns["predict_accelerated"]()
            if device.type == "cuda":
                torch.cuda.synchronize()
        with open(args.profile, "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    after_profile = profile_after(fns, device, args.profile_after) if args.profile_after else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "lerobot_predict_overhead_probe", "workload": {"id": wl.id}, "rtc": args.rtc,
                       "neighbours": args.neighbours, "after_profile": after_profile,
                       "rows": rows,
                       "checks": fast.checks, "modules": sum(1 for _ in policy.modules()),
                       "ratios": {k: v["wall_ms"] for k, v in timing["ratios"].items()},
                       "env": environment_record(device)}, f, indent=1)


def profile_after(fns: dict, device: torch.device, path: str) -> dict:
    """One accelerated guided predict under torch.profiler, five times after another one and five times after
    LeRobot's guided predict: its wall time, the GPU's kernel time within it, and the operator tables (to `path`)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    call = fns["predict_accelerated_rtc"]
    out, tables = {}, []
    for label, before in (("after_accelerated", call), ("after_lerobot_rtc", fns["lerobot_predict_rtc"])):
        walls, kernels = [], []
        for i in range(5):
            before()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            with profile(activities=activities) as prof:
                t0 = time.perf_counter()
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                walls.append((time.perf_counter() - t0) * 1e3)
            events = prof.key_averages()
            kernels.append(sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e3)
            if i == 4:
                tables.append(f"== {label}\n" + events.table(sort_by="self_cpu_time_total", row_limit=25))
        out[label] = {"wall_ms": walls, "device_ms": kernels}
        print(f"profiled {label:18s} wall {sorted(walls)[2]:8.3f} ms  device {sorted(kernels)[2]:8.3f} ms (medians of 5)")
    with open(path, "w") as f:
        f.write("\n\n".join(tables))
    return out


if __name__ == "__main__":
    main()
