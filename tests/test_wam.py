"""The world-action model (models/wam.py), its engine (engine/wam.py) and commands, on wam-tiny."""

from __future__ import annotations

import json

import pytest
import torch

from vlaperf.check import check_wam_equivalence, compare
from vlaperf.engine.levers import LeverError
from vlaperf.engine.wam import WAM_EXACT, WAM_LEVERS, WamEngine, WamLevers
from vlaperf.models.wam import (
    PRESETS,
    SPARSITY,
    WorldActionModel,
    build_wam,
    get_config,
    keep_mask,
    mae_mask,
    random_wam_inputs,
)
from vlaperf.workloads import get_wam_workload, get_workload

CPU = torch.device("cpu")
STEPS = 4


@pytest.fixture(scope="module")
def tiny():
    return build_wam("wam-tiny", seed=0)


@pytest.fixture(scope="module")
def inputs(tiny):
    return random_wam_inputs(tiny.config, 2, "cpu", torch.float32, seed=3)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ------------------------------------------------------------------------- model


def test_sequence_layouts_match_the_workloads_file():
    full, tiny = get_config("wam"), get_config("wam-tiny")
    assert full.seq_len == 761 and tiny.seq_len == 53  # 6 x 120 + 1 + 40; 6 x 8 + 1 + 4
    assert int(keep_mask(full, "drop_middle").sum()) == 521
    assert int(keep_mask(full, "none").sum()) == int(keep_mask(full, "mae_middle").sum()) == 761
    masked = mae_mask(full, "mae_middle")
    assert int(masked.sum()) == 180 == full.frame_tokens // 4  # a quarter of the frame tokens
    assert not masked[: 2 * full.patches].any() and not masked[4 * full.patches:].any()  # the two middle frames only


def test_full_preset_is_a_wan_1_3b_class_model():
    with torch.device("meta"):
        model = WorldActionModel(PRESETS["wam"])
    blocks = sum(p.numel() for p in model.blocks.parameters())
    assert 1.3e9 < blocks < 1.5e9, blocks  # 30 blocks of width 1536, MLP 8960, self + cross attention
    assert len(model.blocks) == 30 and model.blocks[0].self_attn.q.weight.shape == (1536, 1536)
    assert model.blocks[0].ffn[0].weight.shape == (8960, 1536)


def test_reference_generate_is_deterministic_finite_and_seed_dependent(tiny, inputs):
    obs, noise = inputs
    a1, v1 = tiny.generate(obs, noise, STEPS, 2)
    a2, v2 = tiny.generate(obs, noise, STEPS, 2)
    assert a1.shape == (2, 4, 8) and v1.shape == (2, 5, 8, 16)
    assert torch.equal(a1, a2) and torch.equal(v1, v2)
    assert torch.isfinite(a1).all() and torch.isfinite(v1).all()
    obs3, noise3 = random_wam_inputs(tiny.config, 2, "cpu", torch.float32, seed=4)
    assert rel(tiny.generate(obs3, noise3, STEPS, 2)[0], a1) > 0.1
    # the two samples of the batch differ, and sample 0 alone gives sample 0 of the batch
    assert rel(a1[0], a1[1]) > 0.1
    one = (type(obs)(obs.context[:1], obs.text[:1], obs.state[:1]), type(noise)(noise.video[:1], noise.actions[:1]))
    assert rel(tiny.generate(*one, STEPS, 2)[0], a1[:1]) < 1e-5


def test_the_video_never_sees_the_actions_but_the_actions_see_the_video(tiny, inputs):
    """The attention rule: what makes video_kv_cache exact."""
    obs, noise = inputs
    a, v = tiny.generate(obs, noise, STEPS)
    other = type(noise)(noise.video, noise.actions + 1.0)
    a2, v2 = tiny.generate(obs, other, STEPS)
    assert torch.equal(v, v2) and rel(a2, a) > 1e-3
    moved = type(noise)(noise.video + 1.0, noise.actions)
    assert rel(tiny.generate(obs, moved, STEPS)[0], a) > 1e-3


def test_drop_middle_never_sees_the_dropped_frames_and_zeroes_them(tiny, inputs):
    obs, noise = inputs
    a, v = tiny.generate(obs, noise, STEPS, sparsity="drop_middle")
    dropped = slice(1, 3)  # frames 2 and 3 of 6, after the one context frame
    assert float(v[:, dropped].abs().max()) == 0.0
    assert float(v[:, 0].abs().min()) > 0  # kept frames are predicted
    video = noise.video.clone()
    video[:, dropped] += 5.0
    a2, v2 = tiny.generate(obs, type(noise)(video, noise.actions), STEPS, sparsity="drop_middle")
    assert torch.equal(a, a2) and torch.equal(v, v2)
    # without sparsity, the same change moves the actions
    assert rel(tiny.generate(obs, type(noise)(video, noise.actions), STEPS)[0], tiny.generate(obs, noise, STEPS)[0]) > 1e-4


def test_mae_middle_replaces_the_masked_tokens_inputs(tiny, inputs):
    obs, noise = inputs
    a, _ = tiny.generate(obs, noise, STEPS, sparsity="mae_middle")
    cfg = tiny.config
    video = noise.video.clone().view(2, cfg.video_frames * cfg.patches, -1)
    masked = mae_mask(cfg, "mae_middle")[cfg.context_frames * cfg.patches: cfg.frame_tokens]
    video[:, masked] += 5.0  # the masked tokens' first inputs are replaced: the first forward cannot see this
    changed = type(noise)(video.view_as(noise.video), noise.actions)
    # later steps see the sampler's update of those tokens (their x0 prediction), so only step 1 is blind to it
    a1, _ = tiny.generate(obs, noise, 1, sparsity="mae_middle")
    b1, _ = tiny.generate(obs, changed, 1, sparsity="mae_middle")
    assert torch.equal(a1, b1)
    assert rel(tiny.generate(obs, noise, 1)[0], tiny.generate(obs, changed, 1)[0]) > 1e-4
    assert rel(a, tiny.generate(obs, noise, STEPS)[0]) > 1e-3  # the mode changes the result


def test_sampling_arguments_are_checked(tiny, inputs):
    obs, noise = inputs
    with pytest.raises(ValueError, match="video_steps must be an integer in 1..steps"):
        tiny.generate(obs, noise, 4, video_steps=5)
    with pytest.raises(ValueError, match="sparsity must be one of"):
        tiny.generate(obs, noise, 4, sparsity="drop_all")
    for scale in (-1.0, float("inf"), 1e30):
        with pytest.raises(ValueError, match=r"cfg_scale must be in \[0, 100\]"):
            tiny.generate(obs, noise, 4, cfg_scale=scale)
    for steps in (0, 10**6, True):
        with pytest.raises(ValueError, match="steps must be an integer in 1..1000"):
            tiny.generate(obs, noise, steps)
    with pytest.raises(ValueError, match="shift must be a finite number > 0"):
        tiny.generate(obs, noise, 4, shift=float("inf"))
    with pytest.raises(ValueError, match="obs.state: expected the model's dtype torch.float32, got torch.float64"):
        tiny.generate(type(obs)(obs.context, obs.text, obs.state.double()), noise, 4)
    with pytest.raises(ValueError, match="noise.actions: expected a floating tensor, got torch.int64"):
        tiny.generate(obs, type(noise)(noise.video, noise.actions.long()), 4)
    # each of these was an error from inside a layer or the sampler, or, for float16 noise, float16 results
    as_double = type(obs)(obs.context.double(), obs.text.double(), obs.state.double())
    engine = WamEngine(tiny, "exact")
    for generate in (tiny.generate, engine.generate):
        with pytest.raises(ValueError, match="obs.context: expected the model's dtype torch.float32, got torch.float64"):
            generate(as_double, noise, 4)
        with pytest.raises(ValueError, match=r"noise.video: expected float32 \(the sampler's state"):
            generate(obs, type(noise)(noise.video.half(), noise.actions), 4)
        with pytest.raises(ValueError, match="obs.state: on meta, the model is on cpu"):
            generate(type(obs)(obs.context, obs.text, obs.state.to("meta")), noise, 4)
        # the noise is checked as the observation is: its dtype (both parts) and its device
        with pytest.raises(ValueError, match=r"noise.actions: expected float32 \(the sampler's state"):
            generate(obs, type(noise)(noise.video, noise.actions.half()), 4)
        with pytest.raises(ValueError, match="noise.video: on meta, the model is on cpu"):
            generate(obs, type(noise)(noise.video.to("meta"), noise.actions), 4)
        with pytest.raises(ValueError, match="video_steps must be an integer in 1..steps"):
            generate(obs, noise, 4, video_steps=True)
        for name in ("cfg_scale", "shift"):
            with pytest.raises(ValueError, match=f"{name} must be a number, got '3'"):
                generate(obs, noise, 4, **{name: "3"})
        with pytest.raises(TypeError, match="obs: expected a WamObservation, got NoneType"):
            generate(None, noise, 4)
    with pytest.raises(ValueError, match="unknown world-action model preset"):
        get_config("wam-huge")


@pytest.mark.parametrize("axis", ["last", "second"])
@pytest.mark.parametrize("field", ["context", "text", "state", "video", "actions"])
def test_wrong_input_shapes_name_the_field(tiny, inputs, field, axis):
    """One short along the last axis (channels, widths) or the second (frames, text tokens, horizon): a few
    text tokens or video frames too few would otherwise run, or fail deep inside a block."""
    obs, noise = inputs
    where = obs if field in ("context", "text", "state") else noise
    value = getattr(where, field)
    bad = type(where)(**{**where.__dict__, field: value[..., :-1] if axis == "last" else value[:, :-1]})
    args = (bad, noise) if where is obs else (obs, bad)
    prefix = "obs" if where is obs else "noise"
    for run in (tiny.generate, WamEngine(tiny, "exact").generate):
        with pytest.raises(ValueError, match=rf"{prefix}\.{field}: expected shape \(2, "):
            run(*args, STEPS)


# ------------------------------------------------------------------------ engine

SETTINGS = [  # (video_steps, sparsity, cfg_scale)
    (2, "none", 0.0), (4, "none", 0.0), (2, "drop_middle", 0.0), (4, "drop_middle", 0.0), (2, "mae_middle", 0.0),
    (2, "none", 1.5), (2, "drop_middle", 1.5),
]


@pytest.mark.parametrize("levers", list(WAM_EXACT) + ["exact"])
@pytest.mark.parametrize("video_steps,sparsity,cfg_scale", SETTINGS)
def test_each_lever_is_equivalent_to_the_reference(tiny, inputs, levers, video_steps, sparsity, cfg_scale):
    obs, noise = inputs
    ref_a, ref_v = tiny.generate(obs, noise, STEPS, video_steps, sparsity, cfg_scale)
    a, v = WamEngine(tiny, levers).generate(obs, noise, STEPS, video_steps, sparsity, cfg_scale)
    assert compare(a, ref_a, torch.float32)["passed"], rel(a, ref_a)
    assert compare(v, ref_v, torch.float32)["passed"], rel(v, ref_v)


def test_one_engine_keeps_each_schedule_and_batch_apart(tiny, inputs):
    """host_schedule keeps the time tables of each (steps, video_steps, shift, batch): one engine called with
    another shift, another video schedule or another batch gets that call's tables, not the previous one's."""
    obs, noise = inputs
    engine = WamEngine(tiny, "exact")
    one = (type(obs)(obs.context[:1], obs.text[:1], obs.state[:1]), type(noise)(noise.video[:1], noise.actions[:1]))
    for (o, n), video_steps, shift in (((obs, noise), 2, 3.0), ((obs, noise), 2, 1.0), ((obs, noise), STEPS, 1.0),
                                       (one, STEPS, 1.0)):
        ref_a, ref_v = tiny.generate(o, n, STEPS, video_steps, shift=shift)
        a, v = engine.generate(o, n, STEPS, video_steps, shift=shift)
        assert compare(a, ref_a, torch.float32)["passed"], (video_steps, shift, rel(a, ref_a))
        assert compare(v, ref_v, torch.float32)["passed"], (video_steps, shift, rel(v, ref_v))


def test_the_engine_with_two_context_frames_is_the_reference():
    """wam-tiny observes one frame; with two observed frames the sparse sampler's kept frames start after both of
    them in the sequence, and drop_middle drops overall frames 3 and 4 of 8 (predicted frames 1 and 2)."""
    model = build_wam(get_config("wam-tiny", frames=8, context_frames=2))
    obs, noise = random_wam_inputs(model.config, 1, "cpu", torch.float32, seed=5)
    for sparsity in ("drop_middle", "mae_middle"):
        ref_a, ref_v = model.generate(obs, noise, 3, 2, sparsity)
        a, v = WamEngine(model, "exact").generate(obs, noise, 3, 2, sparsity)
        assert compare(a, ref_a, torch.float32)["passed"] and compare(v, ref_v, torch.float32)["passed"], sparsity
        if sparsity == "drop_middle":
            assert float(v[:, 1:3].abs().max()) == 0.0
            assert float(v[:, [0, 3, 4, 5]].abs().amax(dim=(0, 2, 3)).min()) > 0


def test_forward_once_is_the_models_forward(tiny, inputs):
    """`bench --mode forward` times engine.forward_once: the action velocity of model.forward at sigma for both
    the video and the actions, at each sparsity, with and without the levers."""
    obs, noise = inputs
    frames = torch.cat([obs.context.float(), noise.video], dim=1)
    for sigma in (0.5, 0.2):
        s = torch.full((2,), sigma)
        for sparsity in SPARSITY:
            _, want = tiny.forward(frames, obs.state, noise.actions, s, s, obs.text, sparsity)
            for levers in ("reference", "exact"):
                got = WamEngine(tiny, levers).forward_once(obs, noise, sparsity, sigma)
                assert got.shape == want.shape and rel(got, want) < 1e-5, (sigma, sparsity, levers)


def test_fused_block_is_the_models_block(tiny):
    """fuse_projections' block (engine/wam.py) against WamBlock.forward, float32: one stacked
    q/k/v matmul and one context k/v matmul compute what the separate projections compute,
    with and without cached video keys; the model's own weights are left as they were."""
    from vlaperf.engine.wam import block_step, context_kv_step

    cfg = tiny.config
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 9, cfg.width, generator=g)
    e = torch.randn(2, 9, 6, cfg.width, generator=g)
    ctx = torch.randn(2, cfg.text_tokens, cfg.width, generator=g)
    cached = tuple(torch.randn(2, cfg.num_heads, 5, cfg.head_dim, generator=g) for _ in range(2))
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    engine = WamEngine(tiny, "exact")
    assert not engine._gelu_epilogue  # the CPU's `_addmm_activation` is the erf GELU: never used there
    block, fused_qkv, fused_ctx = tiny.blocks[1], engine._fused_qkv[1], engine._fused_context[1]
    assert fused_qkv[0].shape == (3 * cfg.width, cfg.width) and fused_ctx[0].shape == (2 * cfg.width, cfg.width)
    ref_ctx = block.cross_attn.context_kv(ctx)
    got_ctx = context_kv_step(block.cross_attn, ctx, fused_ctx)
    for a, b in zip(got_ctx, ref_ctx):
        assert rel(a, b) < 1e-6
    for kv in (None, cached):
        for sdpa in (False, True):
            ref = block_step(block, x, e, ref_ctx, None, 0, sdpa, kv)
            got = block_step(block, x, e, ref_ctx, None, 0, sdpa, kv, fused_qkv)
            for a, b in zip(got, ref):
                assert rel(a, b) < 1e-6, (kv is None, sdpa, rel(a, b))
    assert all(torch.equal(v, before[k]) for k, v in tiny.state_dict().items())


def test_flash_actions_sends_only_half_precision_calls_to_the_flash_kernel(tiny, monkeypatch):
    """The CUDA flash kernel refuses float32 ("FlashAttention only support fp16 and bf16"), and `best` (which holds
    flash_actions) is allowed on a float32 GPU model: float32 calls keep sdpa's own choice, bf16 ones go to flash.
    The flash op is replaced by a recorder here (its CPU form would take float32, unlike the CUDA one)."""
    import torch.nn.functional as F

    from vlaperf.engine.wam import block_step

    calls = []

    def fake_flash(q, k, v):
        calls.append(q.dtype)
        return (F.scaled_dot_product_attention(q, k, v),)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention", fake_flash)
    cfg = tiny.config
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 5, cfg.width, generator=g)
    e = torch.randn(1, 5, 6, cfg.width, generator=g)
    block = tiny.blocks[0]
    ctx = block.cross_attn.context_kv(torch.randn(1, cfg.text_tokens, cfg.width, generator=g))
    block_step(block, x, e, ctx, None, 0, True, flash_actions=True)
    assert calls == []  # float32: not the flash kernel
    bf16 = build_wam("wam-tiny", dtype=torch.bfloat16, seed=0).blocks[0]
    block_step(bf16, x.bfloat16(), e, tuple(t.bfloat16() for t in ctx), None, 0, True, flash_actions=True)
    assert calls and set(calls) == {torch.bfloat16}  # self- and cross-attention of the 5 queries


@pytest.mark.parametrize("video_steps,sparsity,cfg_scale", SETTINGS)
def test_group_modulation_is_exact(tiny, inputs, video_steps, sparsity, cfg_scale):
    """The per-group table indexed inside each block gives the per-token modulation's values:
    the same result to float32 rounding, with and without the action-only forwards."""
    obs, noise = inputs
    ref = WamEngine(tiny, "exact").generate(obs, noise, STEPS, video_steps, sparsity, cfg_scale)
    got = WamEngine(tiny, "exact,group_modulation").generate(obs, noise, STEPS, video_steps, sparsity, cfg_scale)
    for a, b in zip(got, ref):
        assert rel(a, b) < 1e-6


def test_group_modulation_passes_the_table_not_per_token_rows(tiny, inputs, monkeypatch):
    """What the lever is for: the blocks receive the (B, 3, 6, D) table and the token groups."""
    from vlaperf.engine import wam as engine_wam

    obs, noise = inputs
    seen = []
    real = engine_wam.block_step

    def spy(block, x, e_tok, *rest):
        seen.append((tuple(e_tok.shape), len(rest) > 7 and rest[7] is not None))  # rest[7]: groups
        return real(block, x, e_tok, *rest)

    monkeypatch.setattr(engine_wam, "block_step", spy)
    WamEngine(tiny, "exact,group_modulation").generate(obs, noise, STEPS, STEPS)
    cfg = tiny.config
    assert seen and all(shape == (2, 3, 6, cfg.width) and has_groups for shape, has_groups in seen)
    seen.clear()
    WamEngine(tiny, "exact").generate(obs, noise, STEPS, STEPS)
    assert seen and all(shape == (2, cfg.seq_len, 6, cfg.width) and not g for shape, g in seen)


def test_release_reference_weights_frees_the_stacked_copies_and_the_engine_runs_on(inputs):
    """fuse_projections holds stacked q/k/v and context k/v weights; releasing the model's own
    frees those bytes, the engine's result is unchanged, and the reference refuses to run."""
    model = build_wam("wam-tiny", seed=0)
    obs, noise = inputs
    engine = WamEngine(model, "exact")
    before = engine.generate(obs, noise, STEPS, 2)
    cfg = model.config
    per_block = 5 * (cfg.width * cfg.width + cfg.width) * 4  # q, k, v, context k, v: weights and biases, float32
    assert engine.release_reference_weights() == cfg.depth * per_block
    after = engine.generate(obs, noise, STEPS, 2)
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    with pytest.raises(RuntimeError, match="reference weights were released"):
        model.generate(obs, noise, STEPS, 2)
    assert WamEngine(build_wam("wam-tiny"), "host_schedule").release_reference_weights() == 0  # nothing stacked


def test_video_kv_cache_runs_the_actions_alone_after_the_video_is_finished(tiny, inputs, monkeypatch):
    obs, noise = inputs
    engine = WamEngine(tiny, "exact")
    calls = {"full": 0, "actions": 0}
    full, actions = engine._full_forward, engine._action_forward

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(engine, "_full_forward", count("full", full))
    monkeypatch.setattr(engine, "_action_forward", count("actions", actions))
    engine.generate(obs, noise, 6, 2)
    assert calls == {"full": 3, "actions": 3}  # 2 video steps, the one that fills the cache, then actions alone
    calls.update(full=0, actions=0)
    engine.generate(obs, noise, 6, 6)  # no early stop: nothing to cache
    assert calls == {"full": 6, "actions": 0}


def test_cached_keep_index_makes_no_nonzero_per_forward(tiny, inputs, monkeypatch):
    """The reference's `.nonzero()` in every forward is a host sync on a GPU; the lever builds it once."""
    obs, noise = inputs
    count = {"n": 0}
    real = torch.Tensor.nonzero

    def counting(self, *a, **k):
        count["n"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "nonzero", counting)
    tiny.generate(obs, noise, STEPS, sparsity="drop_middle")
    assert count["n"] == STEPS
    engine = WamEngine(tiny, "cached_keep_index")
    engine.generate(obs, noise, STEPS, sparsity="drop_middle")  # builds the layout once
    count["n"] = 0
    engine.generate(obs, noise, STEPS, sparsity="drop_middle")
    assert count["n"] == 0
    count["n"] = 0
    WamEngine(tiny, "host_schedule").generate(obs, noise, STEPS, sparsity="drop_middle")
    assert count["n"] >= STEPS  # without the lever, one a forward as the reference


@pytest.mark.parametrize("levers", ["exact,compile", "exact,group_modulation,compile"])
@pytest.mark.parametrize("sparsity", ["none", "drop_middle"])
def test_compile_traces_each_block_once_without_graph_breaks_or_recompiles(inputs, sparsity, levers):
    """Regional compile: one compiled block serves every block (the number of graphs does not
    grow with the depth), fullgraph=True makes a graph break an error, and a second call of the
    same shapes must not recompile. The eager backend traces exactly as inductor would."""
    from torch._dynamo.utils import counters

    obs, noise = inputs
    graphs = []
    for depth in (2, 4):
        torch._dynamo.reset()
        counters.clear()
        model = build_wam(get_config("wam-tiny", depth=depth))
        engine = WamEngine(model, levers, compile_backend="eager")
        a, v = engine.generate(obs, noise, STEPS, 2, sparsity)
        ref_a, ref_v = model.generate(obs, noise, STEPS, 2, sparsity)
        assert compare(a, ref_a, torch.float32)["passed"] and compare(v, ref_v, torch.float32)["passed"]
        with torch._dynamo.config.patch(error_on_recompile=True):
            engine.generate(obs, noise, STEPS, 2, sparsity)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] <= 3, graphs  # full sequence, actions alone, the context k/v step: not per block


def test_lever_parsing_and_errors():
    assert WamLevers.parse("best", CPU).names() == list(WAM_EXACT)  # CPU: no graph, no compile
    assert WamLevers.parse("exact,compile=max-autotune", CPU).compile == "max-autotune"
    assert WamLevers.parse("reference", CPU).names() == [] and WamLevers.parse("", CPU).names() == []
    # a name lost in the list ('$A,exact' with A unset) is refused as for the pi0 family, not dropped
    for spec in ("exact,", ",exact", "host_schedule,,sdpa", ",", " , "):
        with pytest.raises(LeverError, match="empty lever name in .*two commas in a row, or one at an end"):
            WamLevers.parse(spec, CPU)
    with pytest.raises(LeverError, match="unknown world-action-model lever 'for_loop'"):
        WamLevers.parse("for_loop", CPU)
    with pytest.raises(LeverError, match="compile mode must be one of"):
        WamLevers.parse("compile=fast", CPU)
    with pytest.raises(LeverError, match="lever 'cuda_graph' needs host_schedule, cached_keep_index beside it"):
        WamLevers.parse("cuda_graph", torch.device("cuda"))  # parsing only: no GPU needed
    for spec in ("cuda_graph", "host_schedule,cached_keep_index,cuda_graph"):  # on a CPU, the device is the answer
        with pytest.raises(LeverError, match="cuda_graph needs a CUDA device"):
            WamLevers.parse(spec, CPU)
    with pytest.raises(LeverError, match="'compile=': no compile mode after '='"):
        WamLevers.parse("exact,compile=", CPU)
    with pytest.raises(LeverError, match="preset 'graph' needs a CUDA device"):
        WamLevers.parse("graph", CPU)
    with pytest.raises(LeverError, match="reduce-overhead uses CUDA graphs"):
        WamLevers.parse("exact,compile=reduce-overhead", CPU)
    with pytest.raises(LeverError, match="takes no argument"):
        WamLevers.parse("sdpa=1", CPU)
    with pytest.raises(LeverError, match="flash_actions needs a CUDA device"):
        WamLevers.parse("exact,flash_actions", CPU)
    with pytest.raises(LeverError, match="lever 'flash_actions' needs sdpa beside it"):
        WamLevers.parse("flash_actions", CPU)
    with pytest.raises(LeverError, match="lever 'group_modulation' needs cached_keep_index beside it"):
        WamLevers.parse("group_modulation", CPU)
    with pytest.raises(LeverError, match="lever 'compile' needs cached_keep_index beside it"):
        WamLevers.parse("compile", CPU)
    with pytest.raises(LeverError, match=r"'exact;sdpa' holds several variants \(';'\)"):
        WamLevers.parse("exact;sdpa", CPU)
    cuda = torch.device("cuda")  # parsing only: no GPU needed
    with pytest.raises(LeverError, match="compile=reduce-overhead brings its own CUDA graphs"):
        WamLevers.parse("graph,compile=reduce-overhead", cuda)
    assert WamLevers.parse("graph,compile=default", cuda).names()[-2:] == ["cuda_graph", "compile=default"]
    # labels keep the lever table's order (compile before the levers that come after it in best)
    assert WamLevers.parse("exact,group_modulation,compile", CPU).names()[-2:] == ["compile=default", "group_modulation"]
    assert set(WAM_LEVERS) >= set(WAM_EXACT) | {"cuda_graph", "compile"}
    assert WamLevers.parse(" none ", CPU).names() == []  # the reference, as the pi0 family's parser takes it


def test_an_engine_checks_a_lever_set_built_directly(tiny):
    """WamEngine(model, WamLevers(...)) validates the set as parsing does: on a CPU, cuda_graph was torch's "dummy base
    class" error and an unknown compile mode inductor's."""
    with pytest.raises(LeverError, match="cuda_graph needs a CUDA device"):
        WamEngine(tiny, WamLevers(host_schedule=True, cached_keep_index=True, cuda_graph=True))
    with pytest.raises(LeverError, match="compile mode must be one of .*, got 'bogus'"):
        WamEngine(tiny, WamLevers(cached_keep_index=True, compile="bogus"))


def test_world_action_variants_refuse_a_typo_before_anything_runs(tmp_path, capsys):
    """matrix and check on a world-action workload: a misspelt lever is exit 2 naming the option before any row
    runs (the matrix timed the reference and exited 0, the typo in a skipped row); a variant only a GPU runs is
    refused where none asked for can run here; --levers none checks the reference."""
    from vlaperf.cli import main

    matrix = ["matrix", "--workload", "wam-tiny", "--sparsity", "none", "--iters", "1", "--warmup", "1"]
    assert main([*matrix, "--variants", "bogus", "--json", str(tmp_path / "m.json")]) == 2
    assert "--variants: variant 'bogus': unknown world-action-model lever 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
    assert main([*matrix, "--variants", "graph"]) == 2
    assert "--variants: no variant asked for can run on cpu: 'graph': preset 'graph' needs a CUDA device" in \
        capsys.readouterr().err
    check = ["check", "--workload", "wam-tiny", "--sparsity", "none", "--seeds", "1"]
    assert main([*check, "--levers", "exact;flash_actions"]) == 2
    assert "--levers: variant 'flash_actions': lever 'flash_actions' needs sdpa beside it" in capsys.readouterr().err
    assert main([*check, "--levers", "exact,flash_actions"]) == 2
    assert "--levers: variant 'exact,flash_actions' cannot run here: flash_actions needs a CUDA device" in \
        capsys.readouterr().err
    assert main([*check, "--levers", "none", "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["checks"][0]["variant"] == "reference"


def test_check_reports_actions_and_video_and_fails_a_wrong_variant(tiny, monkeypatch):
    w = get_wam_workload("wam-tiny")
    r = check_wam_equivalence(tiny, WamEngine(tiny, "exact"), w, seeds=(0,))
    assert r["passed"] and r["rel_l2"] < 1e-5 and r["video_rel_l2"] < 1e-5 and r["sparsity"] == "none"
    engine = WamEngine(tiny, "exact")
    real = engine._video_x0
    monkeypatch.setattr(engine, "_video_x0", lambda *a: real(*a) * 1.01)  # a 1% error in the video's x0
    bad = check_wam_equivalence(tiny, engine, w, seeds=(0,))
    assert not bad["passed"] and bad["video_rel_l2"] > 1e-4


def test_workloads_and_overrides():
    w = get_wam_workload("wam-761")
    assert (w.batch, w.steps, w.video_steps, w.sparsity, w.cfg_scale) == (1, 10, 5, "none", 0.0)
    w20 = w.with_overrides(steps=20)
    assert w20.video_steps == 10 and w20.overrides_vs(w) == {"steps": 20, "video_steps": 10}
    with pytest.raises(ValueError, match="video_steps must be an integer in 1..steps"):
        w.with_overrides(video_steps=11)
    # the sampling checks run on the overrides, not only when generate is called; their bounds are inclusive
    assert w.with_overrides(cfg_scale=100.0).cfg_scale == 100.0
    with pytest.raises(ValueError, match=r"cfg_scale must be in \[0, 100\]"):
        w.with_overrides(cfg_scale=100.5)
    with pytest.raises(ValueError, match="sparsity must be one of none, drop_middle, mae_middle, got 'drop_all'"):
        w.with_overrides(sparsity="drop_all")
    with pytest.raises(ValueError, match="shift must be a finite number > 0, got 0.0"):
        w.with_overrides(shift=0.0)
    with pytest.raises(ValueError, match="world-action model workload"):
        get_workload("wam-761")
    with pytest.raises(ValueError, match="unknown world-action-model workload"):
        get_wam_workload("wam-999")


def test_roofline_counts_the_forward_flops_torch_counts(tiny, inputs):
    """The floor's FLOPs of one full forward against torch's FLOP counter on the same forward."""
    from torch.utils.flop_counter import FlopCounterMode

    from vlaperf.roofline import _wam_forward, wam_roofline

    obs, noise = inputs
    engine = WamEngine(tiny, "cached_keep_index")  # eager attention: matmuls the counter sees on any device
    cfg = tiny.config
    for sparsity in SPARSITY:
        with FlopCounterMode(display=False) as counter:
            engine.forward_once(obs, noise, sparsity)
        frames = cfg.frame_tokens - (2 * cfg.patches if sparsity == "drop_middle" else 0)
        flops, _ = _wam_forward(cfg, 2, frames + 1 + cfg.action_horizon, frames + 1, context_kv=True)
        counted = counter.get_total_flops()
        # counted also has the embeddings, the time MLP and the heads, which the floor leaves out
        assert 0.8 < flops / counted <= 1.0, (sparsity, flops, counted)
    full = wam_roofline(get_config("wam"), get_wam_workload("wam-761"))
    drop = wam_roofline(get_config("wam"), get_wam_workload("wam-761").with_overrides(sparsity="drop_middle"))
    assert full["tokens"] == 761 and drop["tokens"] == 521
    assert full["full_forwards"] == 6 and full["action_forwards"] == 4
    assert 1.5 < full["full_forward_tflop"] < 2.5 and drop["floor_ms"] < full["floor_ms"]


@pytest.mark.parametrize("sparsity", SPARSITY)
def test_forward_mode_floor_counts_the_context_keys_and_values_that_forward_once_computes(tiny, inputs, sparsity):
    """`--mode forward` times `forward_once`, which computes the text context's cross-attention keys and values beside
    the forward over the tokens (as the reference forward does). Its floor counted the forward alone, leaving out
    6.5% (none) to 9.4% (drop_middle) of the wam-761 floor, so a timed forward read closer to the floor than it was;
    its `flops` were a whole generate call's."""
    from torch.utils.flop_counter import FlopCounterMode

    from vlaperf.roofline import wam_forward_roofline, wam_roofline

    obs, noise = inputs
    w = get_wam_workload("wam-tiny").with_overrides(batch=2, sparsity=sparsity)
    floor = wam_forward_roofline(tiny.config, w, matmul_flops=1e9, bandwidth=1e12)  # compute-bound: FLOPs set it
    with FlopCounterMode(display=False) as counter:
        WamEngine(tiny, "cached_keep_index").forward_once(obs, noise, sparsity)
    # what torch counts beyond the floor's: the embeddings, the time MLP and the heads, which the floor leaves out
    assert 0.9 < floor["flops"] / counter.get_total_flops() <= 1.0
    assert floor["floor_ms"] == pytest.approx(floor["context_kv_ms"] + floor["full_forward_ms"])
    assert floor["floor_ms"] == pytest.approx(1e3 * floor["flops"] / 1e9)
    # one forward whatever the workload's sampler: a one-step, unguided generate is exactly one
    guided = w.with_overrides(cfg_scale=2.0)
    assert wam_forward_roofline(tiny.config, guided)["floor_ms"] == wam_roofline(
        tiny.config, w.with_overrides(steps=1))["floor_ms"] == wam_forward_roofline(tiny.config, w)["floor_ms"]


# --------------------------------------------------------------------------- CLI


def test_cli_bench_check_matrix_on_wam_tiny(tmp_path):
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out = tmp_path / "b.json"
    assert main(["bench", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact", "--warmup", "2", "--iters", "3",
                 "--no-progress", "--sparsity", "drop_middle", "--release-reference", "--json", str(out)]) == 0
    r = read_result(out)
    assert r["workload"]["overrides"] == {"sparsity": "drop_middle"} and r["equivalence"]["passed"]
    assert r["released_reference_bytes"] > 0  # exact stacks q/k/v and the context's k/v: timed as served
    assert r["timers"]["wall_ms"]["count"] == 3 and r["roofline"]["tokens"] == 37 and r["mode"] == "model"
    assert main(["bench", "--workload", "wam-tiny", "--device", "cpu", "--mode", "forward", "--warmup", "1", "--iters", "2",
                 "--no-progress", "--batch", "4", "--ceilings", "measure", "--json", str(out)]) == 0
    r = read_result(out)
    assert r["workload"]["overrides"] == {"batch": 4}
    assert r["roofline"]["ceilings"]["source"] == "measured on this device"  # the floor of this CPU's own rates
    assert r["roofline"]["matmul_flops"] == r["roofline"]["ceilings"]["matmul_flops"]
    assert r["roofline"]["what"] == "one full forward, with the text context's keys/values"
    assert r["roofline"]["floor_ms"] == r["roofline"]["context_kv_ms"] + r["roofline"]["full_forward_ms"]
    assert main(["check", "--workload", "wam-tiny", "--device", "cpu", "--seeds", "1", "--json", str(tmp_path / "c.json")]) == 0
    checks = json.loads((tmp_path / "c.json").read_text())["checks"]
    assert {c["sparsity"] for c in checks} == set(SPARSITY) and all(c["passed"] for c in checks)
    m = tmp_path / "m.json"
    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--warmup", "1", "--iters", "3", "--no-progress",
                 "--variants", "reference;exact", "--json", str(m)]) == 0
    rows = read_result(m)["variants"]
    assert [(r["variant"], r["sparsity"]) for r in rows] == [(v, s) for s in SPARSITY for v in ("reference", "exact")]
    exact_drop = next(r for r in rows if r["variant"] == "exact" and r["sparsity"] == "drop_middle")
    assert exact_drop["vs_reference"]["speedup"] > 0 and exact_drop["sparsity_gain"] is not None
    assert all(r["sparsity_gain"] is None for r in rows if r["sparsity"] == "none")  # the dense row is the baseline


def test_an_interrupted_wam_matrix_writes_what_it_has(tmp_path, monkeypatch):
    """The world-action matrix, stopped by SIGTERM while it prepares a variant, keeps the rows prepared (first call,
    equivalence), lists the rest as not prepared, and exits 143, as the pi0 family's matrix does."""
    import os
    import signal

    from vlaperf.cli import main
    from vlaperf.profile import wam
    from vlaperf.report.schema import read_result

    made, make = [], wam.make_engine

    def make_then_terminate(model, spec):
        made.append(spec)
        if len(made) == 2:  # the second engine: at sparsity none, after exact's row
            os.kill(os.getpid(), signal.SIGTERM)
        return make(model, spec)

    monkeypatch.setattr(wam, "make_engine", make_then_terminate)
    m = tmp_path / "m.json"
    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--warmup", "1", "--iters", "2", "--no-progress",
                 "--variants", "reference;exact;graph", "--sparsity", "none", "--idle-ms", "2", "--json", str(m)]) \
        == 143
    r = read_result(m)
    assert (r["idle_ms"], r["idle_spin"]) == (2.0, False)  # as a finished file records it
    rows = {row["variant"]: row for row in r["variants"]}
    assert r["interrupted"] is True and list(rows) == ["reference", "exact", "graph"]
    assert rows["exact"]["equivalence"]["passed"] and rows["exact"]["first_call_s"] > 0
    assert rows["exact"]["skipped"] == "not timed: the matrix was interrupted"
    assert rows["graph"]["skipped"] == "not prepared: the matrix was interrupted"


@pytest.mark.parametrize("argv,message", [
    (["bench", "--workload", "tiny", "--sparsity", "drop_middle"], "--sparsity: only for the world-action workloads"),
    (["bench", "--workload", "tiny", "--mode", "forward"], "--mode forward: only for the world-action workloads"),
    (["bench", "--workload", "wam-tiny", "--mode", "policy"], "--mode policy: the world-action model has no"),
    (["matrix", "--workload", "wam-tiny", "--mode", "policy"], "--mode policy: the world-action model has no"),
    (["bench", "--workload", "wam-tiny", "--video-steps", "9"], "error: --video-steps must be an integer in 1..steps (4)"),
    (["matrix", "--workload", "wam-tiny", "--cfg-scale", "1000"], "error: --cfg-scale must be in [0, 100]"),
    (["bench", "--workload", "wam-tiny", "--levers", "for_loop"], "unknown world-action-model lever 'for_loop'"),
    (["bench", "--workload", "wam-tiny", "--levers", "graph"], "preset 'graph' needs a CUDA device"),
    (["check", "--workload", "wam-9"], "unknown workload 'wam-9'"),
    (["check", "--workload", "wam-tiny", "--levers", ";;"], "--levers ';;': no variant to check"),
    (["bench", "--workload", "wam-tiny", "--mode", "forward", "--cfg-scale", "5"],
     "--cfg-scale: --mode forward times one forward, without the sampler"),
    (["matrix", "--workload", "wam-tiny", "--mode", "forward", "--steps", "8", "--video-steps", "2"],
     "--steps, --video-steps: --mode forward times one forward, without the sampler"),
])
def test_cli_errors_name_the_field(argv, message, capsys):
    from vlaperf.cli import main

    assert main(argv + ["--device", "cpu", "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_check_specs_take_each_lever_with_what_it_needs_then_the_presets():
    """`vlaperf check --levers all`: every lever that runs on the device, alone with the levers it needs (each spec
    parses), then the presets; compile only when asked for (it needs a compiler and time)."""
    from vlaperf.engine.wam import WAM_CUDA_ONLY
    from vlaperf.profile.wam import check_specs

    for device in (CPU, torch.device("cuda")):  # parsing only: no GPU needed
        specs = check_specs(device)
        presets = ["exact", "graph"] if device.type == "cuda" else ["exact"]
        assert specs[-len(presets):] == presets
        singles = specs[: -len(presets)]
        parsed = [WamLevers.parse(spec, device).names() for spec in singles]
        runs_here = [n for n in WAM_LEVERS if n != "compile" and (device.type == "cuda" or n not in WAM_CUDA_ONLY)]
        assert [names[-1] for names in parsed] == runs_here  # each lever once, last in its spec, in the table's order


def test_matrix_grid_and_cumulative_variants():
    """grid: seed 000's eager / compile default (/ compile reduce-overhead) beside the exact levers, and the CUDA rows
    on a GPU; cumulative: from the reference one lever at a time up to what best resolves to on the device."""
    import itertools

    from vlaperf.profile.wam import cumulative_variants, grid_variants

    for device in (CPU, torch.device("cuda")):  # parsing only: no GPU needed
        grid = grid_variants(device)
        assert grid[0] == "reference" and {"exact", "exact,compile=default"} <= set(grid)
        assert ({"exact,compile=reduce-overhead", "graph", "best"} <= set(grid)) == (device.type == "cuda")
        cumulative = cumulative_variants(device)
        assert cumulative[0] == "reference"
        names = [WamLevers.parse(v, device).names() for v in cumulative[1:]]
        assert len(names[0]) == 1 and names[-1] == WamLevers.parse("best", device).names()
        assert all(len(b) == len(a) + 1 and set(a) < set(b) for a, b in itertools.pairwise(names))


def test_check_and_bench_exit_1_on_a_failed_equivalence(monkeypatch, capsys):
    """A variant that fails the check: `check` exits 1, and `bench` refuses to report its speed."""
    from vlaperf import check
    from vlaperf.cli import main

    def failing(model, engine, workload, seeds=(0, 1)):
        return {"passed": False, "rel_l2": 0.5, "video_rel_l2": 0.25, "tolerance": 1e-5, "dtype": "float32",
                "variant": engine.name, "sparsity": workload.sparsity}

    monkeypatch.setattr(check, "check_wam_equivalence", failing)
    common = ["--workload", "wam-tiny", "--device", "cpu", "--levers", "exact"]
    assert main(["check", *common, "--sparsity", "none", "--seeds", "1"]) == 1
    assert main(["bench", *common, "--warmup", "1", "--iters", "1", "--no-progress"]) == 1
    assert "fails equivalence (actions rel_l2 0.5, video 0.25 > 1e-05); refusing to report its speed" in capsys.readouterr().err


def test_check_with_a_sparsity_checks_that_sparsity_only(tmp_path):
    from vlaperf.cli import main

    out = tmp_path / "c.json"
    assert main(["check", "--workload", "wam-tiny", "--device", "cpu", "--levers", "host_schedule", "--seeds", "1",
                 "--sparsity", "drop_middle", "--json", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert [(c["variant"], c["sparsity"]) for c in checks] == [("host_schedule", "drop_middle")]
    assert json.loads(out.read_text())["workload"]["settings"] == {"steps": 4, "video_steps": 2, "sparsity": "drop_middle",
                                                                  "cfg_scale": 0.0, "shift": 3.0, "batch": 1}


def test_forward_mode_times_the_engines_forward(tiny, inputs, monkeypatch):
    """`bench --mode forward --levers X` times X's forward_once (the reference's only without an engine)."""
    from vlaperf.profile.wam import call_fn

    obs, noise = inputs
    w = get_wam_workload("wam-tiny")
    engine = WamEngine(tiny, "exact")
    calls = []
    real = engine.forward_once
    monkeypatch.setattr(engine, "forward_once", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = call_fn(tiny, engine, w, obs, noise, "forward")()
    assert len(calls) == 1 and out.shape == (2, 4, 8)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sparsity", SPARSITY)
def test_cuda_graph_is_equivalent_and_makes_no_host_sync(sparsity):
    model = build_wam("wam-tiny", device="cuda")
    obs, noise = random_wam_inputs(model.config, 2, "cuda", model.dtype, seed=1)
    engine = WamEngine(model, "graph")
    ref_a, ref_v = model.generate(obs, noise, STEPS, 2, sparsity)
    a, v = engine.generate(obs, noise, STEPS, 2, sparsity)
    assert compare(a, ref_a, model.dtype)["passed"] and compare(v, ref_v, model.dtype)["passed"]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        engine.generate(obs, noise, STEPS, 2, sparsity)  # a replay: any host sync raises
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine._graphs.captures == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_graph_engine_captures_each_shift_apart():
    """A graph is captured per (batch, steps, video_steps, sparsity, cfg_scale, shift): a call with another shift
    replays its own graph, whose captured time tables are that shift's, and matches the reference; one with the
    first shift again replays the first graph without a capture."""
    model = build_wam("wam-tiny", device="cuda")
    obs, noise = random_wam_inputs(model.config, 2, "cuda", model.dtype, seed=1)
    engine = WamEngine(model, "graph")
    for shift, captures in ((3.0, 1), (1.0, 2), (3.0, 2)):
        ref_a, ref_v = model.generate(obs, noise, STEPS, 2, shift=shift)
        a, v = engine.generate(obs, noise, STEPS, 2, shift=shift)
        assert compare(a, ref_a, model.dtype)["passed"], (shift, rel(a, ref_a))
        assert compare(v, ref_v, model.dtype)["passed"], (shift, rel(v, ref_v))
        assert engine._graphs.captures == captures, shift


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_breakdown_times_the_stages_inside_the_graph():
    """The world-action breakdown of `graph` is taken on the graph itself: event nodes of a second
    capture at each mark, read after each replay; the same stage names as the eager engine's."""
    from vlaperf.profile.wam import wam_breakdown

    model = build_wam("wam-tiny", device="cuda")
    workload = get_wam_workload("wam-tiny")
    bd, notes, label = wam_breakdown(model, workload, "graph", warmup=2, iters=8)
    stages = {s["name"]: s for s in bd["stages"]}
    assert {"setup", "context_kv", "output"} <= set(stages)
    steps = stages.get("full_denoise_step", {}).get("per_call", 0) + stages.get("action_denoise_step", {}).get(
        "per_call", 0)
    assert steps == workload.steps
    assert all(s["median_ms"] > 0 for name, s in stages.items() if name.endswith("denoise_step"))
    assert "cuda_graph" in label.split(",") and any("inside the CUDA graph" in n for n in notes)
    assert abs(bd["coverage"] - 1.0) <= 0.25, bd["statement"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fused_projections_and_gelu_epilogue_match_the_block():
    """On CUDA fuse_projections also takes fc1's GELU(tanh) into the GEMM's epilogue: the block
    stays within bf16 rounding of the model's block, and the whole call within the bf16 check."""
    from vlaperf.engine.wam import block_step

    model = build_wam("wam-tiny", device="cuda")
    cfg = model.config
    engine = WamEngine(model, "exact")
    assert engine._gelu_epilogue
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(2, 9, cfg.width, device="cuda", generator=g).to(model.dtype)
    e = torch.randn(2, 9, 6, cfg.width, device="cuda", generator=g)
    ctx = model.blocks[0].cross_attn.context_kv(torch.randn(2, cfg.text_tokens, cfg.width, device="cuda",
                                                            generator=g).to(model.dtype))
    ref = block_step(model.blocks[0], x, e, ctx, None, 0, True)
    got = block_step(model.blocks[0], x, e, ctx, None, 0, True, None, engine._fused_qkv[0], True)
    assert compare(got[0], ref[0], model.dtype)["passed"], rel(got[0], ref[0])
    obs, noise = random_wam_inputs(cfg, 2, "cuda", model.dtype, seed=1)
    ref_a, ref_v = model.generate(obs, noise, STEPS, 2)
    a, v = engine.generate(obs, noise, STEPS, 2)
    assert compare(a, ref_a, model.dtype)["passed"] and compare(v, ref_v, model.dtype)["passed"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("video_steps", [2, STEPS])
def test_cuda_flash_actions_and_group_modulation_are_equivalent(video_steps):
    """flash_actions sends the action queries' calls to the flash kernel (the full forward's
    actions-over-all call, and the action-only forwards' self and cross calls): within the bf16
    check of the reference, as is group_modulation under compile."""
    model = build_wam("wam-tiny", device="cuda")
    obs, noise = random_wam_inputs(model.config, 2, "cuda", model.dtype, seed=1)
    ref_a, ref_v = model.generate(obs, noise, STEPS, video_steps, "drop_middle")
    for levers in ("exact,flash_actions", "exact,group_modulation,compile"):
        a, v = WamEngine(model, levers).generate(obs, noise, STEPS, video_steps, "drop_middle")
        assert compare(a, ref_a, model.dtype)["passed"] and compare(v, ref_v, model.dtype)["passed"], levers


def test_syncs_finds_the_reference_runners_nonzero_and_none_in_the_engine(tmp_path, capsys):
    """Seed 000's suspect: the keep index's `.nonzero()`, one host sync per forward."""
    from vlaperf.cli import main

    out = tmp_path / "s.json"
    assert main(["syncs", "--workload", "wam-tiny", "--device", "cpu", "--sparsity", "drop_middle", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())["syncs"]
    assert rep["per_call"] == STEPS
    assert [s["op"] for s in rep["sites"]] == ["Tensor.nonzero"] and rep["sites"][0]["file"].endswith("models/wam.py")
    assert main(["syncs", "--workload", "wam-tiny", "--device", "cpu", "--sparsity", "drop_middle", "--levers", "exact",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["syncs"]["per_call"] == 0
    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--ray"]) == 2
    assert "--ray: the world-action workloads run in one process" in capsys.readouterr().err


def test_doctor_names_seed_000s_overheads_and_their_levers(tmp_path, monkeypatch):
    from vlaperf.cli import main

    out = tmp_path / "d.json"
    assert main(["doctor", "--workload", "wam-tiny", "--device", "cpu", "--sparsity", "drop_middle", "--no-measure",
                 "--json", str(out)]) == 0
    found = {f["id"]: f for f in json.loads(out.read_text())["findings"]}
    assert "cached_keep_index" in found["wam.host_syncs"]["fix"] and "nonzero" in found["wam.host_syncs"]["detail"]
    assert found["wam.context_kv_per_step"]["fix"] == "lever context_kv_cache"
    assert found["wam.unfused_projections"]["fix"] == "lever fuse_projections"
    assert "in 1 forward" in found["wam.finished_video_recomputed"]["title"]  # 4 steps, the video in 2
    assert "wam.sparsity_host_bound" in found
    assert main(["doctor", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact", "--no-measure",
                 "--json", str(out)]) == 0
    found = {f["id"]: f for f in json.loads(out.read_text())["findings"]}
    assert found["wam.host_syncs"]["severity"] == "info"
    assert not {"wam.context_kv_per_step", "wam.finished_video_recomputed", "wam.eager_attention",
                "wam.unfused_projections"} & set(found)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")  # seed 000's trap: an error, exit code 1
    assert main(["doctor", "--workload", "wam-tiny", "--device", "cpu", "--no-measure", "--json", str(out)]) == 1
    assert "env.compile_disabled" in {f["id"] for f in json.loads(out.read_text())["findings"]}


def test_scaling_fits_t_of_n_for_the_world_action_model(tmp_path):
    from vlaperf.cli import main

    out = tmp_path / "t.json"
    # steps 1 to 8: a spread wide enough that a loaded 2-core CI machine still sees the slope
    assert main(["scaling", "--workload", "wam-tiny", "--device", "cpu", "--levers", "reference;exact", "--steps",
                 "1,2,8", "--warmup", "1", "--iters", "3", "--no-progress", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["workload"]["settings"]["video_steps"] == 2
    series = {s["label"]: s for s in r["scaling"]["series"]}
    assert set(series) == {"reference", ",".join(WAM_EXACT)}
    for s in series.values():
        assert [p["steps"] for p in s["points"]] == [1, 2, 8] and s["fit"]["slope"] > 0
        # each point says the video's calls it ran (wam-tiny: 2 of 4, the share kept): the settings hold the 4's
        assert [p["video_steps"] for p in s["points"]] == [1, 1, 4]


def test_scaling_says_what_video_steps_means_there(capsys):
    """In scaling, --steps is the list of N: --video-steps is the video's steps at the workload's own steps, whose
    share each N keeps; above those it was "1..steps (4)", a 4 the user never gave."""
    from vlaperf.cli import main

    assert main(["scaling", "--workload", "wam-tiny", "--device", "cpu", "--steps", "10,20",
                 "--video-steps", "10"]) == 2
    assert ("--video-steps 10: in scaling, the video's steps at the workload's own 4 steps, 1..4; each --steps N keeps "
            "that share (a half rounded up)") in capsys.readouterr().err


def test_breakdown_names_the_steps_that_run_every_token_and_those_that_run_the_actions_alone(tmp_path):
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out = tmp_path / "b.json"
    for levers, full, alone in (("reference", 4, 0), ("exact", 3, 1)):  # 4 steps, the video finished in 2
        assert main(["breakdown", "--workload", "wam-tiny", "--device", "cpu", "--levers", levers, "--warmup", "1",
                     "--iters", "2", "--no-progress", "--json", str(out)]) == 0
        bd = read_result(out)["breakdown"]
        stages = {s["name"]: s for s in bd["stages"]}
        assert stages["full_denoise_step"]["per_call"] == full
        assert stages.get("action_denoise_step", {}).get("per_call", 0) == alone
        assert {"setup", "context_kv", "output"} <= set(stages) and 0 < bd["coverage"]


def test_breakdown_trace_records_the_world_action_call_under_its_stage_names(tmp_path, capsys):
    """`breakdown --trace` on a world-action workload ended in an UnboundLocalError after the table (the trace was
    pi0's only) and wrote neither file; it now records the same generate, its stages named in the trace."""
    import json

    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out, trace_path = tmp_path / "b.json", tmp_path / "trace.json"
    assert main(["breakdown", "--workload", "wam-tiny", "--device", "cpu", "--levers", "exact", "--warmup", "1",
                 "--iters", "2", "--no-progress", "--trace", str(trace_path), "--json", str(out)]) == 0
    assert "stages: setup, context_kv, full_denoise_step_0" in capsys.readouterr().out
    assert read_result(out)["breakdown"]["trace"] == str(trace_path)
    names = {e.get("name") for e in json.loads(trace_path.read_text())["traceEvents"]}
    assert {"setup", "context_kv", "action_denoise_step_3", "output"} <= names


def test_an_engine_on_a_released_model_and_an_empty_batch_are_named_errors(tiny):
    from vlaperf.engine.wam import WamEngine
    from vlaperf.inputs import InputError
    from vlaperf.models.wam import build_wam
    from vlaperf.policy import WamPolicy
    from vlaperf.workloads import get_wam_workload

    model = build_wam("wam-tiny", "cpu", seed=0)
    WamEngine(model, "exact").release_reference_weights()
    with pytest.raises(RuntimeError, match="reference weights were released"):
        WamEngine(model, "exact")
    fresh = build_wam("wam-tiny", "cpu", seed=0)
    policy = WamPolicy(fresh, fresh.generate, get_wam_workload("wam-tiny"))
    for batch in ([], None):
        with pytest.raises(InputError, match="observation must be a dict"):
            policy.infer(batch)


def test_configs_whose_middle_frames_are_observed_are_refused():
    """Frame sparsity drops or masks the two middle frames: they must be frames the model predicts."""
    for context in (0, 6):  # an observed frame to start from, and a frame to predict
        with pytest.raises(ValueError, match=f"context_frames must be in 1..frames-1, got {context} of 6"):
            get_config("wam-tiny", context_frames=context)
    with pytest.raises(ValueError, match=r"middle frames \(1, 2\) .* frames must be >= 6"):
        get_config("wam-tiny", frames=4, context_frames=2)
    get_config("wam-tiny", frames=6, context_frames=2)


@pytest.mark.parametrize("override,message", [
    ({"num_heads": 0}, "num_heads must be an integer >= 1, got 0"),  # was a bare ZeroDivisionError
    ({"mlp_dim": 0}, "mlp_dim must be an integer >= 1, got 0"),  # was an IndexError in init_random_
    ({"state_dim": 0}, "state_dim must be an integer >= 1, got 0"),  # was a ZeroDivisionError in init_random_
    ({"patches": 0}, "patches must be an integer >= 1, got 0"),  # was accepted: frames of no tokens
    ({"text_tokens": 0}, "text_tokens must be an integer >= 1, got 0"),  # was accepted: no instruction to attend to
    ({"depth": -1}, "depth must be an integer >= 1, got -1"),
    ({"frames": 6.0}, "frames must be an integer >= 1, got 6.0"),  # was a TypeError in torch.randn
    ({"context_frames": 1.5}, "context_frames must be an integer >= 1, got 1.5"),
    ({"width": True}, "width must be an integer >= 1, got True"),
    ({"freq_dim": 31}, r"freq_dim must be even \(a cos and a sin half\), got 31"),  # was a matmul shape error
    ({"frames": 1}, r"frames must be >= 4 \(two middle frames"),  # was context_frames' range, "1..frames-1"
])
def test_config_sizes_are_checked_by_name(override, message):
    with pytest.raises(ValueError, match=message):
        get_config("wam-tiny", **override)


def test_build_wam_takes_device_and_dtype_names_as_build_model_does():
    assert build_wam("wam-tiny", "cpu", "bfloat16").dtype == torch.bfloat16  # was "Invalid device string"
    with pytest.raises(ValueError, match="device: expected 'cpu', 'cuda' or 'cuda:N'"):
        build_wam("wam-tiny", "bfloat16")
    with pytest.raises(ValueError, match="dtype: expected a floating torch dtype or its name"):
        build_wam("wam-tiny", dtype=torch.int8)


def test_time_embedding_is_cos_then_sin_over_frequencies_10000_to_the_minus_i_over_half():
    """Wan's sinusoidal time embedding, written out: the reference and the engine share it, so only a fixed
    value can show a swapped half or a wrong frequency (it matters once real weights are loaded)."""
    import math

    from vlaperf.models.wam import sinusoidal_embedding

    emb = sinusoidal_embedding(torch.tensor([0.0, 500.0]), 4)  # frequencies 1 and 10000 ** -0.5
    want = [1.0, 1.0, 0.0, 0.0, math.cos(500.0), math.cos(5.0), math.sin(500.0), math.sin(5.0)]
    assert emb.flatten().tolist() == pytest.approx(want, abs=1e-6)


def test_wam_time_tables_use_1000_sigma():
    """Wan conditions on t = 1000 * sigma (time_tables is shared by the engine and the reference, so the equivalence
    tests cannot see a wrong scale)."""
    import math
    import torch
    from vlaperf.models.wam import build_wam
    m = build_wam("wam-tiny", device="cpu", dtype=torch.float32)
    sig = torch.tensor([[0.0, 0.5, 0.25]])
    t_emb, _ = m.time_tables(sig)
    half = m.config.freq_dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float64) / half)
    ang = torch.tensor([0.0, 500.0, 250.0], dtype=torch.float64)[:, None] * freqs
    want = m.time_embedding(torch.cat([ang.cos(), ang.sin()], -1).float())[None]
    torch.testing.assert_close(t_emb, want.float())


def test_token_groups_with_two_context_frames():
    """Every observed (context) frame is CLEAN, also with more than one context frame."""
    from vlaperf.models.wam import ACTION, CLEAN, VIDEO, get_config, token_groups
    cfg = get_config("wam-tiny", frames=8, context_frames=2)
    g = token_groups(cfg).tolist()
    P = cfg.patches
    assert g[: 2 * P] == [CLEAN] * (2 * P)
    assert g[2 * P : cfg.frame_tokens] == [VIDEO] * (cfg.frame_tokens - 2 * P)
    assert g[cfg.frame_tokens] == CLEAN and g[cfg.frame_tokens + 1 :] == [ACTION] * cfg.action_horizon


def test_check_fails_a_variant_wrong_on_the_video_alone_and_reports_the_worst_seed(tiny):
    """Actions and video must both pass; the worst seed is the one with the larger of its two errors; each seed
    draws its own inputs."""
    w = get_wam_workload("wam-tiny").with_overrides(steps=2)
    seen = []

    class OneSideOff:  # seed 0: actions 2% off; seed 1: video 5% off
        name = "one-side-off"

        def generate(self, obs, noise, **kw):
            a, v = tiny.generate(obs, noise, **kw)
            seen.append((obs, v))
            return (a * 1.02, v) if len(seen) == 1 else (a, v * 1.05)

    r = check_wam_equivalence(tiny, OneSideOff(), w, seeds=(0, 1))
    assert not r["passed"] and r["seeds"] == 2 and r["variant"] == "one-side-off"
    assert r["video_rel_l2"] == pytest.approx(0.05, rel=1e-3) and r["rel_l2"] < 1e-6  # seed 1's, not seed 0's 2%
    assert r["video_max_abs"] == pytest.approx(0.05 * float(seen[1][1].double().abs().max()), rel=1e-3)
    assert not torch.equal(seen[0][0].context, seen[1][0].context)

    class VideoOffOnSeed1:  # seed 0 passes: the report is still seed 1's failure, on the video alone
        name, calls = "video-off", 0

        def generate(self, obs, noise, **kw):
            self.calls += 1
            a, v = tiny.generate(obs, noise, **kw)
            return a, v * (1.05 if self.calls == 2 else 1.0)

    video_only = check_wam_equivalence(tiny, VideoOffOnSeed1(), w.with_overrides(sparsity="drop_middle"), seeds=(0, 1))
    assert not video_only["passed"] and video_only["rel_l2"] < 1e-6 and video_only["sparsity"] == "drop_middle"
    assert video_only["video_rel_l2"] == pytest.approx(0.05, rel=1e-3)

    class ShortVideo:
        name = "short-video"

        def generate(self, obs, noise, **kw):
            a, v = tiny.generate(obs, noise, **kw)
            return a, v[:, :-1]

    with pytest.raises(AssertionError, match="variant short-video returned video of shape"):
        check_wam_equivalence(tiny, ShortVideo(), w, seeds=(0,))


@pytest.mark.parametrize("cfg_scale", [0.0, 2.0])
def test_wam_tiny_floor_against_a_hand_count(cfg_scale):
    """wam-tiny by hand, per layer (2 layers): width 64, MLP 128, 8 text tokens, 48 frame tokens + the state token
    + 4 actions; the workload's 4 steps are 2 video steps + the one that fills the video cache (3 full forwards), then
    1 with the action tokens alone. Guidance runs the conditional and the unconditional batch."""
    from vlaperf.roofline import wam_roofline

    cfg, b = get_config("wam-tiny"), 2 if cfg_scale else 1
    w = get_wam_workload("wam-tiny").with_overrides(cfg_scale=cfg_scale)
    linear = 4 * 64 * 64 + 2 * 64 * 64 + 2 * 64 * 128  # self q, k, v, o; cross q, o; MLP (MACs per token)
    video, actions = 48 + 1, 4
    full_pairs = video * video + actions * (video + actions) + (video + actions) * 8  # self, then cross to the text
    full = 2 * (2 * b * (video + actions) * linear + 2 * 2 * b * 64 * full_pairs)  # 2 layers; QK^T and PV
    act = 2 * (2 * b * actions * linear + 2 * 2 * b * 64 * (actions * (video + actions) + actions * 8))
    ctx = 2 * 2 * b * 8 * 2 * 64 * 64  # the text's cross K and V, once
    weights, ctx_weights = 2 * 2 * linear, 2 * 2 * 2 * 64 * 64  # bf16, 2 layers
    r = wam_roofline(cfg, w, matmul_flops=1e9, bandwidth=1e8)
    assert (r["tokens"], r["full_forwards"], r["action_forwards"]) == (53, 3, 1)
    assert r["full_forward_tflop"] * 1e12 == pytest.approx(full)
    assert r["flops"] == pytest.approx(ctx + 3 * full + act)
    ms = [1e3 * max(f / 1e9, by / 1e8) for f, by in ((ctx, ctx_weights), (full, weights), (act, weights))]
    assert [r["context_kv_ms"], r["full_forward_ms"], r["action_forward_ms"]] == pytest.approx(ms)
    assert r["floor_ms"] == pytest.approx(ms[0] + 3 * ms[1] + ms[2])


def test_wam_tiny_drop_middle_floor_attends_to_the_kept_video_alone():
    """drop_middle keeps 32 of wam-tiny's 48 frame tokens, and the video cache (video_kv_cache) holds those 32 + the
    state token: the forward of the action tokens alone attends to 33 + 4 keys, not 49 + 4. The floor counted the
    dropped frames' keys there, so its action forward had more FLOPs than the engine computes (a floor above the
    work, where the batch makes that forward compute-bound)."""
    from torch.utils.flop_counter import FlopCounterMode

    from vlaperf.roofline import wam_roofline

    cfg = get_config("wam-tiny")
    w = get_wam_workload("wam-tiny").with_overrides(sparsity="drop_middle")
    linear = 4 * 64 * 64 + 2 * 64 * 64 + 2 * 64 * 128
    video, actions = 32 + 1, 4
    full_pairs = video * video + actions * (video + actions) + (video + actions) * 8
    full = 2 * (2 * (video + actions) * linear + 2 * 2 * 64 * full_pairs)
    act = 2 * (2 * actions * linear + 2 * 2 * 64 * (actions * (video + actions) + actions * 8))
    ctx = 2 * 2 * 8 * 2 * 64 * 64
    r = wam_roofline(cfg, w, matmul_flops=1e9, bandwidth=1e12)  # compute-bound: the FLOPs set every phase
    assert (r["tokens"], r["full_forwards"], r["action_forwards"]) == (37, 3, 1)
    assert r["full_forward_tflop"] * 1e12 == pytest.approx(full)
    assert r["flops"] == pytest.approx(ctx + 3 * full + act)
    assert r["action_forward_ms"] == pytest.approx(1e3 * act / 1e9)
    # the engine agrees: one more action forward costs what torch counts, by the kept keys (its heads on top)
    model = build_wam("wam-tiny", seed=0)
    obs, noise = random_wam_inputs(cfg, 1, "cpu", torch.float32, seed=3)
    engine = WamEngine(model, "cached_keep_index,context_kv_cache,video_kv_cache")
    counted = {}
    for sparsity in ("none", "drop_middle"):
        flops = []
        for steps in (4, 5):  # 2 video steps + the forward that fills the cache, then 1 or 2 action forwards
            with FlopCounterMode(display=False) as counter:
                engine.generate(obs, noise, steps=steps, video_steps=2, sparsity=sparsity)
            flops.append(counter.get_total_flops())
        counted[sparsity] = flops[1] - flops[0]
    dense = wam_roofline(cfg, get_wam_workload("wam-tiny"), matmul_flops=1e9, bandwidth=1e12)
    assert dense["action_forward_ms"] - r["action_forward_ms"] == pytest.approx(
        1e3 * (counted["none"] - counted["drop_middle"]) / 1e9)


def test_wam_matrix_ratios_compare_each_row_with_its_sparsitys_reference_and_its_dense_self(tmp_path, monkeypatch, capsys):
    """vs_reference divides by the reference at the row's own sparsity, sparsity_gain by the same variant at sparsity
    none (None on the dense row); a variant that fails its check is listed but not timed; a prepared row keeps its
    own first call. The timing is replaced by fixed samples, so each ratio is checked against timing._ratio_stats."""
    from vlaperf import check, timing
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    real_check, samples = check.check_wam_equivalence, {}

    def fails_host_schedule_at_drop_middle(model, engine, workload, seeds=(0, 1)):
        if engine.name == "host_schedule" and workload.sparsity == "mae_middle":
            raise RuntimeError("a compiler error\nits trace")  # one broken variant must not lose the matrix
        r = real_check(model, engine, workload, seeds=range(1))
        return {**r, "passed": False} if engine.name == "host_schedule" and workload.sparsity == "drop_middle" else r

    def fixed(fns, *, device, warmup, iters, baseline, progress, idle_ms=None, idle_spin=False):
        out = {}
        for j, key in enumerate(fns):  # distinct per row and per round, so that a wrong pairing shows
            samples[key] = [10.0 + 3 * j + (r * (j + 1)) % 5 for r in range(iters)]
            out[key] = {"timers": {"cuda_event_ms": None, "wall_ms": timing.summarize(samples[key])},
                        "samples": {"wall_ms": samples[key], "cuda_event_ms": None}, "first_call_s": 1000.0 + j,
                        "warmup_s": 0.0, "peak_memory_bytes": 250}
        return {"variants": out}

    first_call_peaks = iter(range(100, 10_000, 100))  # the allocator's peak over each row's first call, in turn
    monkeypatch.setattr(check, "check_wam_equivalence", fails_host_schedule_at_drop_middle)
    monkeypatch.setattr(timing, "interleaved", fixed)
    monkeypatch.setattr(timing, "_reset_peak_memory", lambda device: None)
    monkeypatch.setattr(timing, "_peak_memory", lambda device: next(first_call_peaks))
    m = tmp_path / "m.json"
    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--warmup", "1", "--iters", "6", "--no-progress",
                 "--variants", "none;exact;host_schedule", "--json", str(m)]) == 1  # host_schedule failed its check
    r = read_result(m)
    rows = {row["key"]: row for row in r["variants"]}
    assert list(rows) == [f"{v} | {s}" for s in SPARSITY for v in ("reference", "exact", "host_schedule")]
    # each row's peak covers its first call (compile, capture), made before the rounds' warm-up: the larger of the two
    assert r["peak_memory_over"] == "first call and warm-up"
    for i, row in enumerate(rows.values()):
        own = 100 * (i + 1)
        assert row["peak_memory_bytes"] == (max(own, 250) if "timers" in row else own), row["key"]
    failed = rows["host_schedule | drop_middle"]
    assert failed["skipped"] == "fails equivalence: speed not reported" and "timers" not in failed
    assert "host_schedule | drop_middle" not in samples
    assert rows["host_schedule | mae_middle"]["skipped"] == "failed: RuntimeError: a compiler error"
    assert r["sparsities"] == list(SPARSITY)
    for key, row in rows.items():
        if key not in samples:
            continue
        variant, sparsity = row["variant"], row["sparsity"]
        assert row["vs_reference"] == timing._ratio_stats(samples[f"reference | {sparsity}"], samples[key])
        dense = samples.get(f"{variant} | none")
        assert row["sparsity_gain"] == (timing._ratio_stats(dense, samples[key]) if sparsity != "none" else None)
        # every row's first call is its own, taken when it was prepared: an engine's before its check, the reference's
        # before the variants' checks run the reference model (the timing's, after them, found it warm)
        assert row["first_call_s"] < 1000.0
    assert rows["exact | mae_middle"]["sparsity_gain"] is not None
    # a reference row against itself: every per-round ratio is 1, so the table marks it as noise
    assert "1.00x (1.00..1.00) noise" in " ".join(capsys.readouterr().out.split())
    # --mode forward: each row's floor is the roofline's one full forward at its sparsity, not a generate call's
    from vlaperf.roofline import wam_forward_roofline, wam_roofline

    assert main(["matrix", "--workload", "wam-tiny", "--device", "cpu", "--warmup", "1", "--iters", "2", "--no-progress",
                 "--mode", "forward", "--variants", "exact", "--sparsity", "drop_middle", "--json", str(m)]) == 0
    w = get_wam_workload("wam-tiny").with_overrides(sparsity="drop_middle")
    floor = wam_forward_roofline(get_config("wam-tiny"), w)
    assert floor["floor_ms"] != wam_roofline(get_config("wam-tiny"), w)["floor_ms"]
    assert [row["roofline_floor_ms"] for row in read_result(m)["variants"]] == [floor["floor_ms"]] * 2


def test_check_exits_1_when_any_variant_fails_and_variants_take_none_as_the_reference(monkeypatch):
    """One failing variant among passing ones fails `check`; `matrix --variants` runs the reference once, first,
    whether it is named 'reference', 'none' or not at all."""
    from vlaperf import check
    from vlaperf.cli import main
    from vlaperf.profile.wam import parse_variants

    real_check = check.check_wam_equivalence

    def fails_exact(model, engine, workload, seeds=(0, 1)):
        r = real_check(model, engine, workload, seeds=seeds)
        return {**r, "passed": False} if engine.name != "host_schedule" else r  # exact's name is its lever list

    monkeypatch.setattr(check, "check_wam_equivalence", fails_exact)
    assert main(["check", "--workload", "wam-tiny", "--device", "cpu", "--levers", "host_schedule;exact", "--sparsity",
                 "none", "--seeds", "1"]) == 1
    for spec in ("exact", "none;exact", "exact;reference", "none; exact ;;"):
        assert parse_variants(spec, CPU) == ["reference", "exact"]


def test_wam_commands_refuse_a_checkpoint_and_a_release_without_an_engine(tmp_path, capsys):
    """The world-action model has no checkpoint layout: a --checkpoint would be silently ignored (random weights)."""
    from vlaperf.cli import main

    for command in (["bench", "--iters", "1"], ["check"], ["matrix", "--iters", "1"]):
        assert main(command + ["--workload", "wam-tiny", "--device", "cpu", "--no-progress", "--checkpoint",
                               str(tmp_path)]) == 2
        assert "--checkpoint: the world-action model has no public checkpoint layout yet" in capsys.readouterr().err
    assert main(["bench", "--workload", "wam-tiny", "--device", "cpu", "--iters", "1", "--no-progress",
                 "--release-reference"]) == 2  # the reference runs on the weights an engine would release
    assert "--release-reference needs an engine variant" in capsys.readouterr().err


def test_forward_mode_runs_the_workloads_sparsity(tiny, inputs):
    """`bench --mode forward --sparsity drop_middle` without an engine times the reference forward at drop_middle,
    not the dense one."""
    from vlaperf.profile.wam import call_fn

    obs, noise = inputs
    w = get_wam_workload("wam-tiny").with_overrides(sparsity="drop_middle")
    reference = WamEngine(tiny, "reference")
    with torch.no_grad():
        out = call_fn(tiny, None, w, obs, noise, "forward")()
        assert torch.equal(out, reference.forward_once(obs, noise, "drop_middle"))
        assert not torch.equal(out, reference.forward_once(obs, noise, "none"))


def test_wam_steps_override_keeps_the_early_stops_share():
    """--steps alone scales video_steps by the same factor, rounded, at least 1; given both, both are taken; the
    workload's sampling() is what generate gets (shift included)."""
    w = get_wam_workload("wam-761")  # 10 steps, the video finished in 5
    assert w.with_overrides(steps=3).video_steps == 2  # 1.5 rounds to 2
    # a half rounds up, always: Python's round() halved to even (wam-761's 5 of 10 at 5 steps was 2, at 7 steps 4)
    assert [w.with_overrides(steps=n).video_steps for n in (1, 3, 5, 7, 9, 11, 20)] == [1, 2, 3, 4, 5, 6, 10]
    assert w.with_overrides(steps=1).video_steps == 1  # 0.5 would round to 0: at least one call
    assert w.with_overrides(steps=8, video_steps=3).video_steps == 3
    assert w.with_overrides(cfg_scale=2.0).sampling() == {"steps": 10, "video_steps": 5, "sparsity": "none",
                                                           "cfg_scale": 2.0, "shift": 3.0}
