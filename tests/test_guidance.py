"""Real-time chunking's guidance (vlaperf.models.pi0.Guidance): the reference sampler's guided loop, the engine's
guided loop against it for each kind of loop, and the guidance weights against the RTC paper's formula by hand.
LeRobot's own RTC call is the reference in tests/test_compare_accelerate.py."""

import re

import pytest
import torch

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import Guidance, RtcConfig, build_model, get_config, rtc_prefix_weights, rtc_step_weights
from vlaperf.workloads import get_workload

STEPS = 4


def _setup(pi05=False, device="cpu"):
    cfg, wl = get_config("tiny", pi05=pi05), get_workload("tiny")
    model = build_model(cfg, device, torch.float32, seed=3)
    obs, noise = random_observation(wl, cfg, device, seed=1), random_noise(wl, cfg, device, seed=1)
    B, H, A = noise.shape
    g = torch.Generator().manual_seed(5)
    target = torch.zeros(B, H, A)
    target[:, : H - 2] = torch.randn(B, H - 2, A, generator=g)  # a leftover shorter than the chunk, zero-padded
    weights = torch.cat([torch.ones(2), torch.linspace(1, 0, 5)[1:-1], torch.zeros(H - 5)])
    guidance = Guidance(target.to(device), weights.to(device), rtc_step_weights(STEPS, 5.0, device))
    return model, obs, noise, guidance


def test_rtc_step_weights_follow_the_papers_formula():
    # tau = 1 - t; min((1 - tau) / tau * ((1 - tau)^2 + tau^2) / (1 - tau)^2, max): at t = 1 the max
    w = rtc_step_weights(10, 10.0)
    assert w.dtype == torch.float32 and w.shape == (10,)
    assert w[0].item() == 10.0  # tau = 0: the noise, held hardest
    assert w[1].item() == pytest.approx(9 * 0.82 / 0.81, rel=1e-5)  # tau = 0.1
    assert w[5].item() == pytest.approx(2.0, rel=1e-5)  # tau = 0.5: c = 1, 1 / r^2 = 2
    assert rtc_step_weights(10, 3.0).max().item() == 3.0  # clamped at the max


def test_guidance_apply_pulls_the_velocity_by_the_weighted_error():
    v, x_t = torch.full((1, 3, 2), 2.0), torch.full((1, 3, 2), 1.0)
    target = torch.full((1, 3, 2), 4.0)
    weights, step_weights = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0.0, 3.0])
    # x1 = x_t - t v = 1 - 0.25 * 2 = 0.5; error = 4 - 0.5 = 3.5; v - 3 * w * 3.5
    out = Guidance.apply(v, x_t, 0.25, 1, target, weights, step_weights)
    assert torch.allclose(out[0, :, 0], torch.tensor([2.0 - 10.5, 2.0 - 5.25, 2.0]))
    assert torch.equal(Guidance.apply(v, x_t, 0.25, 0, target, weights, step_weights), v)  # weight 0: unguided


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_reference_guidance_holds_the_chunk_start_to_the_leftover(pi05):
    model, obs, noise, guidance = _setup(pi05)
    plain = model.sample_actions(obs, noise, STEPS)
    guided = model.sample_actions(obs, noise, STEPS, guidance)
    held = slice(0, 2)  # weight 1: the positions the robot executes while this chunk is computed
    assert (guided - guidance.target)[:, held].norm() < 0.5 * (plain - guidance.target)[:, held].norm()
    free = slice(5, None)  # weight 0 there, but the model attends across the chunk: changed, not pulled
    assert not torch.equal(guided[:, free], plain[:, free])
    none = Guidance(guidance.target, torch.zeros_like(guidance.weights), guidance.step_weights)
    assert torch.equal(model.sample_actions(obs, noise, STEPS, none), plain)


@pytest.mark.parametrize("levers", ["for_loop", "exact", "static_kv_cache,fuse_projections", "sdpa"])
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_engine_guidance_equals_the_reference(levers, pi05):
    """Each kind of loop: the for_loop (with the Euler-folded head unfolded), the reference's `while` (without
    for_loop), the static cache and fused projections."""
    model, obs, noise, guidance = _setup(pi05)
    ref = model.sample_actions(obs, noise, STEPS, guidance)
    engine = Engine(model, levers)
    out = engine.sample_actions(obs, noise, STEPS, guidance)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    # new values for the same shapes: the same call, no state kept from the first
    other = Guidance(-guidance.target, guidance.weights, rtc_step_weights(STEPS, 2.0))
    ref2 = model.sample_actions(obs, noise, STEPS, other)
    assert ((engine.sample_actions(obs, noise, STEPS, other) - ref2).norm() / ref2.norm()).item() < 1e-5
    plain = model.sample_actions(obs, noise, STEPS)
    assert ((engine.sample_actions(obs, noise, STEPS) - plain).norm() / plain.norm()).item() < 1e-5


def test_per_sample_weights_guide_each_row_as_its_own_call():
    """Weights (B, H): each sample with its own delay, a row of zeros unguided, in one call equal to each row
    run alone (the reference and the engine)."""
    cfg, wl = get_config("tiny"), get_workload("tiny").with_overrides(batch=3)
    model = build_model(cfg, "cpu", torch.float32, seed=3)
    obs, noise = random_observation(wl, cfg, "cpu", seed=1), random_noise(wl, cfg, "cpu", seed=1)
    B, H, A = noise.shape
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(5))
    rows = [rtc_prefix_weights(2, 6, H), rtc_prefix_weights(0, 4, H, "exp"), torch.zeros(H)]
    guidance = Guidance(target, torch.stack(rows), rtc_step_weights(STEPS, 5.0))
    batched = model.sample_actions(obs, noise, STEPS, guidance)
    engine_out = Engine(model, "for_loop,static_kv_cache").sample_actions(obs, noise, STEPS, guidance)
    assert ((engine_out - batched).norm() / batched.norm()).item() < 1e-5
    plain = model.sample_actions(obs, noise, STEPS)
    for i, w in enumerate(rows):
        alone = model.sample_actions(obs, noise, STEPS, Guidance(target, w, guidance.step_weights))
        assert torch.allclose(batched[i], alone[i], atol=1e-5), i
    assert torch.allclose(batched[2], plain[2], atol=1e-6)  # zero weights: unguided
    assert not torch.allclose(batched[0], plain[0], atol=1e-3)


def test_rtc_prefix_weights_by_hand():
    # delay 2, execution horizon 6, chunk 8: two frozen, three strictly between 1 and 0 evenly, zero from 6 on
    assert rtc_prefix_weights(2, 6, 8).tolist() == pytest.approx([1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0])
    lin = torch.tensor([0.8, 0.6, 0.4, 0.2])
    exp = (lin * torch.expm1(lin) / (torch.e - 1)).tolist()
    assert rtc_prefix_weights(2, 6, 8, "exp").tolist() == pytest.approx([1, 1, *exp, 0, 0])
    assert rtc_prefix_weights(2, 6, 8, "ones").tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert rtc_prefix_weights(2, 6, 8, "zeros").tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert rtc_prefix_weights(9, 6, 8).tolist() == [1] * 6 + [0, 0]  # the delay counts up to the horizon
    assert rtc_prefix_weights(0, 20, 4).tolist() == pytest.approx([0.8, 0.6, 0.4, 0.2])  # horizon past the chunk
    with pytest.raises(ValueError, match="delay: expected an integer >= 0, got -1"):
        rtc_prefix_weights(-1, 6, 8)
    with pytest.raises(ValueError, match="schedule: expected one of linear, exp, ones, zeros, got 'cosine'"):
        rtc_prefix_weights(1, 6, 8, "cosine")


@pytest.mark.parametrize("kwargs, message", [
    ({"execution_horizon": 0}, "rtc execution_horizon: expected an integer >= 1, got 0"),
    ({"max_guidance_weight": float("inf")}, "rtc max_guidance_weight: expected a finite number > 0, got inf"),
    ({"schedule": "LINEAR"}, "rtc schedule: expected one of linear, exp, ones, zeros, got 'LINEAR'"),
])
def test_rtc_config_names_a_bad_setting(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RtcConfig(**kwargs)


@pytest.mark.parametrize("field, value, shape", [
    ("target", torch.zeros(1, 3, 2), "(1, 10, 8)"),
    ("weights", torch.zeros(10, dtype=torch.float64), "(10,) or (1, 10)"),
    ("step_weights", torch.zeros(STEPS + 1), f"({STEPS},)"),
])
def test_a_wrong_guidance_tensor_is_named(field, value, shape):
    model, obs, noise, guidance = _setup()
    setattr(guidance, field, value)
    message = re.escape(f"guidance.{field}: expected a float32 tensor {shape} on cpu")
    for sampler in (model, Engine(model, "exact")):
        with pytest.raises(ValueError, match=message):
            sampler.sample_actions(obs, noise, STEPS, guidance)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("levers", ["graph", "best"])
def test_guidance_in_a_cuda_graph_takes_each_calls_values(levers):
    """The guidance tensors are graph inputs: one capture for the guided shapes, each call's values replayed; the
    guided calls no further from the reference than the variant's unguided call is."""
    model, obs, noise, guidance = _setup(device="cuda")
    engine = Engine(model, _gpu_levers(levers))
    other = Guidance(-guidance.target, guidance.weights.flip(0), rtc_step_weights(STEPS, 2.0, "cuda"))
    for g in (guidance, other, guidance):
        ref = model.sample_actions(obs, noise, STEPS, g)
        out = engine.sample_actions(obs, noise, STEPS, g)
        assert _rel(out, ref) <= _guided_tolerance(engine, model, obs, noise), levers
    assert engine.graphs.captures == 2  # the guided shapes' graph and the unguided call's of the tolerance
    engine.sample_actions(obs, noise, STEPS)  # unguided: its graph, replayed
    assert engine.graphs.captures == 2


def _gpu_levers(levers: str) -> str:
    """`best` as it resolves for a bfloat16 model on this GPU (on Hopper the Triton kernels and the megakernel too):
    `best` of these float32 models leaves the kernels out, and the guidance through the kernels is what is tested."""
    from vlaperf.engine import Levers

    return ",".join(Levers.parse("best", "cuda", torch.bfloat16).names()) if levers == "best" else levers


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def _guided_tolerance(engine, model, obs, noise) -> float:
    """What a guided call may differ from the reference's: the variant's own unguided distance to the reference,
    with slack, or 1e-4 (float32) where that is smaller. The guidance is float32 elementwise work after the step's
    head: it adds no error of its own. On an H100 (benchmarks/guidance_error_probe.py, session 47) `best`'s unguided
    calls on tiny float32 were 0.9-1.1e-3 from the reference (its step kernel rounds activations to bf16), the guided
    ones 0.6-1.1e-3 at every guidance weight from 0 to 10; `graph`'s 4-9e-7 both."""
    return max(1e-4, 1.5 * _rel(engine.sample_actions(obs, noise, STEPS), model.sample_actions(obs, noise, STEPS)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("levers", ["graph", "best"])
def test_per_sample_weights_in_a_cuda_graph(levers):
    """A server's batch (weights (B, H), a row of zeros for an observation without a previous chunk): one capture
    for the shapes, each call's rows replayed, the unguided row as the unguided call's."""
    cfg, wl = get_config("tiny"), get_workload("tiny").with_overrides(batch=2)
    model = build_model(cfg, "cuda", torch.float32, seed=3)
    obs, noise = random_observation(wl, cfg, "cuda", seed=1), random_noise(wl, cfg, "cuda", seed=1)
    B, H, A = noise.shape
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(5)).cuda()
    steps = rtc_step_weights(STEPS, 5.0, "cuda")
    engine = Engine(model, _gpu_levers(levers))
    plain = model.sample_actions(obs, noise, STEPS)
    tolerance = _guided_tolerance(engine, model, obs, noise)
    for rows in ([rtc_prefix_weights(2, 6, H), torch.zeros(H)], [torch.zeros(H), rtc_prefix_weights(0, 8, H, "exp")]):
        guidance = Guidance(target, torch.stack(rows).cuda(), steps)
        ref = model.sample_actions(obs, noise, STEPS, guidance)
        out = engine.sample_actions(obs, noise, STEPS, guidance)
        assert _rel(out, ref) <= tolerance, levers
        unguided = 1 if rows[1].sum() == 0 else 0
        assert _rel(out[unguided], plain[unguided]) <= tolerance
    assert engine.graphs.captures == 2  # the guided shapes' graph, and the unguided call's of the tolerance
