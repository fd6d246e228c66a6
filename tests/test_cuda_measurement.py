"""What only a GPU can check of the measurement itself and of the CUDA-graph cache: the timer's CUDA events and
synced wall clock around queued (asynchronous) work, the timed calls' peak memory, the interleaved comparison's event
ratios, the environment record's GPU, and what a graph replay hands back and leaves alone. Skipped without CUDA.

The queued work is `torch.cuda._sleep(cycles)`, a kernel that spins for that many GPU clock cycles: it returns to the
host at once, so a timer that did not wait for the GPU would read microseconds for it. Its time depends on the
clock: 2e6 cycles are 1 ms at the H200's 1.98 GHz and 5.8 ms at its 345 MHz idle clock, where a first call may find
it. So the bounds below are one-sided (at least what the cycles take at 4 GHz), and they leave room for the other
processes of a GPU test run (pytest-xdist) that share the GPU by time slices. What such sharing moves, the tests do
not assert: with the new tests of this file side by side on the H200 (session 40), an event pair recorded around a
kernel on another stream took 24.5 of the call's 45 ms, and a spin of twice the cycles measured 0.8-1.0x as fast."""

import dataclasses
import re
import shutil
import subprocess

import pytest
import torch

from vlaperf.check import REL_L2_TOLERANCE
from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.timing import Timer, device_uuid, environment_record, interleaved, time_calls
from vlaperf.workloads import get_workload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CYCLES = 2_000_000
SPIN_MS = 0.5  # CYCLES at 4 GHz, faster than any GPU clock: a lower bound only


def spin(cycles: int = CYCLES) -> None:
    torch.cuda._sleep(cycles)


SIDE = None


def spin_on_a_side_stream(cycles: int = CYCLES) -> None:
    """Work on a stream other than the events' (they are recorded on the current one), which the wall clock
    must wait for (its sync waits for the whole device)."""
    global SIDE
    if SIDE is None:
        SIDE = torch.cuda.Stream()
    SIDE.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE):
        torch.cuda._sleep(cycles)


def test_the_cuda_timer_waits_for_queued_work_and_its_events_time_it():
    """Each call: wall clock and CUDA events both see the spin; the wall clock spans the events and more (it starts
    before the first is recorded and stops after the device is synced past the second), so it is never the event
    time itself."""
    timer = Timer("cuda")
    assert timer.use_events
    spin()  # lazy init out of the way
    for _ in range(3):
        wall, event = timer(spin)
        assert event is not None and event >= SPIN_MS, event
        assert wall > event, (wall, event)
    # untimed warm-up calls are synced too
    assert timer.wall_s(spin) * 1e3 >= SPIN_MS
    # work queued before the call is not the call's: the timer waits for it before it starts
    spin(40 * CYCLES)  # >= 20 ms
    wall, event = timer(lambda: None)
    assert wall < 10.0 and event < 10.0, (wall, event)
    # the wall clock waits for every stream, not the current one only
    wall, _ = timer(lambda: spin_on_a_side_stream(20 * CYCLES))  # >= 10 ms
    assert wall >= 20 * SPIN_MS, wall


def test_time_calls_on_cuda_reads_events_per_timed_call_and_the_timed_calls_peak_memory():
    """cuda_event_ms has one sample per timed call and its summary is theirs; the peak memory is the timed
    calls' (a 64 MiB tensor made only in the warm-up calls is not in it), and at least what they allocate."""
    calls = []

    def fn():
        calls.append(len(calls))
        size = (64 << 20) if len(calls) <= 3 else (1 << 20)  # the 3 warm-up calls allocate 64 MiB, then 1 MiB
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        spin()
        return x

    fn()  # allocator and spin kernel initialised before the count starts
    calls.clear()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    r = time_calls(fn, device="cuda", warmup=3, iters=5, progress=False)
    assert len(calls) == 8
    events = r["samples"]["cuda_event_ms"]
    assert len(events) == 5 and all(e >= SPIN_MS for e in events), events
    assert r["timers"]["cuda_event_ms"]["median"] == sorted(events)[2]
    assert all(w > e for w, e in zip(r["samples"]["wall_ms"], events))
    assert r["first_call_s"] * 1e3 >= SPIN_MS and r["warmup_s"] * 1e3 >= 2 * SPIN_MS
    assert (1 << 20) <= r["peak_memory_bytes"] - held < (32 << 20), r["peak_memory_bytes"] - held


def test_interleaved_on_cuda_compares_by_events_and_wall_clock_apart():
    """Each variant's rounds are read by both clocks, and each ratio is its own clock's: the event ratio from the
    event samples (the medians' quotient, and the per-round quotients of the same round), the wall ratio from the
    wall samples. Each variant's peak memory is read."""
    r = interleaved({"one": spin, "two": lambda: spin(2 * CYCLES)}, device="cuda", warmup=1, iters=6, progress=False)
    for name, least in (("one", SPIN_MS), ("two", 2 * SPIN_MS)):
        v = r["variants"][name]
        assert len(v["samples"]["cuda_event_ms"]) == 6 and isinstance(v["peak_memory_bytes"], int)
        assert all(e >= least for e in v["samples"]["cuda_event_ms"]), v["samples"]["cuda_event_ms"]
        assert all(w > e for w, e in zip(v["samples"]["wall_ms"], v["samples"]["cuda_event_ms"]))
    one, two = r["variants"]["one"], r["variants"]["two"]
    for clock in ("cuda_event_ms", "wall_ms"):
        ratio = r["ratios"]["two"][clock]
        assert ratio["speedup"] == one["timers"][clock]["median"] / two["timers"][clock]["median"], (clock, ratio)
        per_round = sorted(a / b for a, b in zip(one["samples"][clock], two["samples"][clock]))
        assert ratio["ratio_median"] == pytest.approx((per_round[2] + per_round[3]) / 2, rel=1e-12), (clock, per_round)
    assert r["ratios"]["one"]["cuda_event_ms"]["speedup"] == 1.0


def test_the_environment_record_names_this_gpu():
    """gpu is torch's name of the device, its UUID as nvidia-smi writes it less 'GPU-' (lower case); with
    nvidia-smi present the state read through that UUID holds the clocks."""
    record = environment_record("cuda")
    assert record["device"] == "cuda" and record["gpu"] == torch.cuda.get_device_name(0)
    assert record["gpu_count"] == torch.cuda.device_count() >= 1
    uuid = device_uuid(torch.device("cuda"))
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid), uuid
    if shutil.which("nvidia-smi") is None:
        return
    listed = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.lower().split()
    assert f"gpu-{uuid}" in listed, (uuid, listed)
    state = record["gpu_state"]
    assert state is not None and state["uuid"].lower() == f"gpu-{uuid}", state
    assert isinstance(state["sm_clock_mhz"], int) and state["sm_clock_mhz"] > 0, state


# ----------------------------------------------------------------------------- the CUDA-graph cache

def _engine_and_model():
    model = build_model("tiny", "cuda", torch.float32, seed=0)
    return model, Engine(model, "graph")


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_a_replay_returns_its_own_tensor_and_leaves_the_callers_inputs_alone():
    """The graph's output buffer is overwritten by the next replay, so each call hands back a copy: a chunk a
    caller keeps is still its own after the next call. The caller's observation is copied into the graph's
    buffers, never used as one: the next call does not write into it."""
    model, engine = _engine_and_model()
    w = get_workload("tiny")
    obs1, noise1 = random_observation(w, model.config, "cuda", seed=1), random_noise(w, model.config, "cuda", seed=1)
    obs2, noise2 = random_observation(w, model.config, "cuda", seed=2), random_noise(w, model.config, "cuda", seed=2)
    kept_inputs = [t.clone() for t in (obs1.images, obs1.tokens, obs1.state, noise1)]
    out1 = engine.sample_actions(obs1, noise1, w.steps)
    kept = out1.clone()
    out2 = engine.sample_actions(obs2, noise2, w.steps)
    assert engine.graphs.captures == 1
    assert torch.equal(out1, kept) and out1.data_ptr() != out2.data_ptr()
    assert _rel(out2, model.sample_actions(obs2, noise2, w.steps)) <= REL_L2_TOLERANCE[torch.float32]
    assert _rel(out1, out2) > 0.1  # other noise, other actions: out2 is not out1 again
    for before, now in zip(kept_inputs, (obs1.images, obs1.tokens, obs1.state, noise1)):
        assert torch.equal(before, now)


def test_a_graph_per_step_count_batch_and_camera_plan_each_the_reference():
    """A graph is keyed by what fixes its shapes and host decisions: steps, batch, which cameras the prefix skips,
    the prompt's bucket. Each of five layouts captures once, replays on the second call, and gives the reference's
    actions."""
    model, engine = _engine_and_model()
    w = get_workload("tiny")
    layouts = [(w, 4), (w, 7), (dataclasses.replace(w, batch=2, prompt_valid=(6, 4)), 4),
               (dataclasses.replace(w, image_valid=(True, True, True)), 4),
               (dataclasses.replace(w, prompt_valid=(12,)), 4)]
    assert w.image_valid != (True, True, True)  # the fourth layout embeds a camera the others skip
    assert w.prompt_valid == (6,)  # the fifth keeps another bucket of the prompt (16 tokens, not 8)
    for rnd in range(2):
        for i, (wl, steps) in enumerate(layouts):
            obs = random_observation(wl, model.config, "cuda", seed=10 * rnd + i)
            noise = random_noise(wl, model.config, "cuda", seed=10 * rnd + i)
            out = engine.sample_actions(obs, noise, steps)
            assert out.shape == (wl.batch, w.horizon, model.config.action_dim)
            rel = _rel(out, model.sample_actions(obs, noise, steps))
            assert rel <= REL_L2_TOLERANCE[torch.float32], (rnd, i, rel)
        assert engine.graphs.captures == 5


def test_the_timed_graph_is_captured_apart_and_the_untimed_one_holds_no_event_nodes():
    """With a stage hook set the call replays a second graph with an event node at each stage boundary; without
    it the first graph replays and the last call's stage events are empty again. Both give the same actions."""
    model, engine = _engine_and_model()
    w = get_workload("tiny")
    obs, noise = random_observation(w, model.config, "cuda", seed=3), random_noise(w, model.config, "cuda", seed=3)
    plain = engine.sample_actions(obs, noise, w.steps)
    assert engine.last_stage_events == []
    engine.stage_hook = lambda stage: None
    timed = engine.sample_actions(obs, noise, w.steps)
    stages = [name for name, _ in engine.last_stage_events]
    assert stages == ["embed_prefix", "prefill", *(f"denoise_step_{i}" for i in range(w.steps)), "end"]
    events = [e for _, e in engine.last_stage_events]
    torch.cuda.synchronize()
    assert all(a.elapsed_time(b) >= 0 for a, b in zip(events, events[1:]))
    engine.stage_hook = None
    again = engine.sample_actions(obs, noise, w.steps)
    assert engine.last_stage_events == [] and engine.graphs.captures == 2
    untimed = [e for key, e in engine.graphs.entries.items() if key[-1] != "timed"]
    assert len(untimed) == 1 and untimed[0].stage_events == []
    assert torch.equal(plain, timed) and torch.equal(plain, again)
