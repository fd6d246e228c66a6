"""CPU tests of vlaperf.profile.breakdown on the tiny model: the staged reference reproduces
`model.sample_actions` exactly, and the stages cover the call."""

from __future__ import annotations

import time

import pytest
import torch

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.profile.breakdown import breakdown, breakdown_fn, reference_sample_staged, stage_stats
from vlaperf.profile.markers import UNMARKED, StageRecorder
from vlaperf.report.schema import validate_result
from vlaperf.workloads import get_workload

# Stages sum to the instrumented span by construction; that span must stay within this
# fraction of the untimed call's median on a shared CPU (marks cost microseconds each).
COVERAGE_TOLERANCE = 0.25

REFERENCE_STAGES = ["image_0_embed", "image_1_embed", "image_2_embed", "lang_embed", "prefix_concat",
                    "mask_position_build", "prefix_prefill", "loop_setup", "denoise_step", "output", UNMARKED]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # less noise from other processes on a shared CPU
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", dtype=torch.float32), get_workload("tiny")


@pytest.mark.parametrize("steps,seed", [(1, 0), (4, 1), (7, 2)])
def test_staged_reference_equals_sample_actions_exactly(tiny, steps, seed):
    model, w = tiny
    obs = random_observation(w, model.config, seed=seed)
    noise = random_noise(w, model.config, seed=seed)
    marks = []
    out = reference_sample_staged(model, obs, noise, steps, marks.append)
    ref = model.sample_actions(obs, noise, steps)
    assert torch.equal(out, ref)
    assert marks.count("loop_setup") == 1
    assert [m for m in marks if m.startswith("denoise_step_")] == [f"denoise_step_{i}" for i in range(steps)]


def test_reference_breakdown_covers_the_call(tiny):
    model, w = tiny
    result = breakdown(model, w, warmup=2, iters=30)  # 30 alternating pairs: medians that hold on a shared CPU
    validate_result(result)
    assert result["command"] == "breakdown" and result["mode"] == "model"
    bd = result["breakdown"]
    assert bd["path"] == "reference"
    assert bd["matches_reference"] == {"exact": True, "max_abs": 0.0}
    assert [s["name"] for s in bd["stages"]] == REFERENCE_STAGES
    steps = {s["name"]: s for s in bd["stages"]}["denoise_step"]
    assert steps["per_call"] == w.steps
    assert len(steps["occurrence"]["by_index_median_ms"]) == w.steps
    assert steps["occurrence"]["max_ms"] >= steps["occurrence"]["mean_ms"] > 0
    images = {s["name"]: s["info"] for s in bd["stages"] if s["name"].startswith("image_")}
    assert images["image_2_embed"] == {"slot": 2, "tokens": 16, "valid": False, "embedded": True}
    assert images["image_0_embed"]["valid"] is True
    # every call's stages add up to its span; the span is close to the untimed call
    assert bd["stage_sum_of_medians_ms"] > 0
    assert abs(bd["coverage"] - 1.0) <= COVERAGE_TOLERANCE, bd["statement"]
    assert bd["statement"].startswith("stages sum to ") and "% of the untimed call" in bd["statement"]
    assert result["timers"]["wall_ms"]["count"] == 30


def test_engine_breakdown_uses_stage_hook(tiny):
    model, w = tiny
    result = breakdown(model, w, levers="for_loop,sdpa", warmup=1, iters=6)
    bd = result["breakdown"]
    assert bd["path"] == "engine" and bd["levers_timed"] == ["for_loop", "sdpa"]
    assert [s["name"] for s in bd["stages"]] == ["setup", "embed_prefix", "prefill", "denoise_step", UNMARKED]
    assert bd["matches_reference"]["exact"]
    assert result["variant"]["levers"] == ["for_loop", "sdpa"]


@pytest.mark.parametrize("levers,prefix_stages", [
    ("for_loop,compile", ["prefix"]),  # the prefix compiled as one function: one stage
    ("for_loop,sdpa,compile,compile_layers", ["embed_prefix", "prefill"]),  # best's form on a GPU
])
def test_compiled_variant_is_broken_down_as_requested(tiny, levers, prefix_stages):
    """A compiled variant is timed itself (it used to be broken down without compile): the marks fall
    between compiled functions, the actions are bit for bit the untimed call's, and setting or
    clearing the stage hook compiles nothing again."""
    import torch._dynamo

    model, w = tiny
    torch._dynamo.reset()
    engine = Engine(model, levers, compile_backend="eager")  # traces as inductor would, no code generation
    engine.sample_actions(*(random_observation(w, model.config, seed=0), random_noise(w, model.config, seed=0)), w.steps)
    with torch._dynamo.config.patch(error_on_recompile=True):
        result = breakdown(model, w, levers=engine, warmup=1, iters=3)
    bd = result["breakdown"]
    assert bd["levers_timed"] == engine.levers.names() == result["variant"]["levers"]
    assert [s["name"] for s in bd["stages"]] == ["setup", *prefix_stages, "denoise_step", UNMARKED]
    assert {s["name"]: s for s in bd["stages"]}["denoise_step"]["per_call"] == w.steps
    assert bd["matches_reference"] == {"exact": True, "max_abs": 0.0}
    assert not any("without" in n for n in bd["notes"]), bd["notes"]
    validate_result(result)


def test_policy_mode_adds_transform_and_copies(tiny):
    model, w = tiny
    result = breakdown(model, w, mode="policy", warmup=1, iters=6)
    bd = result["breakdown"]
    names = [s["name"] for s in bd["stages"]]
    assert names[:3] == ["input_transform", "host_to_device", "image_preprocess"]
    assert names[-2:] == ["device_to_host", UNMARKED]
    assert "prefix_prefill" in names and "denoise_step" in names
    assert bd["matches_reference"]["exact"]  # same actions as Policy.infer, bit for bit
    validate_result(result)


def test_stage_stats_groups_steps_and_repeats():
    rec = StageRecorder("cpu")
    for _ in range(3):
        with rec.call():
            rec.mark("prep")
            for i in range(3):
                rec.mark(f"denoise_step_{i}")
            for _ in range(2):
                with rec.stage("repeat"):
                    pass
    stats = stage_stats(rec.calls)
    by = {s["name"]: s for s in stats["stages"]}
    assert by["denoise_step"]["per_call"] == 3 and len(by["denoise_step"]["occurrence"]["by_index_median_ms"]) == 3
    assert by["repeat"]["per_call"] == 2 and "by_index_median_ms" not in by["repeat"]["occurrence"]
    assert list(by)[-1] == UNMARKED


def test_breakdown_fn_for_any_callable():
    calls = []

    def policy(rec):
        rec.mark("one")
        torch.ones(100).sum()
        rec.mark("two")
        calls.append(1)
        rec.mark("end")

    out = breakdown_fn(policy, warmup=1, iters=4)
    assert [s["name"] for s in out["stages"]] == ["one", "two", UNMARKED]
    assert out["untimed"]["iters"] == 4
    assert len(calls) == 1 + 4 + (1 + 4)  # warm-up, instrumented, untimed (its warm-up + timed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["model", "policy"])
def test_cuda_graph_variant_is_timed_inside_its_graph(mode):
    """With cuda_graph the stages come from event nodes of a second capture of the call, read after each
    replay: the same stage names as the plain path, every stage timed, the actions bit for bit those of
    the untimed graph, and each graph captured once."""
    model, w = build_model("tiny", "cuda", torch.float32, seed=0), get_workload("tiny")
    engine = Engine(model, "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,"
                           "cuda_graph")
    result = breakdown(model, w, levers=engine, mode=mode, warmup=2, iters=10)
    bd = result["breakdown"]
    names = [s["name"] for s in bd["stages"]]
    model_stages = ["setup", "embed_prefix", "prefill", "denoise_step"]
    if mode == "model":
        assert names == [*model_stages, UNMARKED]
    else:
        assert names == ["input_transform", "host_to_device", "image_preprocess", *model_stages, "device_to_host",
                         UNMARKED]
    stages = {s["name"]: s for s in bd["stages"]}
    assert stages["denoise_step"]["per_call"] == w.steps
    assert all(stages[n]["median_ms"] > 0 for n in model_stages)
    assert bd["matches_reference"] == {"exact": True, "max_abs": 0.0}
    assert engine.graphs.captures == 2  # the untimed graph and the timed one, once each
    timed = [e for key, e in engine.graphs.entries.items() if key[-1] == "timed"]
    assert len(timed) == 1 and [n for n, _ in timed[0].stage_events][-1] == "end"
    assert any("inside the CUDA graph" in n for n in bd["notes"])
    assert abs(bd["coverage"] - 1.0) <= COVERAGE_TOLERANCE, bd["statement"]
    validate_result(result)


def test_step_counts_are_checked_as_sample_actions_checks_them():
    """breakdown(num_steps=-1) ran the staged reference's loop forever (it skipped sample_actions' checks), 0 became
    the workload's default without a word, and 2.5 ran 3 steps; each is now the ValueError sample_actions gives."""
    model = build_model("tiny", seed=0)
    for steps in (-1, 0, 2.5, True):
        with pytest.raises(ValueError, match=rf"num_steps: expected an integer in 1\.\.1000, got {steps!r}"):
            breakdown(model, "tiny", iters=2, warmup=1, num_steps=steps)
    w = get_workload("tiny")
    obs, noise = random_observation(w, model.config, seed=1), random_noise(w, model.config, seed=1)
    with pytest.raises(ValueError, match="num_steps: expected an integer"):
        reference_sample_staged(model, obs, noise, 2.5)  # a finite loop (3 steps) if the check were gone
    with pytest.raises(ValueError, match=r"noise: expected a float tensor \(1, 10, 8\)"):
        reference_sample_staged(model, obs, noise[:, :3], 3)
    assert torch.equal(reference_sample_staged(model, obs, noise, 3), model.sample_actions(obs, noise, 3))


def _rec(stages, span):
    from vlaperf.profile.markers import CallRecord
    return CallRecord(stages=[(n, 0, ms) for n, ms in stages], span_ms=span)


def test_stage_stats_per_call_and_share():
    """Per_call is the most occurrences in any call; share is the stage's median over the span's median."""
    from vlaperf.profile.breakdown import stage_stats
    calls = [_rec([("a", 1.0), ("a", 1.0), ("b", 2.0)], 4.0), _rec([("a", 1.0), ("b", 2.0)], 4.0),
             _rec([("a", 9.0), ("b", 2.0)], 12.0)]
    st = {s["name"]: s for s in stage_stats(calls)["stages"]}
    assert st["a"]["per_call"] == 2 and st["b"]["per_call"] == 1
    assert st["a"]["share"] == pytest.approx(2.0 / 4.0)  # median of totals (2, 1, 9) over median span (4)


def test_breakdown_fn_counts_and_coverage():
    """Iters not divisible by blocks still makes iters untimed calls; coverage = instrumented / untimed."""
    from vlaperf.profile.breakdown import breakdown_fn

    def call(rec):
        rec.mark("work")
        time.sleep(0.002)

    res = breakdown_fn(call, iters=5, blocks=2, warmup=1, untimed=lambda: time.sleep(0.05))
    assert res["untimed"]["iters"] == 5 and len(res["untimed"]["samples"]["wall_ms"]) == 5
    assert res["coverage"] < 0.5  # ~2 ms instrumented over ~50 ms untimed (sleeps only run long: margin for load)
