"""Where a served call's time goes beyond the model call, on this machine: the policy path's
phases one by one (each synced), and the websocket front end around a policy that waits on
the GPU as long as the model does.

    python benchmarks/served_path_probe.py --workload libero-pi0 --levers best --json $OUT/served_path.json

Part 1, the policy (`vlaperf.policy.Policy.infer`) on one openpi example, timed whole and
phase by phase with a device sync after each phase (so the phases' sum exceeds the whole call
by the syncs): validate + tokenize on the host, the upload (one pinned staging copy), the
device preprocess, `sample_actions` (graph replay), the actions' copy to the host, and the
step kernel's fault check (`verify`, one 4-byte read). Model mode (`sample_actions` on device
tensors) is timed in its own loop first, in the same process, for the difference. The copy to
the host is the policy's own: the whole chunk, then the robot's dims on the host (session 21's
two files, at 278ad08 and 29cebd9, sliced on the device first, as the policy did then).

Part 2, the front end: a `PolicyServer` in this process serves (a) the real policy and (b) a
stand-in whose `infer` sleeps for the real policy's median (the GIL released, as while the
GPU runs) and (c) one that returns at once; an openpi-style client (websockets' synchronous
client, msgpack-numpy frames) sends the same example in a closed loop. Round trip minus the
server's own infer time is the front end: decode, the hand-offs between the event loop and the
inference thread, the reply, both websocket hops and the client's packing. (b) against (c)
says how much of it depends on the threads having slept through a ~13 ms call; (d) and (e) are
(b) and (a) with the server's event loop polling for the result every 0.2 ms instead of
sleeping until the inference thread wakes it (asyncio rounds that sleep up to 1 ms in epoll);
(f) is (a) with the loop spinning (asyncio.sleep(0)) while it waits; (g)-(i) are (b), (a) and (c)
with one lowest-priority spinning process per CPU, so no CPU goes idle (`idle_spinners`); (j)-(l)
are (a)-(c) with the client in a child process (its own GIL, as a robot's client is). Each
front end is split into the client's side (round trip less the server's own time, received to
reply sent), the worker's wake-up (`queue_ms`) and the rest of the server's time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time

import numpy as np
import torch
from engine_ab import timed  # benchmarks/ (the script's folder is on sys.path): one synced call, ms

from vlaperf.engine import Engine
from vlaperf.inputs import make_example, random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.policy import Policy
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda
from vlaperf.workloads import get_workload


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def policy_phases(policy: Policy, engine: Engine, example: dict, noise, steps: int, rounds: int) -> dict:
    tr = policy.transform
    names = ("host_arrays", "upload", "preprocess", "sample_actions", "to_host", "verify")
    phases: dict[str, list[float]] = {n: [] for n in names}
    whole: list[float] = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        policy.infer(example)
        sync()
        whole.append(time.perf_counter() - t)
        marks = [time.perf_counter()]
        hb = tr.host_arrays(example)
        marks.append(time.perf_counter())
        db = tr.upload(hb)
        sync()
        marks.append(time.perf_counter())
        obs = tr.preprocess(db)
        sync()
        marks.append(time.perf_counter())
        actions = engine.sample_actions(obs, noise, steps)
        sync()
        marks.append(time.perf_counter())
        actions.cpu().numpy()[..., : policy.workload.robot_action_dim].astype(np.float32)
        marks.append(time.perf_counter())
        engine.raise_on_kernel_fault()
        marks.append(time.perf_counter())
        for n, a, b in zip(names, marks, marks[1:]):
            phases[n].append(b - a)
    return {"infer_ms": median_ms(whole), "phases_ms": {n: median_ms(v) for n, v in phases.items()}}


@contextlib.contextmanager
def loop_polls(seconds: float | None):
    """With `seconds`, the server's event loop waits for the inference thread's results by
    polling every `seconds` (asyncio.sleep) instead of sleeping until the thread wakes it: a
    thread that slept through a ~14 ms call wakes late on some machines."""
    from vlaperf.serve import server as S

    if seconds is None:
        yield
        return
    real = S.asyncio.gather

    async def polling_gather(*futures):
        while not all(f.done() for f in futures):
            await asyncio.sleep(seconds)
        return [f.result() for f in futures]

    # asyncio.gather itself, process-wide while the block runs (S.asyncio is the asyncio module): on this
    # path the server's _reply is its one caller that waits on the inference thread
    S.asyncio.gather = polling_gather
    try:
        yield
    finally:
        S.asyncio.gather = real


def closed_loop(url: str, example: dict, requests: int) -> tuple[list[float], list[dict]]:
    """An openpi-style client's closed loop: round trips (s) and each reply's server timings (s),
    after 10 unrecorded requests."""
    from websockets.sync.client import connect

    from vlaperf.serve.protocol import packb, unpackb

    round_trips, timings = [], []
    with connect(url, compression=None, max_size=None) as ws:
        ws.recv()  # the metadata frame
        for i in range(requests + 11):
            t = time.perf_counter()
            ws.send(packb(example))
            reply = unpackb(ws.recv())
            dt = time.perf_counter() - t
            if i >= 10:
                round_trips.append(dt)
                timings.append({k: v / 1e3 for k, v in reply["server_timing"].items() if k.endswith("_ms")})
    return round_trips, timings


def client_process(url: str, workload: str, requests: int) -> tuple[list[float], list[dict]]:
    """closed_loop in a child process (its own interpreter and GIL, as a robot's client is)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from served_path_probe import closed_loop; "
            "from vlaperf.inputs import make_example; from vlaperf.workloads import get_workload; "
            "rt, tm = closed_loop(sys.argv[2], make_example(get_workload(sys.argv[3])), int(sys.argv[4])); "
            "print(json.dumps([rt, tm]))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), url, workload, str(requests)],
                         capture_output=True, text=True, check=True, timeout=600)
    rt, tm = json.loads(out.stdout.strip().splitlines()[-1])
    return rt, tm


def front_end(policy, example: dict, requests: int, poll_s: float | None = None, spinners: int = 0,
              workload_in_child: str | None = None) -> dict:
    """The closed loop against a PolicyServer in this process around `policy`; with
    `workload_in_child`, the client runs in a child process on that workload's example."""
    from vlaperf.serve.server import PolicyServer

    with loop_polls(poll_s), idle_spinners(spinners), \
            PolicyServer(policy, port=0, max_batch=1, warmup_batch_sizes=()) as srv:
        if workload_in_child:
            round_trips, timings = client_process(srv.url, workload_in_child, requests)
        else:
            round_trips, timings = closed_loop(srv.url, example, requests)
    # a reply's prev_total_ms is the server's time for the request before it (received -> reply sent)
    rt, st, server = round_trips[:-1], timings[:-1], [t["prev_total_ms"] for t in timings[1:]]
    return {"round_trip_ms": median_ms(rt), "server_infer_ms": median_ms([t["infer_ms"] for t in st]),
            "front_end_ms": median_ms([r - t["infer_ms"] for r, t in zip(rt, st)]),
            # the front end in three parts: the client's side (its send, both socket hops, its wake-up and
            # decode), the worker's wake-up (queue) and the server's own remainder (decode, hand-offs, reply)
            "client_side_ms": median_ms([r - s for r, s in zip(rt, server)]),
            "server_queue_ms": median_ms([t["queue_ms"] for t in st]),
            "server_decode_ms": median_ms([t["decode_ms"] for t in st]),
            "server_rest_ms": median_ms([s - t["infer_ms"] - t["queue_ms"] - t["decode_ms"] for s, t in zip(server, st)])}


@contextlib.contextmanager
def idle_spinners(n: int):
    """`n` processes that spin at the lowest priority (SCHED_IDLE) while the block runs: any
    thread that wakes preempts one at once, and no CPU of the machine ever goes idle. If the
    front end then matches the instant policy's, what the threads lose after a ~13 ms wait is
    their CPUs waking from idle (a virtual machine's halted vCPUs), not their own code."""
    import subprocess
    import sys

    code = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class Sleeper:
    """A stand-in policy: sleeps `seconds` (the GIL released, as while the GPU runs), then
    returns zero actions of the workload's shape."""

    def __init__(self, workload, horizon: int, seconds: float):
        self.workload, self.horizon, self.seconds = workload, horizon, seconds

    def infer(self, examples):
        if self.seconds:
            time.sleep(self.seconds)
        n = len(examples) if isinstance(examples, list) else 1
        return {"actions": np.zeros((n, self.horizon, self.workload.robot_action_dim), np.float32)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--levers", default="best")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--device", default="cuda", help="cuda, or cpu with --workload tiny to try the script")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    require_cuda(__file__, args.device)
    w = get_workload(args.workload)
    model = build_model(w.model_config(), args.device)
    engine = Engine(model, args.levers)
    noise = random_noise(w, model.config, args.device)
    policy = Policy(model, engine.sample_actions, w, num_steps=w.steps, noise=noise, verify=engine.raise_on_kernel_fault)
    example = make_example(w)
    obs = random_observation(w, model.config, args.device)
    for _ in range(10):  # compile, capture, warm up both paths
        policy.infer(example)
        engine.sample_actions(obs, noise, w.steps)
    model_ms = [timed(lambda: engine.sample_actions(obs, noise, w.steps)) for _ in range(args.rounds)]
    part1 = policy_phases(policy, engine, example, noise, w.steps, args.rounds)
    part1["model_ms"] = statistics.median(model_ms)
    H = model.config.action_horizon
    part2 = {"real_policy": front_end(policy, example, args.rounds),
             "sleeper_like_policy": front_end(Sleeper(w, H, part1["infer_ms"] / 1e3), example, args.rounds),
             "instant_policy": front_end(Sleeper(w, H, 0.0), example, args.rounds),
             "sleeper_like_policy_loop_polls_0.2ms": front_end(Sleeper(w, H, part1["infer_ms"] / 1e3), example, args.rounds,
                                                               poll_s=2e-4),
             "real_policy_loop_polls_0.2ms": front_end(policy, example, args.rounds, poll_s=2e-4),
             # asyncio.sleep(2e-4) sleeps in epoll for a whole millisecond (its timeout is rounded up to ms):
             # sleep(0) spins the loop's thread instead
             "real_policy_loop_spins": front_end(policy, example, args.rounds, poll_s=0.0),
             # the client in its own process (its own GIL, as a robot's client is)
             "real_policy_client_process": front_end(policy, example, args.rounds, workload_in_child=w.id),
             "sleeper_like_policy_client_process": front_end(Sleeper(w, H, part1["infer_ms"] / 1e3), example, args.rounds,
                                                             workload_in_child=w.id),
             "instant_policy_client_process": front_end(Sleeper(w, H, 0.0), example, args.rounds, workload_in_child=w.id),
             "sleeper_like_policy_idle_spinners": front_end(Sleeper(w, H, part1["infer_ms"] / 1e3), example, args.rounds,
                                                            spinners=os.cpu_count() or 1),
             "real_policy_idle_spinners": front_end(policy, example, args.rounds, spinners=os.cpu_count() or 1),
             "instant_policy_idle_spinners": front_end(Sleeper(w, H, 0.0), example, args.rounds,
                                                       spinners=os.cpu_count() or 1)}
    result = {"schema": SCHEMA, "command": "served-path-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": engine.levers.names(), "label": engine.name, "dtype": str(model.dtype).split(".")[-1]},
              "env": environment_record(args.device), "rounds": args.rounds, "policy": part1, "front_end": part2}
    print(json.dumps({"policy": part1, "front_end": part2}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
