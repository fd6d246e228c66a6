"""CPU tests of vlaperf.profile.markers: the stage recorder, its CUDA-event logic (with a fake
clock) and the bring-your-own-policy marker protocol."""

from __future__ import annotations

import time

import pytest
import torch

from vlaperf.profile import markers
from vlaperf.profile.markers import NULL_RECORDER, UNMARKED, StageRecorder


class FakeClock:
    """Deterministic clock: every now() advances 1 ms; counts the waits (syncs)."""

    kind = "fake"

    def __init__(self):
        self.t = 0.0
        self.finishes = 0

    def now(self):
        self.t += 1.0
        return self.t

    def elapsed_ms(self, a, b):
        return b - a

    def finish(self, last):
        self.finishes += 1


class FakeEvent:
    """Stands in for a recorded torch.cuda.Event: elapsed_time() only works once an event
    recorded at or after both has been waited for, as with real CUDA events."""

    clock = 0.0
    completed = 0.0  # device time up to which work is known to be finished

    def __init__(self):
        FakeEvent.clock += 0.5
        self.t = FakeEvent.clock

    def synchronize(self):
        FakeEvent.completed = max(FakeEvent.completed, self.t)

    def elapsed_time(self, other):
        assert max(self.t, other.t) <= FakeEvent.completed, "read an event before waiting for it"
        return other.t - self.t


class FakeEventClock(markers.CudaEventClock):
    """CudaEventClock logic with fake events (no GPU): records and syncs are counted."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.records = 0

    def now(self):
        self.records += 1
        return FakeEvent()


def test_boundary_marks_sum_to_span():
    clock = FakeClock()
    rec = StageRecorder("cpu", clock=clock, nvtx=False)
    with rec.call():
        rec.mark("a")  # t=2 (t=1 is the call start)
        rec.mark("b")  # t=3
        rec.mark("b")  # t=4
        rec.mark("end")  # t=5
    (call,) = rec.calls
    assert call.span_ms == pytest.approx(5.0)  # call end at t=6
    assert call.totals() == {"a": 1.0, "b": 2.0, UNMARKED: 2.0}
    assert sum(call.totals().values()) == pytest.approx(call.span_ms)
    assert clock.finishes == 1


def test_block_stages_nest_and_decorate():
    clock = FakeClock()
    rec = StageRecorder("cpu", clock=clock, nvtx=False)

    @rec.stage("decorated")
    def f():
        rec.mark("inner_a")
        rec.mark("inner_b")

    with rec.call():
        with rec.stage("outer"):
            with rec.stage("inner"):
                pass
        f()
        f()
    call = rec.calls[0]
    names = [(n, d) for n, d, _ in call.stages]
    assert ("outer", 0) in names and ("outer/inner", 1) in names
    assert ("decorated/inner_a", 1) in names and ("decorated/inner_b", 1) in names
    assert [n for n, d, _ in call.stages if d == 0].count("decorated") == 2
    # top-level stages + unmarked == span, nested ones are not double counted
    assert sum(call.totals(0).values()) == pytest.approx(call.span_ms)


def test_block_stage_closes_open_boundary_stage():
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    with rec.call():
        rec.mark("setup")
        with rec.stage("work"):
            pass
    totals = rec.calls[0].totals()
    assert totals["setup"] == 1.0 and totals["work"] == 1.0


def test_cuda_event_path_syncs_once_per_call():
    """On CUDA the recorder records one event per boundary and waits once, at the end."""
    clock = FakeEventClock()
    rec = StageRecorder("cpu", clock=clock, nvtx=False)
    for _ in range(3):
        with rec.call():
            for i in range(10):
                rec.mark(f"denoise_step_{i}")
            rec.mark("end")
    assert clock.syncs == 3  # one per call, none per stage
    assert clock.records == 3 * (1 + 10 + 1 + 1)  # start, 10 marks, end mark, call end
    call = rec.calls[-1]
    assert all(abs(ms - 0.5) < 1e-9 for n, d, ms in call.stages if n.startswith("denoise_step_"))


def test_marks_with_given_tokens_use_them_and_open_no_range(monkeypatch):
    """A mark given a token (a CUDA graph's stage event, recorded by the replay) takes that time, not
    now, and pushes no NVTX range: after the replay the host's time is not the stage's."""
    pushed = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    clock = FakeClock()  # now(): 1, 2, 3, ...
    rec = StageRecorder("cpu", clock=clock, nvtx=True)
    with rec.call():  # starts at t=1
        rec.mark("setup")  # t=2, a range
        rec.mark("prefix", token=2.25)  # the graph's events, handed over after its replay
        rec.mark("denoise_step_0", token=2.5)
        rec.mark("end", token=2.75)
        rec.mark("device_to_host")  # t=3
    (call,) = rec.calls
    assert pushed == ["setup", "device_to_host"]
    totals = call.totals()
    assert totals["setup"] == totals["prefix"] == totals["denoise_step_0"] == 0.25
    assert totals["device_to_host"] == 1.0  # from the host mark at t=3 to the call's end at t=4


def test_marks_outside_call_make_an_implicit_call():
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    rec.mark("x")
    rec.mark("end")
    record = rec.end_call()
    assert record.totals()["x"] == 1.0


def test_engine_stage_hook_accepts_recorder_mark():
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    w = get_workload("tiny")
    model = build_model("tiny")
    engine = Engine(model, "for_loop")
    rec = StageRecorder("cpu")
    engine.stage_hook = rec.mark
    obs, noise = random_observation(w, model.config), random_noise(w, model.config)
    with rec.call():
        engine.sample_actions(obs, noise, 3)
    names = [n for n, d, _ in rec.calls[0].stages]
    assert names == ["embed_prefix", "prefill", "denoise_step_0", "denoise_step_1", "denoise_step_2", UNMARKED]


def test_module_level_markers_are_noops_without_recorder():
    with markers.stage("x"):
        markers.mark("y")

    @markers.staged()
    def encode():
        return 3

    assert encode() == 3
    assert isinstance(markers.active_recorder(), type(NULL_RECORDER))
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    with rec.activate(), rec.call():
        encode()
        with markers.stage("decode"):
            markers.mark("inner")
    names = [n for n, d, _ in rec.calls[0].stages]
    assert names[:3] == ["encode", "decode", "decode/inner"]


def test_record_function_ranges_appear_in_profiler():
    from torch.profiler import ProfilerActivity, profile

    rec = StageRecorder("cpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with rec.call():
            rec.mark("stage_alpha")
            torch.ones(4).sum()
            with rec.stage("stage_beta"):
                torch.ones(4).sum()
    names = {e.name for e in prof.events()}
    assert {"stage_alpha", "stage_beta"} <= names


def test_profiler_notices_are_dropped_and_other_stderr_kept(capfd):
    """kineto's own start/stop notices on file descriptor 2 are left out of a traced command's output; whatever
    else the block writes there (a warning of the traced call) comes through, in order."""
    import os

    from vlaperf.profile.trace import without_profiler_log_lines

    with without_profiler_log_lines():
        os.write(2, b"USDT:2026-12-03 13:51:02 10679:10679 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning of the call\n")
        os.write(2, b"STAGE:2023-02-21 15:15:48 101902:101902 ActivityProfilerController.cpp:294] Completed Stage: Warm Up\n")
        os.write(2, b"USDT is mentioned here but not as kineto's prefix\n")
    err = capfd.readouterr().err
    assert err == "a warning of the call\nUSDT is mentioned here but not as kineto's prefix\n"


def test_inner_mark_ends_with_its_block():
    """A boundary stage marked inside a block stage ends with the block."""
    from vlaperf.profile.markers import StageRecorder
    rec = StageRecorder("cpu")
    with rec.call():
        with rec.stage("outer"):
            rec.mark("inner")
            time.sleep(0.005)
        time.sleep(0.2)  # an inner mark left open would run on to "after": >= 200 ms
        rec.mark("after")
        time.sleep(0.001)
    ms = {n: v for n, _, v in rec.calls[0].stages}
    assert ms["outer/inner"] <= ms["outer"] + 1e-6 and ms["outer/inner"] < 150


def test_default_clock_and_nvtx_follow_the_device(monkeypatch):
    """A CUDA device gets CUDA events and NVTX ranges by default, anything else perf_counter and no ranges (nothing
    here touches a GPU: the clock is replaced before any event is recorded)."""
    assert StageRecorder("cpu").timer == "perf_counter"
    assert StageRecorder("cuda").timer == "cuda_event" and isinstance(StageRecorder("cuda:0").clock,
                                                                         markers.CudaEventClock)
    pushed = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    for device in ("cpu", "cuda"):
        rec = StageRecorder(device, clock=FakeClock())
        with rec.call():
            rec.mark(f"on_{device}")
    assert pushed == ["on_cuda"]


def test_calls_do_not_nest_and_end_needs_a_begin():
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    with pytest.raises(RuntimeError, match="end_call without begin_call"):
        rec.end_call()
    with rec.call():
        with pytest.raises(RuntimeError, match="calls do not nest"):
            rec.begin_call()
    assert len(rec.calls) == 1


def test_totals_and_stage_names_by_depth():
    """totals(depth) and stage_names(depth) keep one level: nested stages are not added into their parents' level,
    "(unmarked)" is listed once, last; a stage three deep is named by its whole path."""
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    for _ in range(2):
        with rec.call():
            rec.mark("prep")
            with rec.stage("a"):
                with rec.stage("b"):
                    with rec.stage("c"):
                        pass
    call = rec.calls[0]
    assert call.totals(0) == {"prep": 1.0, "a": 5.0, UNMARKED: 2.0}  # before prep, after a
    assert call.totals(1) == {"a/b": 3.0} and call.totals(2) == {"a/b/c": 1.0}
    assert rec.stage_names() == ["prep", "a", UNMARKED]
    assert rec.stage_names(2) == ["a/b/c", UNMARKED]


def test_staged_decorators_take_the_given_name_or_the_function_s():
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)

    @rec.staged("encode")
    def enc():
        return 1

    @rec.staged()
    def decode():
        return 2

    @markers.staged("module_named")
    def f():
        return 3

    @markers.staged()
    def g():
        return 4

    with rec.activate(), rec.call():
        assert markers.active_recorder() is rec
        assert (enc(), decode(), f(), g()) == (1, 2, 3, 4)
    assert markers.active_recorder() is markers.NULL_RECORDER
    assert [n for n, _, _ in rec.calls[0].stages] == ["encode", "decode", "module_named", "g", UNMARKED]


def test_end_call_closes_every_range_left_open(monkeypatch):
    """Boundary stages still open when the call ends (no "end" mark) end with the call, and each NVTX range pushed
    for a stage is popped, at every depth."""
    events = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append(("pop",)))
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=True)
    with rec.call():  # t=1
        with rec.stage("outer"):  # t=2
            rec.mark("inner")  # t=3, open until the block ends (t=4)
        rec.mark("tail")  # t=5, open until the call ends (t=6)
    assert events == [("push", "outer"), ("push", "inner"), ("pop",), ("pop",), ("push", "tail"), ("pop",)]
    assert {n: ms for n, _, ms in rec.calls[0].stages} == {"outer": 2.0, "outer/inner": 1.0, "tail": 1.0,
                                                           UNMARKED: 2.0}


def test_ranges_close_innermost_first(monkeypatch):
    """With NVTX and a running profiler, a stage opens an NVTX range and then a record_function range: they close in
    the reverse order, so the ranges nest."""
    events = []

    class FakeRange:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(("enter", self.name))

        def __exit__(self, *exc):
            events.append(("exit", self.name))

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append(("pop",)))
    monkeypatch.setattr(torch.autograd.profiler, "record_function", FakeRange)
    monkeypatch.setattr(torch.autograd, "_profiler_enabled", lambda: True)
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=True)
    with rec.call():
        with rec.stage("s"):
            pass
    assert events == [("push", "s"), ("enter", "s"), ("exit", "s"), ("pop",)]


def test_unmarked_time_is_never_negative():
    """A mark handed a token from before the call began (an event of an earlier replay) cannot make the
    "(unmarked)" remainder negative."""
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    with rec.call():  # t=1
        rec.mark("early", token=-10.0)
        rec.mark("end")  # t=2
    (call,) = rec.calls  # ends at t=3
    assert call.totals()["early"] == 12.0 and call.unmarked_ms == 0.0


def test_no_record_function_range_without_a_running_profiler(monkeypatch):
    """record_function ranges are opened only while a profiler runs: outside one they would only add host time to
    every stage of the call being measured."""
    opened = []

    class FakeRange:
        def __init__(self, name):
            opened.append(name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(torch.autograd.profiler, "record_function", FakeRange)
    monkeypatch.setattr(torch.autograd, "_profiler_enabled", lambda: False)
    rec = StageRecorder("cpu", clock=FakeClock(), nvtx=False)
    with rec.call():
        with rec.stage("s"):
            rec.mark("m")
    assert opened == []
    monkeypatch.setattr(torch.autograd, "_profiler_enabled", lambda: True)
    with rec.call():
        with rec.stage("s"):
            rec.mark("m")
    assert opened == ["s", "m"]


def test_trace_runs_its_warm_up_untraced_and_lists_the_stages_not_its_call_ranges(tmp_path):
    """`trace` runs `warmup` calls, then `calls` traced calls each in a policy_call_<i> range; the stages it returns
    are the recorder's ranges, not those call ranges."""
    import json

    from vlaperf.profile.trace import trace

    rec = StageRecorder("cpu")
    runs = []

    def one():
        runs.append(1)
        with rec.call():
            rec.mark("alpha")
            torch.ones(4).sum()

    info = trace(one, tmp_path / "t.json", device="cpu", warmup=2, calls=3)
    assert len(runs) == 5 and info["stages"] == ["alpha"] and info["path"] == str(tmp_path / "t.json")
    names = [e.get("name") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
             if e.get("cat") == "user_annotation"]
    assert sorted(n for n in names if n.startswith("policy_call_")) == [f"policy_call_{i}" for i in range(3)]
    assert names.count("alpha") == 3  # the traced calls only


def test_trace_makes_its_folder_counts_its_events_and_passes_the_profiler_options(tmp_path):
    """The trace goes into folders made on the way; "events" is the file's event count; record_shapes and
    with_stack reach the profiler (input shapes on the ops, Python frames as events), off by default."""
    import json

    from vlaperf.profile.trace import trace

    def events(path):
        return json.loads(path.read_text())["traceEvents"]

    def one():
        torch.ones(4).sum()

    path = tmp_path / "new" / "deeper" / "t.json"
    info = trace(one, path, device="cpu")
    plain = events(path)
    assert info["events"] == len(plain) > 0 and info["stages"] == []
    assert not any("Input Dims" in e.get("args", {}) for e in plain)
    assert not any(e.get("cat") == "python_function" for e in plain)
    trace(one, path, device="cpu", record_shapes=True)
    assert any("Input Dims" in e.get("args", {}) for e in events(path))
    trace(one, path, device="cpu", with_stack=True)
    assert any(e.get("cat") == "python_function" for e in events(path))


def test_profiler_notices_filter_keeps_look_alikes_and_restores_stderr_after_an_error(capfd):
    """Only lines in kineto's own format are dropped ("STAGE:" with anything else after it is kept); an exception
    in the block propagates, and descriptor 2 is restored with what was held written back."""
    import os

    from vlaperf.profile.trace import without_profiler_log_lines

    with pytest.raises(RuntimeError, match="the traced call failed"):
        with without_profiler_log_lines():
            os.write(2, b"STAGE: a line of the call that starts like a notice\n")
            os.write(2, b"USDT:2026-12-03 13:51:02 10679:10679 SyncActivityProfilerHandler.cpp:52] profiler_stop\n")
            raise RuntimeError("the traced call failed")
    os.write(2, b"after the block\n")
    assert capfd.readouterr().err == "STAGE: a line of the call that starts like a notice\nafter the block\n"
