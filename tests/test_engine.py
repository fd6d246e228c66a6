"""Every engine lever, alone and combined, computes the reference's actions (fp32, tiny)."""

import copy
import dataclasses
import re

import pytest
import torch

from vlaperf.check import check_equivalence, compare
from vlaperf.engine import LEVERS, Engine, LeverError, Levers
from vlaperf.engine.levers import EXPERIMENTAL, MODIFIERS
from vlaperf.engine.prefix import prompt_bucket
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.workloads import get_workload

PLAIN = [n for n in LEVERS if n not in ("cuda_graph", "compile") + EXPERIMENTAL + MODIFIERS]
ALL_PLAIN = ",".join(PLAIN)
FP32_TOL = 1e-4  # relative L2; float32 reordering only (see vlaperf.check)


def rel_l2(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("levers", PLAIN + [ALL_PLAIN, "for_loop,static_kv_cache,fuse_projections"])
def test_lever_matches_reference(tiny_model, tiny_workload, tiny_inputs, levers):
    obs, noise = tiny_inputs
    ref = tiny_model.sample_actions(obs, noise, tiny_workload.steps)
    out = Engine(tiny_model, levers).sample_actions(obs, noise, tiny_workload.steps)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert rel_l2(out, ref) < FP32_TOL


def test_batch_with_different_prompt_lengths(tiny_model, tiny_workload):
    w = dataclasses.replace(tiny_workload.with_overrides(batch=4), prompt_valid=(3, 6, 9, 12))
    obs, noise = random_observation(w, tiny_model.config, seed=5), random_noise(w, tiny_model.config, seed=5)
    ref = tiny_model.sample_actions(obs, noise, w.steps)
    engine = Engine(tiny_model, ALL_PLAIN)
    out = engine.sample_actions(obs, noise, w.steps)
    assert rel_l2(out, ref) < FP32_TOL
    assert engine.last_plan.prompt_len == 16  # longest valid prompt 12 -> bucket 16


def test_batch_rows_are_independent(tiny_model, tiny_workload):
    """Sample i of a batch equals the same observation run alone."""
    w = dataclasses.replace(tiny_workload.with_overrides(batch=3), prompt_valid=(4, 6, 2))
    obs, noise = random_observation(w, tiny_model.config, seed=9), random_noise(w, tiny_model.config, seed=9)
    engine = Engine(tiny_model, ALL_PLAIN)
    batched = engine.sample_actions(obs, noise, w.steps)
    from vlaperf.inputs import Observation

    for i in range(3):
        one = Observation(*(t[i : i + 1] for t in obs.tensors()), host_image_valid=obs.host_image_valid, host_prompt_len=w.prompt_valid[i])
        assert rel_l2(engine.sample_actions(one, noise[i : i + 1], w.steps), batched[i : i + 1]) < FP32_TOL


def test_masked_slot_and_padding_are_not_computed(tiny_model, tiny_inputs, tiny_workload):
    obs, noise = tiny_inputs
    engine = Engine(tiny_model, "skip_masked_images,trim_prompt_padding")
    engine.sample_actions(obs, noise, tiny_workload.steps)
    assert engine.last_plan.slots == (0, 1)  # right wrist is masked in the tiny workload
    assert engine.last_plan.prompt_len == 8  # 6 valid tokens -> bucket 8 of 16 slots
    assert not engine.last_plan.read_device_masks


@pytest.mark.parametrize("levers", ["skip_masked_images", ALL_PLAIN])
def test_a_prefix_with_nothing_kept_keeps_one_masked_image_and_matches_the_reference(tiny_workload, levers):
    """Every image masked and a model without prompt slots (max_token_len 0): skipping the masked images left an
    empty prefix, which failed in a reshape where the reference runs (its prefix is all padding). One masked image
    stays, whose keys are padding as in the reference."""
    config = dataclasses.replace(get_config("tiny"), max_token_len=0)
    w = dataclasses.replace(tiny_workload, prompt_slots=0, prompt_valid=(0,) * tiny_workload.batch,
                            image_valid=(False,) * tiny_workload.image_slots)
    torch.manual_seed(0)
    model = build_model(config).eval()
    obs, noise = random_observation(w, config, seed=3), random_noise(w, config, seed=3)
    ref = model.sample_actions(obs, noise, w.steps)
    engine = Engine(model, levers)
    assert rel_l2(engine.sample_actions(obs, noise, w.steps), ref) < FP32_TOL
    assert (engine.last_plan.slots, engine.last_plan.prompt_len) == ((0,), 0)


def test_plan_without_host_metadata_reads_masks_once(tiny_model, tiny_inputs, tiny_workload):
    obs, noise = tiny_inputs
    bare = dataclasses.replace(obs, host_image_valid=None, host_prompt_len=None)
    engine = Engine(tiny_model, ALL_PLAIN)
    out = engine.sample_actions(bare, noise, tiny_workload.steps)
    assert engine.last_plan.read_device_masks and engine.last_plan.slots == (0, 1)
    assert rel_l2(out, tiny_model.sample_actions(obs, noise, tiny_workload.steps)) < FP32_TOL


def test_plan_from_device_masks_keeps_the_longest_prompt_and_any_sample_s_image(tiny_model, tiny_workload):
    """Without the host's counts the plan reads the masks: the batch keeps its longest prompt (not the shortest,
    which would cut the others' instructions) and every image slot valid in any sample (not only in all)."""
    w = dataclasses.replace(tiny_workload.with_overrides(batch=2), prompt_valid=(3, 12))
    obs, noise = random_observation(w, tiny_model.config, seed=5), random_noise(w, tiny_model.config, seed=5)
    mask = obs.image_mask.clone()
    assert not mask[:, 2].any()
    mask[0, 2] = True  # sample 0 has its third camera, sample 1 has not
    obs = dataclasses.replace(obs, image_mask=mask)
    bare = dataclasses.replace(obs, host_image_valid=None, host_prompt_len=None)
    engine = Engine(tiny_model, ALL_PLAIN)
    out = engine.sample_actions(bare, noise, w.steps)
    assert engine.last_plan.read_device_masks
    assert engine.last_plan.prompt_len == prompt_bucket(12, obs.tokens.shape[1]) and engine.last_plan.slots == (0, 1, 2)
    assert rel_l2(out, tiny_model.sample_actions(obs, noise, w.steps)) < FP32_TOL


def test_sdpa_and_static_kv_cache_change_the_path_they_name(tiny_model, tiny_inputs, monkeypatch):
    """Three levers whose effect the actions cannot show: `sdpa` must leave eager attention unused,
    `static_kv_cache` builds the suffix mask once a call, not once a step, and `fuse_projections` builds the fused
    weights."""
    import vlaperf.engine.attention as attention
    import vlaperf.engine.loop as loop

    obs, noise = tiny_inputs
    eager, masks = [], []
    real_eager, real_mask = attention.eager_attention, loop.suffix_mask
    monkeypatch.setattr(attention, "eager_attention", lambda *a: eager.append(1) or real_eager(*a))
    monkeypatch.setattr(loop, "suffix_mask", lambda *a: masks.append(1) or real_mask(*a))
    Engine(tiny_model, "for_loop").sample_actions(obs, noise, 5)
    assert eager and len(masks) == 5  # the lever-less loop: eager attention, a mask each step
    eager.clear(), masks.clear()
    Engine(tiny_model, "for_loop,sdpa").sample_actions(obs, noise, 5)
    assert not eager
    masks.clear()
    Engine(tiny_model, "for_loop,static_kv_cache").sample_actions(obs, noise, 5)
    assert len(masks) == 1
    assert Engine(tiny_model, "fuse_projections").weights.backbone[0].qkv is not None
    assert Engine(tiny_model, "for_loop").weights.backbone[0].qkv is None


def test_prompt_buckets():
    assert [prompt_bucket(n, 48) for n in (1, 8, 9, 20, 33, 48)] == [8, 8, 16, 32, 48, 48]
    assert prompt_bucket(150, 200) == 200 and prompt_bucket(64, 200) == 64
    assert prompt_bucket(300, 400) == 400  # past the largest bucket every slot is kept


def test_stage_hook_marks_every_stage(tiny_model, tiny_inputs, tiny_workload):
    obs, noise = tiny_inputs
    engine = Engine(tiny_model, "for_loop")
    seen = []
    engine.stage_hook = seen.append
    engine.sample_actions(obs, noise, tiny_workload.steps)
    assert seen == ["embed_prefix", "prefill"] + [f"denoise_step_{i}" for i in range(tiny_workload.steps)] + ["end"]


def test_levers_parse_and_errors():
    assert Levers.parse("reference") == Levers()
    assert Levers.parse("for_loop,compile=max-autotune").compile == "max-autotune"
    assert Levers.parse("best", "cpu").names() == PLAIN
    assert "cuda_graph" in Levers.parse("best", "cuda").names()
    with pytest.raises(LeverError, match="unknown lever 'warp_drive'"):
        Levers.parse("warp_drive")
    with pytest.raises(LeverError, match="compile mode 'fast' is not one of"):
        Levers.parse("compile=fast")
    with pytest.raises(LeverError, match="takes no value"):
        Levers.parse("sdpa=1")


def test_inapplicable_levers_fail_clearly(tiny_model):
    with pytest.raises(LeverError, match="cuda_graph needs a CUDA device"):
        Engine(tiny_model, "for_loop,cuda_graph")
    with pytest.raises(LeverError, match="compile=reduce-overhead uses CUDA graphs and needs a CUDA device"):
        Engine(tiny_model, "for_loop,compile=reduce-overhead")
    lv = Levers.parse("cuda_graph")
    with pytest.raises(LeverError, match="cuda_graph needs for_loop"):
        lv.check("cuda")
    with pytest.raises(LeverError, match="triton_kernels needs fuse_projections"):
        Levers.parse("triton_kernels").check("cuda")
    with pytest.raises(LeverError, match="triton_kernels needs a CUDA device"):
        Levers.parse("fuse_projections,triton_kernels").check("cpu")
    with pytest.raises(LeverError, match="megakernel needs static_kv_cache"):
        Levers.parse("fuse_projections,megakernel").check("cuda")
    with pytest.raises(LeverError, match="megakernel needs fuse_projections"):
        Levers.parse("static_kv_cache,megakernel").check("cuda")
    # both missing: both named at once, with the spelling that runs (session 67's plan named megakernel alone)
    with pytest.raises(LeverError, match="megakernel needs fuse_projections and static_kv_cache: .*"
                                         "--levers fuse_projections,static_kv_cache,megakernel, or take best"):
        Levers.parse("megakernel").check("cuda")
    Levers.parse("fuse_projections,static_kv_cache,megakernel").check("cuda")  # the spelling it gives runs
    with pytest.raises(LeverError, match="megakernel needs a CUDA device"):
        Levers.parse("fuse_projections,static_kv_cache,megakernel").check("cpu")
    for spec in ("megakernel", "triton_kernels"):  # on a CPU the device is the answer, not the levers beside them
        with pytest.raises(LeverError, match=f"{spec} needs a CUDA device"):
            Levers.parse(spec).check("cpu")
    with pytest.raises(LeverError, match="'compile=': no compile mode after '='"):
        Levers.parse("for_loop,compile=")


def test_bad_sample_inputs_are_named_errors_on_both_paths(tiny_model, tiny_inputs):
    """The reference and the engine refuse a wrong argument before any layer runs, naming it (a negative
    num_steps used to make the reference's `while` loop forever; a wrong shape failed inside a matmul)."""
    import dataclasses

    obs, noise = tiny_inputs
    cfg = tiny_model.config
    B, S = obs.images.shape[:2]
    bad_obs = [
        (dict(images=obs.images[..., :20, :20]), "obs.images: expected a float tensor"),
        (dict(images=obs.images.to(torch.uint8)), "obs.images: expected a float tensor"),
        (dict(image_mask=obs.image_mask.float()), "obs.image_mask: expected a bool tensor"),
        (dict(tokens=obs.tokens.float()), "obs.tokens: expected an int32 or int64 tensor"),
        (dict(tokens=obs.tokens.to(torch.int16)), "obs.tokens: expected an int32 or int64 tensor"),  # was inside F.embedding
        (dict(tokens=obs.tokens + cfg.backbone.vocab_size), rf"obs.tokens: ids in \[\d+, \d+\], expected "
                                                             rf"0..{cfg.backbone.vocab_size - 1}"),
        (dict(tokens=obs.tokens - 10**6), "obs.tokens: ids in"),
        (dict(tokens=obs.tokens.clamp(max=0) + cfg.backbone.vocab_size), "obs.tokens: ids in"),  # the boundary
        (dict(token_mask=obs.token_mask[:, :3]), "obs.token_mask: expected a bool tensor"),
        (dict(host_image_valid=(True,) * (S + 1)), "obs.host_image_valid: expected one flag per image slot"),
        # trusted, but not of any type or range: -1 trimmed the prompt silently, "8" failed inside prompt_bucket
        *[(dict(host_prompt_len=n), rf"obs.host_prompt_len: expected an integer in 0..{obs.tokens.shape[1]} \(")
          for n in (-1, obs.tokens.shape[1] + 1, "8", 2.0, True)],
    ]
    if not cfg.pi05:  # pi0.5's state goes into the prompt; pi0 projects the padded state
        bad_obs.append((dict(state=obs.state[:, :3]), f"obs.state: expected a float tensor \\(B, {cfg.action_dim}\\)"))
    engine = Engine(tiny_model, "for_loop")
    for sample in (tiny_model.sample_actions, engine.sample_actions):
        for steps in (0, -3, 2.5, True, 1001):
            with pytest.raises(ValueError, match=f"num_steps: expected an integer in 1..1000, got {steps!r}"):
                sample(obs, noise, steps)
        for change, message in bad_obs:
            with pytest.raises(ValueError, match=message):
                sample(dataclasses.replace(obs, **change), noise, 2)
        for bad_noise in (noise[:, :, :3], noise.repeat(2, 1, 1)):
            with pytest.raises(ValueError, match=r"noise: expected a float tensor \(%d, %d, %d\)" % (B, cfg.action_horizon, cfg.action_dim)):
                sample(obs, bad_noise, 2)
        with pytest.raises(TypeError, match="obs.state: expected a torch.Tensor"):
            sample(dataclasses.replace(obs, state=obs.state.numpy()), noise, 2)
        with pytest.raises(TypeError, match="obs: expected an inputs.Observation .*, got a dict: give openpi's"):
            sample({"images": obs.images, "state": obs.state}, noise, 2)  # was "obs.images: ... got NoneType"
        empty = dataclasses.replace(obs, **{f: getattr(obs, f)[:0] for f in ("images", "image_mask", "tokens",
                                                                             "token_mask", "state")})
        with pytest.raises(ValueError, match="obs.state: a batch of 0 samples"):  # the engine's was max() of nothing
            sample(empty, noise[:0], 2)


def test_engine_calls_from_two_threads_get_their_own_actions(tiny_model, tiny_workload):
    """The static KV cache is the engine's own buffer: calls from several threads take turns (they once
    overwrote each other's cache and returned wrong actions with no error)."""
    import threading

    engine = Engine(tiny_model, "exact")
    cases = [(random_observation(tiny_workload, tiny_model.config, seed=s), random_noise(tiny_workload, tiny_model.config, seed=s))
             for s in (1, 2)]
    expected = [engine.sample_actions(o, n, 3) for o, n in cases]
    assert (expected[0] - expected[1]).abs().max() > 0.1  # a call that got the other's cache would be far off
    wrong = []

    def run(i: int) -> None:
        for _ in range(6):
            out = engine.sample_actions(*cases[i], 3)
            # not bit-exact: with torch's threads set below the core count (as the conftest does per xdist worker),
            # the first call in a new thread differs by ~1e-6 even with no other thread running (seen on the H200
            # machine's 16 cores, session 34); a shared cache gives errors of order 1
            wrong.append((out - expected[i]).abs().max().item() > 1e-4)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wrong) == 12 and not any(wrong)


def test_engine_joins_the_inductor_warmup_thread_before_torch_compile(tiny_model, monkeypatch):
    """The warm-up thread imports inductor; torch.compile in the constructor imports it too. Both at once
    raised a circular ImportError ("partially initialized module"), so the constructor waits for the thread."""
    import threading

    from vlaperf.engine import compile as compile_module

    started = []

    def slow_warmup():
        t = threading.Thread(target=lambda: __import__("time").sleep(0.3))
        t.start()
        started.append(t)
        return t

    def fake_compile_fn(fn, *args, **kwargs):
        assert started and not started[0].is_alive(), "torch.compile while the warm-up thread still runs"
        return fn

    monkeypatch.setattr(compile_module, "compile_blockers", lambda *a: [])
    monkeypatch.setattr(compile_module, "start_inductor_warmup", slow_warmup)
    monkeypatch.setattr(compile_module, "compile_fn", fake_compile_fn)
    engine = Engine(tiny_model, "for_loop,sdpa,compile=default", compile_backend="inductor")
    assert started and engine._inductor_warmup is None


def test_reference_weights_untouched(tiny_model, tiny_inputs, tiny_workload):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    Engine(tiny_model, ALL_PLAIN).sample_actions(*tiny_inputs, tiny_workload.steps)
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_release_reference_weights_frees_the_copies_the_engine_holds(tiny_model, tiny_inputs, tiny_workload):
    """What `vlaperf serve` does after its check: the reference's q/k/v and gate/up, which
    the engine holds fused, are freed; the engine's actions stay the same bits."""
    model, steps = copy.deepcopy(tiny_model), tiny_workload.steps  # the fixture's model is shared
    engine = Engine(model, ALL_PLAIN)
    before = engine.sample_actions(*tiny_inputs, steps)
    held = lambda: sum(p.numel() * p.element_size() for p in model.parameters())  # noqa: E731
    size = held()
    copied = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                 if re.search(r"\.(q|k|v|gate|up)_proj\.", name))
    assert copied > 0 and engine.release_reference_weights() == copied
    assert held() == size - copied
    assert torch.equal(engine.sample_actions(*tiny_inputs, steps), before)
    with pytest.raises(RuntimeError, match="reference weights were released"):
        model.sample_actions(*tiny_inputs, steps)


def test_release_without_fused_copies_frees_nothing(tiny_model, tiny_inputs, tiny_workload):
    model = copy.deepcopy(tiny_model)
    engine = Engine(model, "for_loop,static_kv_cache")  # reads the model's own parameters
    assert engine.release_reference_weights() == 0
    ref = model.sample_actions(*tiny_inputs, tiny_workload.steps)  # the reference still runs
    assert rel_l2(engine.sample_actions(*tiny_inputs, tiny_workload.steps), ref) < FP32_TOL


@pytest.mark.parametrize("levers", ["for_loop,compile", ALL_PLAIN + ",compile", ALL_PLAIN + ",compile,compile_layers"])
def test_compiled_path_has_no_graph_breaks_and_no_recompiles(tiny_model, tiny_workload, levers):
    """fullgraph=True turns a graph break into an error; a new prompt length inside the
    same bucket must not recompile. The 'eager' backend traces exactly as inductor would
    but skips code generation, so this runs in seconds on the CPU."""
    import torch._dynamo

    torch._dynamo.reset()
    cfg = tiny_model.config
    engine = Engine(tiny_model, levers, compile_backend="eager")
    obs, noise = random_observation(tiny_workload, cfg, seed=1), random_noise(tiny_workload, cfg, seed=1)
    out = engine.sample_actions(obs, noise, tiny_workload.steps)
    assert rel_l2(out, tiny_model.sample_actions(obs, noise, tiny_workload.steps)) < FP32_TOL
    w7 = dataclasses.replace(tiny_workload, prompt_valid=(7,))
    obs7 = random_observation(w7, cfg, seed=2)
    with torch._dynamo.config.patch(error_on_recompile=True):
        out7 = engine.sample_actions(obs7, noise, tiny_workload.steps)
    assert rel_l2(out7, tiny_model.sample_actions(obs7, noise, tiny_workload.steps)) < FP32_TOL


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_compile_layers_compiles_each_layer_block_once_whatever_the_depth(tiny_workload, pi05):
    """Regional compilation: the number of compiled graphs does not grow with the number of
    layers (a SigLIP block, a Gemma block, the last layer's K/V, the step), and the actions match
    the reference at every depth."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    graphs = {}
    for depth in (4, 6):
        base = get_config("tiny", pi05=pi05)
        cfg = dataclasses.replace(base, vision=dataclasses.replace(base.vision, depth=depth),
                                  backbone=dataclasses.replace(base.backbone, depth=depth),
                                  expert=dataclasses.replace(base.expert, depth=depth))
        model = build_model(cfg, "cpu", torch.float32, seed=0)
        obs, noise = random_observation(tiny_workload, cfg, seed=1), random_noise(tiny_workload, cfg, seed=1)
        torch._dynamo.reset()
        counters.clear()
        engine = Engine(model, ALL_PLAIN + ",compile,compile_layers", compile_backend="eager")
        out = engine.sample_actions(obs, noise, tiny_workload.steps)
        assert rel_l2(out, model.sample_actions(obs, noise, tiny_workload.steps)) < FP32_TOL
        graphs[depth] = counters["stats"]["unique_graphs"]
    assert graphs[4] == graphs[6] == 4, graphs


def test_compile_layers_without_compile_is_a_lever_error():
    with pytest.raises(LeverError, match="compile_layers needs compile"):
        Levers.parse("for_loop,compile_layers").check("cpu")
    assert Levers.parse("for_loop,compile=reduce-overhead,compile_layers").names()[-2:] == ["compile=reduce-overhead",
                                                                                         "compile_layers"]


def test_check_equivalence_passes_and_catches_a_broken_variant(tiny_model, tiny_workload):
    engine = Engine(tiny_model, ALL_PLAIN)
    ok = check_equivalence(tiny_model, engine, tiny_workload)
    assert ok["passed"] and ok["rel_l2"] < FP32_TOL and ok["dtype"] == "float32"

    class Broken:
        name = "broken"

        def sample_actions(self, obs, noise, steps):
            return engine.sample_actions(obs, noise, steps) * 1.01

    bad = check_equivalence(tiny_model, Broken(), tiny_workload)
    assert not bad["passed"] and bad["rel_l2"] > FP32_TOL

    class WrongOnOneSeed:  # the check reports the worst seed, so one wrong seed fails it (the first: not the last)
        name, calls = "wrong-once", 0

        def sample_actions(self, obs, noise, steps):
            self.calls += 1
            return engine.sample_actions(obs, noise, steps) * (1.001 if self.calls == 1 else 1.0)

    once = check_equivalence(tiny_model, WrongOnOneSeed(), tiny_workload)
    assert not once["passed"] and once["rel_l2"] == pytest.approx(1e-3, rel=1e-3)
    nan = compare(torch.full((1, 2), float("nan")), torch.ones(1, 2), torch.float32)
    assert not nan["passed"]


def test_compare_is_relative_to_the_reference_and_the_tolerances_are_the_documented_ones():
    from vlaperf.check import REL_L2_TOLERANCE

    ref = torch.tensor([3.0, -4.0])
    assert compare(2 * ref, ref, torch.float32)["rel_l2"] == pytest.approx(1.0)  # |a - r| / |r|, not / |a|
    assert compare(torch.zeros(2), ref, torch.float32)["rel_l2"] == pytest.approx(1.0)
    assert compare(ref + torch.tensor([0.0, 0.5]), ref, torch.float32)["max_abs"] == pytest.approx(0.5)
    # docs/results.md and the README state these; a looser one would let wrong variants be timed
    assert REL_L2_TOLERANCE[torch.float32] == 1e-4 and REL_L2_TOLERANCE[torch.bfloat16] == 3e-2


def test_best_adds_the_triton_levers_only_on_the_gpus_they_were_tuned_for(monkeypatch):
    import vlaperf.engine.levers as levers_mod

    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    hopper = Levers.parse("best", "cuda")
    assert hopper.triton_kernels and hopper.megakernel
    hopper.check("cuda")  # what megakernel needs beside it is in the preset
    graph = Levers.parse("graph", "cuda")
    assert not graph.triton_kernels and not graph.megakernel
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 8)  # e.g. an RTX 4090 / A100
    best = Levers.parse("best", "cuda")
    assert not best.triton_kernels and not best.megakernel and best.cuda_graph and best.compile == "default"
    assert not Levers.parse("best", "cpu").triton_kernels and not Levers.parse("best", "cpu").megakernel


def test_best_adds_the_triton_levers_only_for_the_dtype_they_were_tuned_for(monkeypatch):
    """The kernels' tiles are sized for bfloat16 weights: a float32 libero-pi0 asked the megakernel for 384 KiB of
    shared memory a block on an H100 (session 65), so `best` of a float32 model is compile + graph, in the engine,
    in check's variants and in the matrix's cumulative table alike. Asked for by name, the levers stay."""
    import vlaperf.engine.levers as levers_mod
    from vlaperf.profile.matrix import cumulative_variants

    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    assert Levers.parse("best", "cuda", torch.bfloat16) == Levers.parse("best", "cuda")  # None: bfloat16, the default
    assert Levers.parse("best", "cuda").megakernel
    fp32 = Levers.parse("best", "cuda", torch.float32)
    assert not fp32.triton_kernels and not fp32.megakernel and fp32.cuda_graph and fp32.compile == "default"
    assert Levers.parse(",".join(levers_mod.EXACT) + ",megakernel", "cuda", torch.float32).megakernel
    table = cumulative_variants(torch.device("cuda"), torch.float32)
    assert Levers.parse(table[-1]) == fp32 and "megakernel" not in table[-1]
    assert "megakernel" in cumulative_variants(torch.device("cuda"), torch.bfloat16)[-1]
    seen = []  # the engine resolves `best` for its model's dtype
    parse = Levers.parse.__func__
    monkeypatch.setattr(Levers, "parse", classmethod(lambda cls, *a: seen.append(a[2:]) or parse(cls, *a)))
    Engine(build_model("tiny", "cpu", torch.float32), "best")
    assert seen == [(torch.float32,)]


def test_megakernel_batched_is_a_lever_value():
    """`megakernel=batched` (several samples in one step launch) parses, prints back as given,
    still needs what megakernel needs, and other values are refused naming the lever."""
    lv = Levers.parse("for_loop,static_kv_cache,fuse_projections,megakernel=batched")
    assert lv.megakernel == "batched" and lv.names()[-1] == "megakernel=batched"
    assert Levers.parse("for_loop,static_kv_cache,fuse_projections,megakernel").names()[-1] == "megakernel"
    with pytest.raises(LeverError, match="megakernel takes no value or 'batched'"):
        Levers.parse("megakernel=all")
    with pytest.raises(LeverError, match="megakernel needs fuse_projections"):
        Levers.parse("static_kv_cache,megakernel=batched").check("cuda")  # on a CPU: "needs a CUDA device" first


def test_cumulative_table_ends_at_what_best_resolves_to(monkeypatch):
    import vlaperf.engine.levers as levers_mod
    from vlaperf.profile.matrix import cumulative_variants

    cpu = cumulative_variants(torch.device("cpu"))
    assert cpu[0] == "reference" and Levers.parse(cpu[-1]) == Levers.parse("best", "cpu")
    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    for major in (9, 8):
        monkeypatch.setattr(levers_mod, "_capability_major", lambda device: major)
        gpu = cumulative_variants(torch.device("cuda"))
        assert Levers.parse(gpu[-1]) == Levers.parse("best", "cuda"), (major, gpu[-1])
        assert all(gpu[i + 1].startswith(gpu[i]) for i in range(1, len(gpu) - 1))  # one lever added per row


def test_a_step_kernel_barrier_timeout_is_reported_once_and_fails_the_policy_call(monkeypatch):
    """A grid barrier that gave up leaves a flag on the device; the policy path (server,
    bench --mode policy) reads it after each call and raises instead of returning the wrong
    actions, and the next call starts clean."""
    import numpy as np

    from vlaperf.engine.kernels import expert_step as S
    from vlaperf.inputs import make_example
    from vlaperf.models.pi0 import build_model
    from vlaperf.policy import Policy

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets the lever build on the CPU; no kernel runs here
    w = get_workload("tiny")
    model = build_model("tiny")
    engine = Engine(model, "for_loop,static_kv_cache,fuse_projections,megakernel")
    plain = Engine(model, "for_loop,static_kv_cache,fuse_projections")
    flag = S._error_flag(engine.device)
    flag.fill_(1)
    plain.raise_on_kernel_fault()  # no megakernel: nothing to check, the flag stays
    assert S.barrier_timeouts(engine.device) == 1
    policy = Policy(model, plain.sample_actions, w, verify=engine.raise_on_kernel_fault)
    with pytest.raises(RuntimeError, match="grid barrier of the step kernel timed out"):
        policy.infer(make_example(w))
    assert S.take_barrier_timeouts(engine.device) == 0  # taken and cleared by the failed call
    assert policy.infer(make_example(w))["actions"].dtype == np.float32


def test_patch_embed_matmul_equals_the_conv():
    """SigLIP's patch embedding as a matmul of the patches (fused weights) is the conv's result."""
    from vlaperf.engine.fusion import build_weights
    from vlaperf.engine.prefix import patch_embed

    model = build_model("tiny", "cpu", torch.float32, seed=0)
    ew = build_weights(model, fuse=True)
    images = torch.rand(3, 3, model.config.vision.image_size, model.config.vision.image_size) * 2 - 1
    ref = model.vision.embeddings(images)
    out = patch_embed(ew.patch, images, model.vision.embeddings)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert build_weights(model, fuse=False).patch is None
    # TF32 only where the model computes in bf16 (the check's float32 tolerance stays exact)
    assert not ew.patch_tf32
    assert build_weights(build_model("tiny", "cpu", torch.bfloat16, seed=0), fuse=True).patch_tf32
    out_tf32 = patch_embed(ew.patch, images, model.vision.embeddings, tf32=True)  # a CPU tensor: the float32 path
    torch.testing.assert_close(out_tf32, out, rtol=0, atol=0)


def test_tf32_block_restores_the_processs_setting_even_on_error():
    from vlaperf.engine.prefix import tf32_matmuls

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        for setting in ("ieee", "tf32", "none"):
            matmul.fp32_precision = setting
            with tf32_matmuls():
                assert matmul.fp32_precision == "tf32"
            assert matmul.fp32_precision == setting
            with pytest.raises(ZeroDivisionError), tf32_matmuls():
                1 / 0
            assert matmul.fp32_precision == setting
    finally:
        matmul.fp32_precision = before


def test_kernel_compile_pass_is_seen_by_its_own_thread_only():
    """patch_embed leaves the process-wide TF32 switch alone in the engine's kernel-compile thread (inside
    `compile_only()`): flipped there while the main thread traced a compiled block, it failed dynamo's guard
    on the H200. The flag must be this thread's alone, so the main thread's own calls keep TF32."""
    import threading

    from vlaperf.engine.kernels.launch import compile_only, compiling_only

    seen = {}
    inside, release = threading.Event(), threading.Event()

    def compile_thread():
        with compile_only(record=[]):
            seen["compile thread"] = compiling_only()
            inside.set()
            release.wait(10)

    t = threading.Thread(target=compile_thread)
    t.start()
    assert inside.wait(10)
    seen["main thread meanwhile"] = compiling_only()
    release.set()
    t.join()
    assert seen == {"compile thread": True, "main thread meanwhile": False}
    assert not compiling_only()


def test_tf32_block_falls_back_to_the_older_switch(monkeypatch):
    """torch before 2.9 has only `allow_tf32`: the block sets and restores that one."""
    from vlaperf.engine import prefix

    class OldMatmul:  # torch.backends.cuda.matmul as torch 2.4-2.8 has it
        allow_tf32 = False

    old = OldMatmul()
    monkeypatch.setattr(prefix.torch.backends.cuda, "matmul", old)
    with prefix.tf32_matmuls():
        assert old.allow_tf32 is True
    assert old.allow_tf32 is False


def test_siglip_gelu_epilogue_is_cuda_only_and_computes_fc1_gelu():
    """The fused fc1 + GELU call is used only where `_addmm_activation` is the tanh GELU (CUDA:
    the H200 probe in benchmarks/results/h200/prefix_ab_libero-pi0_gelu_epilogue.json); on the
    CPU it is the erf GELU, so the CPU weights keep the two-step form. The call's shapes and
    bias are checked here against erf."""
    import torch.nn.functional as F

    from vlaperf.engine.fusion import build_weights
    from vlaperf.engine.layers import siglip_fc1_gelu

    model = build_model("tiny", "cpu", torch.float32, seed=0)
    lw = build_weights(model, fuse=True).vision[0]
    assert lw.gelu_epilogue is False
    h = torch.randn(2, 5, lw.fc1[0].shape[1])
    torch.testing.assert_close(siglip_fc1_gelu(lw, h), F.gelu(F.linear(h, *lw.fc1), approximate="tanh"))
    lw.gelu_epilogue = True
    torch.testing.assert_close(siglip_fc1_gelu(lw, h), F.gelu(F.linear(h, *lw.fc1)), rtol=1e-5, atol=1e-5)


def test_siglip_fc2_through_cublaslt_is_cuda_bf16_only_and_computes_fc2():
    """SigLIP's fc2 goes through `vlaperf::lt_linear` (kernels/cublaslt.py: cuBLASLt with its heuristic's
    algorithm for a 32 MiB workspace limit) only for fused bf16 weights on CUDA; the op computes F.linear
    wherever cuBLASLt cannot serve, so the layer's output with the flag on equals it with the flag off here.
    On the GPU, benchmarks/change_ab.py --change lt_fc2 checks the engine's actions against the reference."""
    import ctypes

    import torch.nn.functional as F

    from vlaperf.engine.fusion import build_weights
    from vlaperf.engine.kernels import cublaslt
    from vlaperf.engine.kernels.ops import lt_linear
    from vlaperf.engine.layers import siglip_layer_parts

    for dtype in (torch.float32, torch.bfloat16):
        lw = build_weights(build_model("tiny", "cpu", dtype, seed=0), fuse=True).vision[0]
        assert lw.fc2_lt is False  # CPU weights
    lw = build_weights(build_model("tiny", "cpu", torch.float32, seed=0), fuse=True).vision[0]
    x = torch.randn(2, 5, lw.fc2[0].shape[0])
    g = torch.randn(2, 5, lw.fc2[0].shape[1])
    assert torch.equal(lt_linear(g, *lw.fc2), F.linear(g, *lw.fc2))
    assert torch.equal(cublaslt.linear(g.bfloat16(), *(t.bfloat16() for t in lw.fc2)),
                       F.linear(g.bfloat16(), *(t.bfloat16() for t in lw.fc2)))
    off = siglip_layer_parts(lw, x, 1e-6, True)
    lw.fc2_lt = True
    on = siglip_layer_parts(lw, x, 1e-6, True)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
    torch.library.opcheck(lt_linear, (g, *lw.fc2))  # schema, fake shapes, dispatch
    # the result struct cuBLASLt fills in an array: its size must be the header's (an algorithm is 8 words)
    assert (ctypes.sizeof(cublaslt.Algo), ctypes.sizeof(cublaslt.Heuristic)) == (64, 96)
    if not torch.cuda.is_available():
        with pytest.raises(cublaslt.CublasLtError, match="needs CUDA"):
            cublaslt.library()


def test_static_cache_keys_padded_to_alignment_change_nothing(monkeypatch):
    """The static cache holds Tp + Ts keys rounded up to KV_ALIGN (tiny: 40 + 11 -> 56); the
    padding keys are masked, so the actions equal those of an unpadded cache."""
    import vlaperf.engine.engine as E

    w = get_workload("tiny")
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(w, model.config, seed=2), random_noise(w, model.config, seed=2)
    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections"
    padded = Engine(model, levers)
    out = padded.sample_actions(obs, noise, w.steps)
    (k, _), = padded._kv.values()
    assert k.shape[3] % E.KV_ALIGN == 0 and k.shape[3] > 40 + 11, k.shape
    monkeypatch.setattr(E, "KV_ALIGN", 1)
    plain = Engine(model, levers)
    ref = plain.sample_actions(obs, noise, w.steps)
    (k1, _), = plain._kv.values()
    assert k1.shape[3] == 40 + 11
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_euler_update_folded_into_the_action_head(tiny_model, tiny_workload, tiny_inputs, monkeypatch):
    """With fuse_projections the action head returns the next x_t (dt folded into its weight and
    bias, fusion.euler_tables): the same actions as the update written out, within float32
    rounding; a model whose head is not float32 keeps the update written out."""
    from vlaperf.engine import fusion, loop

    obs, noise = tiny_inputs
    levers = "for_loop,static_kv_cache,fuse_projections"
    residuals = []
    real_head = loop.head_linear

    def head(x, weight, bias, kernels, residual=None):
        residuals.append(residual is not None)
        return real_head(x, weight, bias, kernels, residual=residual)

    monkeypatch.setattr(loop, "head_linear", head)
    folded = Engine(tiny_model, levers).sample_actions(obs, noise, tiny_workload.steps)
    assert residuals.count(True) == tiny_workload.steps  # every step's action head took x_t + dt b
    residuals.clear()
    Engine(tiny_model, "for_loop,static_kv_cache").sample_actions(obs, noise, tiny_workload.steps)
    assert residuals == [False] * tiny_workload.steps  # without fuse_projections: the model's head, as it is
    # before euler_tables is replaced below (after it, this assert could not fail)
    bf16_head = copy.deepcopy(tiny_model)
    bf16_head.action_out_proj.to(torch.bfloat16)
    assert fusion.euler_tables(tiny_model, 3) and "euler_proj" not in fusion.time_tables(bf16_head, 3, "cpu")
    monkeypatch.setattr(fusion, "euler_tables", lambda model, num_steps: {})
    residuals.clear()
    written_out = Engine(tiny_model, levers).sample_actions(obs, noise, tiny_workload.steps)
    assert not any(residuals)
    assert rel_l2(folded, written_out) < 1e-6
    ref = tiny_model.sample_actions(obs, noise, tiny_workload.steps)
    assert rel_l2(folded, ref) < FP32_TOL


def test_split_gate_up_switch_gives_the_fused_gate_ups_actions(tiny_model, tiny_inputs, tiny_workload, monkeypatch):
    """layers.SPLIT_GATE_UP (benchmarks/change_ab.py's `split_gate_up`): the stacked gate_up weight's two halves
    as two GEMMs compute the same products as the one GEMM of twice the width, bit for bit on the CPU."""
    from vlaperf.engine import layers

    obs, noise = tiny_inputs
    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections"
    fused = Engine(tiny_model, levers).sample_actions(obs, noise, tiny_workload.steps)
    monkeypatch.setattr(layers, "SPLIT_GATE_UP", True)
    calls = []
    real = layers.F.linear
    monkeypatch.setattr(layers.F, "linear", lambda x, w, *a: calls.append(w.shape) or real(x, w, *a))
    split = Engine(tiny_model, levers).sample_actions(obs, noise, tiny_workload.steps)
    width = 2 * tiny_model.config.backbone.mlp_dim
    assert calls and all(shape[0] != width for shape in calls)  # no GEMM of the stacked width ran
    assert torch.equal(fused, split)


def test_unknown_lever_agrees_with_the_parser():
    """matrix refuses a variant by `unknown_lever` before building anything; it must name what `Levers.parse`
    would refuse as no lever, and nothing it accepts (a preset only as the whole list)."""
    from vlaperf.engine.levers import LeverError, Levers, unknown_lever

    for spec in ("best", "graph", "reference", "none", "", "for_loop,sdpa", "for_loop,compile=reduce-overhead"):
        assert unknown_lever(spec) is None
        Levers.parse(spec)
    for spec, name in (("warp_drive", "warp_drive"), ("for_loop, nope=1", "nope")):
        assert unknown_lever(spec) == name
        with pytest.raises(LeverError, match=f"unknown lever {name!r}"):
            Levers.parse(spec)
    # a preset inside a list is named as a preset (the user's culprit may be another name beside it)
    assert unknown_lever("for_loop,best") == "best"
    with pytest.raises(LeverError, match="'best' is a preset: give it alone"):
        Levers.parse("best,bogus")
    # a name lost ("$A,$B" with neither set gives ","): both refuse it alike
    for spec in ("for_loop,,sdpa", "for_loop,", ",sdpa", ["for_loop", " "], ",", " , ", ["", ""]):
        for refuse in (unknown_lever, Levers.parse):
            with pytest.raises(LeverError, match="empty lever name in .*two commas in a row, or one at an end"):
                refuse(spec)


def test_the_steps_kernel_mask_is_made_once_a_call_in_aligned_rows():
    """With the hoisted context (static_kv_cache) every step gets the same uint8 mask, made once a call, its rows
    padded to 16 bytes (13 prefix keys + 5 suffix keys here) and equal to the bool mask; without hoisting it is
    rebuilt with the mask at every step, as the reference rebuilds the mask."""
    from vlaperf.engine.loop import SuffixContext

    model = build_model("tiny", "cpu", torch.float32, seed=0)
    cfg = model.config
    state = torch.zeros(1, cfg.action_dim)
    pad = torch.ones(1, 13, dtype=torch.bool)
    pad[0, 10:] = False
    hoisted = SuffixContext(model, state, pad, None, None, hoist=True)
    mask, _, _ = hoisted.mask_rope()
    first = hoisted.kernel_mask(mask)
    assert first.dtype == torch.uint8 and first.stride(1) % 16 == 0 and torch.equal(first.bool(), mask)
    assert hoisted.kernel_mask(hoisted.mask_rope()[0]) is first
    assert hoisted.kernel_mask(None) is None
    per_step = SuffixContext(model, state, pad, None, None, hoist=False)
    a, b = per_step.kernel_mask(per_step.mask_rope()[0]), per_step.kernel_mask(per_step.mask_rope()[0])
    assert a is not b and torch.equal(a, b) and torch.equal(a.bool(), mask)


def test_a_left_padded_prompt_is_refused_where_trimming_would_drop_its_tokens(tiny_model, tiny_workload, tiny_inputs):
    """trim_prompt_padding keeps the first tokens; a prompt padded on the left (its mask read from the device)
    silently lost its own tokens, 0.84 off the reference's actions. It is now a ValueError naming the mask."""
    obs, noise = tiny_inputs
    left = dataclasses.replace(obs, tokens=obs.tokens.flip(1), token_mask=obs.token_mask.flip(1), host_prompt_len=None)
    with pytest.raises(ValueError, match="obs.token_mask: sample 0 has padding before a valid token"):
        Engine(tiny_model, "trim_prompt_padding").sample_actions(left, noise, tiny_workload.steps)
    # without the trim every slot is kept, so the engine agrees with the reference on any mask
    out = Engine(tiny_model, "for_loop,sdpa").sample_actions(left, noise, tiny_workload.steps)
    assert rel_l2(out, tiny_model.sample_actions(left, noise, tiny_workload.steps)) < FP32_TOL
    # right padding read from the device (no host metadata): trimmed, and the reference's actions
    right = dataclasses.replace(obs, host_prompt_len=None)
    out = Engine(tiny_model, "trim_prompt_padding").sample_actions(right, noise, tiny_workload.steps)
    assert rel_l2(out, tiny_model.sample_actions(obs, noise, tiny_workload.steps)) < FP32_TOL


def test_another_engines_release_is_named_where_this_engine_reads_the_released_weights(tiny_workload, tiny_inputs):
    """Two engines on one model, one releases: an engine that reads the freed q/k/v from the model says so at its
    next call (it was 'mat2 must be a matrix, got 1-D tensor' from inside a layer); one with its own fused copies,
    built before the release, runs on with the reference's actions."""
    obs, noise = tiny_inputs
    steps = tiny_workload.steps
    model = build_model("tiny", seed=0)
    reference = model.sample_actions(obs, noise, steps)
    releasing, fused, unfused = (Engine(model, s) for s in ("exact", "exact", "for_loop,sdpa"))
    assert releasing.release_reference_weights() > 0
    with pytest.raises(RuntimeError, match="another engine released the model's weights that this engine reads"):
        unfused.sample_actions(obs, noise, steps)
    for engine in (releasing, fused):
        assert rel_l2(engine.sample_actions(obs, noise, steps), reference) < FP32_TOL


def test_an_engine_runs_in_and_out_of_inference_mode_in_any_order(tiny_workload, tiny_inputs):
    """A first call under torch.inference_mode() (LeRobot's eval loops run so) made the static KV cache inference
    tensors, and every later plain call failed writing into them; an engine built under it, too. Each order of
    the two modes now gives the reference's actions. A numpy step count is a step count."""
    import numpy as np

    obs, noise = tiny_inputs
    steps = tiny_workload.steps
    model = build_model("tiny", seed=0)
    reference = model.sample_actions(obs, noise, steps)
    for modes in ((True, False, True), (False, True, False)):
        engine = Engine(model, "exact")
        for inference in modes:
            with torch.inference_mode(inference):
                assert rel_l2(engine.sample_actions(obs, noise, steps), reference) < FP32_TOL
    with torch.inference_mode():
        built_inside = Engine(model, "exact")
    assert rel_l2(built_inside.sample_actions(obs, noise, np.int64(steps)), reference) < FP32_TOL
    with pytest.raises(ValueError, match=r"num_steps: expected an integer in 1\.\.1000, got 0"):
        built_inside.prepare(0)


def test_an_engine_refuses_a_released_model_and_a_model_cast_or_moved_after_it(tiny_workload, tiny_inputs):
    """An engine on a model whose weights were released failed with a size mismatch; a model cast to bfloat16
    after its engine was built failed with a dtype mismatch inside a matmul. Both are now named."""
    obs, noise = tiny_inputs
    model = build_model("tiny", seed=0)
    first = Engine(model, "for_loop,fuse_projections")
    first.release_reference_weights()
    with pytest.raises(RuntimeError, match="this model's reference weights were released"):
        Engine(model, "for_loop")
    assert first.sample_actions(obs, noise, tiny_workload.steps).shape == noise.shape  # the releasing engine runs on
    other = build_model("tiny", seed=0)
    engine = Engine(other, "for_loop,fuse_projections")
    other.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="the model was cast or moved since this engine was built "
                                           r"\(now torch.bfloat16 on cpu, the engine's copies torch.float32 on cpu\)"):
        engine.sample_actions(obs, noise, tiny_workload.steps)
    # a cast that replaces the Parameter objects (torch's opt-in conversion) is seen too
    third = build_model("tiny", seed=0)
    engine = Engine(third, "for_loop")
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        q = third.backbone.layers[0].self_attn.q_proj.weight
        third.half()
        assert third.backbone.layers[0].self_attn.q_proj.weight is not q
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    with pytest.raises(RuntimeError, match=r"\(now torch.float16 on cpu, the engine's copies torch.float32 on cpu\)"):
        engine.sample_actions(obs, noise, tiny_workload.steps)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2), (torch.float16, 3e-2)])
def test_compare_passes_at_its_dtype_s_tolerance_and_fails_just_past_it(dtype, tol):
    """The boundary is inclusive (rel_l2 <= tolerance) and each dtype has the documented tolerance; float16 is
    held to bfloat16's, not float32's."""
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)  # |ref| = 1: rel_l2 is |the error|
    at = compare(ref + torch.tensor([0.0, tol], dtype=torch.float64), ref, dtype)
    assert at["rel_l2"] == tol and at["passed"] and at["tolerance"] == tol
    past = compare(ref + torch.tensor([0.0, 1.2 * tol], dtype=torch.float64), ref, dtype)
    assert past["rel_l2"] == pytest.approx(1.2 * tol) and not past["passed"]


def test_compare_measures_in_float64_and_relative_to_a_small_reference():
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    # an error float32 could not hold next to 1.0 (its epsilon is 1.2e-7) is still measured
    assert compare(ref + 1e-9, ref, torch.float32)["rel_l2"] == pytest.approx(1e-9 * 2**0.5 / 5**0.5, rel=1e-3)
    small = torch.tensor([3e-3, -4e-3])  # |ref| = 5e-3: no floor at 1 under the norm
    assert compare(2 * small, small, torch.float32)["rel_l2"] == pytest.approx(1.0)
    # max_abs is the largest error in absolute value, whichever side of the reference it falls
    below = compare(torch.tensor([3.0, -4.5]), torch.tensor([3.0, -4.0]), torch.float32)
    assert below["max_abs"] == pytest.approx(0.5) and below["rel_l2"] == pytest.approx(0.1)
    # an all-zero reference: matched exactly it passes, any error fails
    zeros = torch.zeros(3)
    assert compare(zeros, zeros, torch.float32)["rel_l2"] == 0.0 and compare(zeros, zeros, torch.float32)["passed"]
    assert not compare(zeros + 1e-6, zeros, torch.float32)["passed"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_compare_never_passes_a_non_finite_side_and_says_which(bad):
    import math

    finite = torch.tensor([1.0, 2.0])
    broken = torch.tensor([1.0, bad])
    for actions, reference in ((broken, finite), (finite, broken)):
        r = compare(actions, reference, torch.bfloat16)
        assert not r["passed"] and math.isnan(r["max_abs"]) and math.isnan(r["rel_l2"])
        assert r["finite"] == (actions is finite) and r["reference_finite"] == (reference is finite)
        assert r["tolerance"] == 3e-2


def test_check_equivalence_runs_the_steps_and_fresh_inputs_of_each_seed(tiny_model, tiny_workload):
    calls = []

    class Recording:
        name = "recording"

        def sample_actions(self, obs, noise, steps):
            calls.append((obs, noise, steps))
            return tiny_model.sample_actions(obs, noise, steps)

    r = check_equivalence(tiny_model, Recording(), tiny_workload, seeds=(0, 1, 2), num_steps=2)
    assert r["passed"] and r["seeds"] == 3 and r["variant"] == "recording"
    assert [steps for *_, steps in calls] == [2, 2, 2] and tiny_workload.steps != 2
    for (obs_a, noise_a, _), (obs_b, noise_b, _) in zip(calls, calls[1:]):  # a new draw for every seed
        assert not torch.equal(obs_a.images, obs_b.images) and not torch.equal(noise_a, noise_b)


def test_check_equivalence_reports_a_non_finite_seed_over_a_merely_wrong_one(tiny_model, tiny_workload):
    class WrongThenNan:
        name, calls = "wrong-then-nan", 0

        def sample_actions(self, obs, noise, steps):
            self.calls += 1
            out = tiny_model.sample_actions(obs, noise, steps)
            # the non-finite seed first: the report must pick it over the merely wrong one after it, not the last
            return torch.full_like(out, float("nan")) if self.calls == 1 else out * 1.5

    r = check_equivalence(tiny_model, WrongThenNan(), tiny_workload)
    assert not r["passed"] and not r["finite"] and r["reference_finite"] and r["rel_l2"] != r["rel_l2"]


def test_check_equivalence_refuses_a_variant_of_another_shape(tiny_model, tiny_workload):
    class Short:
        name = "short"

        def sample_actions(self, obs, noise, steps):
            return tiny_model.sample_actions(obs, noise, steps)[:, :-1]

    with pytest.raises(AssertionError, match="variant short returned shape"):
        check_equivalence(tiny_model, Short(), tiny_workload, seeds=(0,))


def test_check_equivalence_holds_a_bf16_model_to_the_bf16_tolerance(tiny_workload):
    model = build_model(get_config("tiny"), "cpu", torch.bfloat16, seed=0)

    class OnePercentOff:
        name = "one-percent"

        def sample_actions(self, obs, noise, steps):
            return (model.sample_actions(obs, noise, steps).double() * 1.01).to(torch.bfloat16)

    r = check_equivalence(model, OnePercentOff(), tiny_workload, seeds=(0,))
    assert r["dtype"] == "bfloat16" and r["tolerance"] == 3e-2
    assert 1e-3 < r["rel_l2"] < 3e-2 and r["passed"]  # float32's 1e-4 would fail it


def test_each_lever_with_what_requires_names_passes_and_without_any_of_it_is_refused_naming_both():
    """`vlaperf check` checks a lever alone as REQUIRES[lever] + lever: that must be enough, and each item of it
    needed (dropping it is a LeverError that names the lever and what it needs). Checked for a CUDA device, as the
    levers are only applicable there."""
    from vlaperf.engine.levers import REQUIRES

    assert set(REQUIRES) == {"cuda_graph", "compile_layers", "triton_kernels", "megakernel"}
    for lever, needs in REQUIRES.items():
        assert needs, lever
        Levers.parse(",".join(needs + (lever,))).check("cuda")
        for needed in needs:
            spec = ",".join([n for n in needs if n != needed] + [lever])
            with pytest.raises(LeverError, match=f"^{lever} needs {needed}"):
                Levers.parse(spec).check("cuda")


def test_presets_hold_their_levers(monkeypatch):
    import vlaperf.engine.levers as levers_mod

    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: [])
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 8)
    exact = Levers.parse("exact", "cuda")
    assert set(exact.names()) == {"for_loop", "skip_masked_images", "trim_prompt_padding", "static_kv_cache", "sdpa",
                                  "fuse_projections"}
    assert Levers.parse("exact", "cuda") == Levers.parse("exact", "cpu") == Levers.parse("best", "cpu")
    assert set(Levers.parse("graph", "cuda").names()) == set(exact.names()) | {"cuda_graph"}
    assert set(Levers.parse("best", "cuda").names()) == set(exact.names()) | {"cuda_graph", "compile=default",
                                                                              "compile_layers"}
    # without a working compile (e.g. no C compiler), best on a GPU is graph
    monkeypatch.setattr("vlaperf.engine.compile.compile_blockers", lambda *a: ["no C compiler"])
    assert Levers.parse("best", "cuda") == Levers.parse("graph", "cuda")
    # the Hopper-tuned kernels never join best on a CPU, whatever capability is reported
    monkeypatch.setattr(levers_mod, "_capability_major", lambda device: 9)
    assert Levers.parse("best", "cpu") == exact
    assert Levers.parse("reference") == Levers.parse("none") == Levers.parse("") == Levers()
    assert Levers().label() == "reference" and Levers.parse("for_loop,sdpa").label() == "for_loop+sdpa"


def test_lever_refusals_name_the_lever_and_what_was_expected(monkeypatch):
    from vlaperf.engine.levers import unknown_lever

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert unknown_lever("best,for_loop") == "best" and unknown_lever("none,sdpa") == "none"  # a preset in a list
    with pytest.raises(LeverError, match="'best' is a preset: give it alone"):
        Levers.parse("best,for_loop")
    with pytest.raises(LeverError, match=r"holds several variants \(';'\)"):
        Levers.parse("for_loop;sdpa")
    with pytest.raises(LeverError, match="'compile=': no compile mode after '='"):
        Levers.parse("compile=")
    assert Levers.parse("compile").compile == "default"
    with pytest.raises(LeverError, match="lever 'for_loop' takes no value, got 'for_loop=1'"):
        Levers.parse("for_loop=1")
    with pytest.raises(LeverError, match="expected a comma-separated string"):
        Levers.parse(["for_loop", 3])
    assert Levers.parse([" for_loop ", "sdpa"]) == Levers(for_loop=True, sdpa=True)
    with pytest.raises(LeverError, match="cuda_graph and compile=max-autotune both capture CUDA graphs"):
        Levers.parse("for_loop,cuda_graph,compile=max-autotune").check("cuda")
    Levers.parse("for_loop,cuda_graph,compile=max-autotune-no-cudagraphs").check("cuda")
    with pytest.raises(LeverError, match="compile=max-autotune uses CUDA graphs and needs a CUDA device"):
        Levers.parse("compile=max-autotune").check("cpu")
    with pytest.raises(LeverError, match="megakernel needs a CUDA device"):
        Levers.parse("fuse_projections,static_kv_cache,megakernel").check("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton's CPU interpreter stands in for the device in tests
    Levers.parse("fuse_projections,static_kv_cache,megakernel,triton_kernels").check("cpu")


def test_a_lever_given_twice_with_two_values_is_refused():
    """'compile=default,compile=max-autotune' kept the last mode silently; the same lever twice with one value is
    still one lever."""
    with pytest.raises(LeverError, match=r"compile given twice with different values: 'compile=default' and "
                                         r"'compile=max-autotune'; give one"):
        Levers.parse("for_loop,compile=default,cuda_graph,compile=max-autotune")
    with pytest.raises(LeverError, match=r"megakernel given twice with different values: 'megakernel' and "
                                         r"'megakernel=batched'"):
        Levers.parse("for_loop,megakernel,megakernel=batched")
    assert Levers.parse("for_loop,compile,compile=default").compile == "default"  # the same mode twice
    assert Levers.parse("for_loop,sdpa,sdpa") == Levers.parse("for_loop,sdpa")


def test_capability_major_is_the_major_of_the_device_s_capability(monkeypatch):
    import vlaperf.engine.levers as levers_mod

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))  # e.g. an RTX 4090
    assert levers_mod._capability_major("cuda") == 8
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: 1 / 0)
    assert levers_mod._capability_major("cuda") is None


# ---- audited by mutation (engine CPU paths): what the equivalence tests above cannot see


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_paths_compute_the_per_head_formula_for_shared_and_grouped_kv_heads(kv_heads, monkeypatch):
    """Eager, folded (one K/V head) and SDPA attention against softmax(q k^T / sqrt(h)) v written out per head, in
    float64, with a mask. Query head n reads K/V head n // (N / K) (grouped-query attention, as repeat_interleave
    groups them). The tiny model has one K/V head and few rows, so its calls never reach SDPA with a mask or with
    grouped heads; FOLDED_MQA_MAX_ROWS = 0 sends the one-head case through SDPA too."""
    from vlaperf.engine import attention as A
    from vlaperf.models.pi0 import eager_attention

    B, N, Tq, Tk, h = 2, 4, 3, 5, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, T, h, generator=gen) for n, T in ((N, Tq), (kv_heads, Tk), (kv_heads, Tk)))
    mask = torch.rand(B, Tq, Tk, generator=gen) > 0.4
    mask[..., 0] = True  # every row sees a key
    want = torch.empty(B, N, Tq, h, dtype=torch.float64)
    for n in range(N):
        kv = n // (N // kv_heads)
        scores = q[:, n].double() @ k[:, kv].double().transpose(1, 2) / h**0.5
        want[:, n] = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v[:, kv].double()
    paths = {"eager": A.attention(q, k, v, mask, use_sdpa=False), "sdpa": A.attention(q, k, v, mask, use_sdpa=True),
             "reference": eager_attention(q, k, v, mask)}
    monkeypatch.setattr(A, "FOLDED_MQA_MAX_ROWS", 0)
    paths["sdpa, no folding"] = A.attention(q, k, v, mask, use_sdpa=True)
    for name, out in paths.items():
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5, msg=name)


def test_prefix_mask_lets_valid_tokens_see_valid_tokens_and_a_padded_row_only_itself():
    """Bidirectional among valid tokens; a padded query row attends to itself alone (a fully masked row is NaN in
    fused kernels, and NaN keys/values would poison the next layer), and no valid row sees a padded key."""
    from vlaperf.engine.attention import prefix_mask

    pad = torch.tensor([[True, True, False, True, False]])
    mask = prefix_mask(pad)[0]
    for i in range(5):
        for j in range(5):
            assert mask[i, j].item() == ((pad[0, i] and pad[0, j]) or (i == j and not pad[0, i])), (i, j)


def test_suffix_mask_state_token_sees_only_itself_within_the_suffix():
    """Every suffix token sees the valid prefix keys; within the suffix pi0's state token (index 0) sees only itself
    and the actions see everything, pi0.5's actions (no state token) each other."""
    from vlaperf.engine.attention import suffix_mask

    pad = torch.tensor([[True, False, True]])
    pi0, pi05 = suffix_mask(pad, 4, pi05=False)[0], suffix_mask(pad, 3, pi05=True)[0]
    assert pi0.shape == (4, 7) and pi05.shape == (3, 6)
    assert pi0[:, :3].tolist() == [[True, False, True]] * 4 and pi05[:, :3].tolist() == [[True, False, True]] * 3
    assert pi0[0, 3:].tolist() == [True, False, False, False] and pi0[1:, 3:].all()
    assert pi05[:, 3:].all()


def test_schedule_is_the_times_the_reference_visits_bit_for_bit(monkeypatch):
    """The engine's time tables are built on `schedule(n)`: the times the reference's `while` visits, 1.0 plus the
    float32 dt accumulated in float32. For 7 steps a float64 sum, or 1 - i/n, differs in the last bits; the
    reference's loop ends at t = -dt/2 because the accumulated time is not exactly 0 (after 7 steps it is +3e-8,
    so `while t > 0` would take an eighth step; after 4 it is 0, so `while t >= 0` would take a fifth)."""
    from vlaperf.engine.fusion import schedule

    model = build_model("tiny", "cpu", torch.float32, seed=0)
    w = get_workload("tiny")
    obs, noise = random_observation(w, model.config, seed=0), random_noise(w, model.config, seed=0)
    seen, real = [], model.denoise_step
    monkeypatch.setattr(model, "denoise_step", lambda state, pad, cache, x_t, t: seen.append(t[0].item()) or
                        real(state, pad, cache, x_t, t))
    for steps in (4, 7):
        seen.clear()
        model.sample_actions(obs, noise, steps)
        assert len(seen) == steps and schedule(steps) == seen, steps


def test_plan_counts_a_device_read_only_for_the_mask_it_had_to_read(tiny_inputs):
    """read_device_masks says the plan synced: for the image mask when skip_masked_images has no host flags, for
    the prompt mask when trim_prompt_padding has no host length, and never for a lever that is off."""
    from vlaperf.engine.prefix import PrefixPlan, plan_prefix

    obs, _ = tiny_inputs
    no_images = dataclasses.replace(obs, host_image_valid=None)
    no_prompt = dataclasses.replace(obs, host_prompt_len=None)
    assert plan_prefix(no_images, True, True).read_device_masks
    assert not plan_prefix(no_images, False, True).read_device_masks
    assert plan_prefix(no_prompt, False, True).read_device_masks
    assert not plan_prefix(no_prompt, True, False).read_device_masks
    assert plan_prefix(obs, False, False) == plan_prefix(no_images, False, False)  # all slots, all tokens, no read
    assert plan_prefix(obs, False, False) == PrefixPlan(tuple(range(obs.images.shape[1])), obs.tokens.shape[1], False)


def test_a_left_padded_prompt_is_named_by_its_sample_in_a_batch(tiny_model, tiny_workload):
    """The refusal names the sample whose prompt is padded on the left, here the second of two (the first is
    padded on the right, as it should be)."""
    w = dataclasses.replace(tiny_workload.with_overrides(batch=2), prompt_valid=(4, 6))
    obs, noise = random_observation(w, tiny_model.config, seed=1), random_noise(w, tiny_model.config, seed=1)
    tokens, token_mask = obs.tokens.clone(), obs.token_mask.clone()
    tokens[1], token_mask[1] = tokens[1].flip(0), token_mask[1].flip(0)
    left = dataclasses.replace(obs, tokens=tokens, token_mask=token_mask, host_prompt_len=None)
    with pytest.raises(ValueError, match="obs.token_mask: sample 1 has padding before a valid token"):
        Engine(tiny_model, "for_loop,trim_prompt_padding").sample_actions(left, noise, 2)


def test_skipped_middle_slot_keeps_the_slots_on_either_side(tiny_model, tiny_workload):
    """A masked camera between two valid ones: the plan keeps slots 0 and 2 (not a contiguous run) and the
    actions are the reference's."""
    w = dataclasses.replace(tiny_workload, image_valid=(True, False, True))
    obs, noise = random_observation(w, tiny_model.config, seed=4), random_noise(w, tiny_model.config, seed=4)
    engine = Engine(tiny_model, "for_loop,skip_masked_images,static_kv_cache")
    out = engine.sample_actions(obs, noise, 2)
    assert engine.last_plan.slots == (0, 2)
    assert rel_l2(out, tiny_model.sample_actions(obs, noise, 2)) < FP32_TOL


def test_engine_draws_its_own_noise_as_the_reference_does(tiny_model, tiny_inputs):
    """Without noise both paths draw (B, H, A) standard normal noise from torch's generator: with the same seed
    they give the same actions, and a new draw gives other actions."""
    obs, _ = tiny_inputs
    engine = Engine(tiny_model, "for_loop,static_kv_cache")
    torch.manual_seed(11)
    ref = tiny_model.sample_actions(obs, num_steps=2)
    torch.manual_seed(11)
    out = engine.sample_actions(obs, num_steps=2)
    assert rel_l2(out, ref) < FP32_TOL
    assert (engine.sample_actions(obs, num_steps=2) - out).abs().max() > 0.1


def test_static_cache_buffers_and_schedule_tables_are_made_once_and_reused(tiny_model, tiny_inputs, monkeypatch):
    """static_kv_cache: one set of engine-owned buffers per shape, the same tensors at every call (a CUDA graph
    reads them by address), none without the lever; the schedule's tables too, built once per step count."""
    import vlaperf.engine.engine as E

    obs, noise = tiny_inputs
    seen = []
    real = E.SuffixContext
    monkeypatch.setattr(E, "SuffixContext", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    engine = Engine(tiny_model, "for_loop,static_kv_cache,fuse_projections")
    engine.prepare(2)
    times, tables = engine._schedule_tensors(2)
    for _ in range(2):
        engine.sample_actions(obs, noise, 2)
    assert len(seen) == 2 and seen[0] is not None and seen[1] is seen[0] and len(engine._kv) == 1
    again = engine._schedule_tensors(2)
    assert again[0] is times and again[1] is tables
    plain = Engine(tiny_model, "for_loop,fuse_projections")
    plain.sample_actions(obs, noise, 2)
    assert seen[-1] is None and not plain._kv


def test_static_kv_cache_embeds_pi0_s_state_once_a_call():
    """The state token does not change between steps: with static_kv_cache (and the tabulated suffix of
    fuse_projections) the state projection runs once a call; without the lever once a step, as the reference's
    embed_suffix runs it, and not twice."""
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(get_workload("tiny"), model.config, seed=3), random_noise(get_workload("tiny"),
                                                                                              model.config, seed=3)
    calls = []
    model.state_proj.register_forward_hook(lambda *a: calls.append(1))
    for levers, per_call in (("for_loop,static_kv_cache,fuse_projections", 1), ("for_loop,fuse_projections", 5),
                             ("for_loop", 5)):
        calls.clear()
        Engine(model, levers).sample_actions(obs, noise, 5)
        assert len(calls) == per_call, levers


def test_stage_hook_marks_the_reference_loop_steps(tiny_model, tiny_inputs):
    """Without for_loop the engine keeps the reference's `while`: it still marks each step, numbered."""
    obs, noise = tiny_inputs
    engine = Engine(tiny_model, "sdpa")
    seen = []
    engine.stage_hook = seen.append
    engine.sample_actions(obs, noise, 3)
    assert seen == ["embed_prefix", "prefill", "denoise_step_0", "denoise_step_1", "denoise_step_2", "end"]


def test_stage_hook_of_a_compiled_prefix_marks_it_as_one_stage_without_recompiling():
    """With compile the prefix is one compiled function: the hook sees "prefix" (its inner marks never run inside
    the trace), and setting the hook after the first call does not recompile (the trace neither calls the hook nor
    guards on it)."""
    import torch._dynamo

    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(get_workload("tiny"), model.config, seed=3), random_noise(get_workload("tiny"),
                                                                                              model.config, seed=3)
    torch._dynamo.reset()
    engine = Engine(model, "for_loop,sdpa,compile", compile_backend="eager")
    engine.sample_actions(obs, noise, 2)
    seen = []
    engine.stage_hook = seen.append
    with torch._dynamo.config.patch(error_on_recompile=True):
        engine.sample_actions(obs, noise, 2)
    assert seen == ["prefix", "denoise_step_0", "denoise_step_1", "end"]


def test_sample_inputs_of_another_batch_or_device_are_named_errors_on_both_paths(tiny_model, tiny_inputs):
    """The batch is the state's: images, masks and tokens of another batch size, a state that is no (B, dim)
    matrix, integer noise and tensors on another device (meta here, the CPU's stand-in for a GPU) are each refused
    naming the field, before any layer runs."""
    from vlaperf.models.pi0 import check_num_steps

    obs, noise = tiny_inputs
    two = lambda t: torch.cat([t, t])  # noqa: E731
    bad_obs = [
        (dict(images=two(obs.images)), r"obs.images: expected a float tensor \(B=1, slots, 3, 56, 56\)"),
        (dict(image_mask=two(obs.image_mask)), r"obs.image_mask: expected a bool tensor \(1, 3\)"),
        (dict(image_mask=obs.image_mask[:, :2]), r"obs.image_mask: expected a bool tensor \(1, 3\)"),
        (dict(tokens=two(obs.tokens), token_mask=two(obs.token_mask)), r"obs.tokens: expected an int32 or int64 "
                                                                        r"tensor \(B=1, L\)"),
        (dict(tokens=obs.tokens[0], token_mask=obs.token_mask[0]), "obs.tokens: expected an int32 or int64"),
        (dict(state=obs.state[0]), r"obs.state: expected a float tensor \(B, "),
        (dict(state=obs.state.to("meta")), "obs.state: on meta, the model is on cpu"),
        (dict(images=obs.images.to("meta")), "obs.images: on meta, the model is on cpu"),
    ]
    engine = Engine(tiny_model, "for_loop")
    for sample in (tiny_model.sample_actions, engine.sample_actions):
        for change, message in bad_obs:
            with pytest.raises(ValueError, match=message):
                sample(dataclasses.replace(obs, **change), noise, 2)
        for bad_noise in (noise.long(), noise.to("meta")):
            with pytest.raises(ValueError, match=r"noise: expected a float tensor \(1, 10, 8\) on cpu, got "):
                sample(obs, bad_noise, 2)
        with pytest.raises(TypeError, match=r"noise: expected a float tensor \(1, 10, 8\) on cpu, got ndarray"):
            sample(obs, noise.numpy(), 2)  # not a tensor at all: a TypeError, as the README says of every field
    assert check_num_steps(1000) == 1000 and check_num_steps(1) == 1  # both ends of 1..1000 are taken


# ---- fusion.py and prefix.py audited by mutation: the bf16 paths and the step kernel's weight stack (CPU)


@pytest.mark.parametrize("heads", ["openpi", "bf16"])
def test_fused_weights_of_a_bf16_model_stay_bf16_and_its_engine_matches_the_reference(tiny_model, tiny_workload, heads):
    """Every other equivalence test is float32, where a fold that forgets to round back to the model's dtype, or a
    time table left in float32, is the same number. In bf16: the folded q/k/v and gate/up are (W * (1 + w)) computed
    in float32 and rounded once to bf16, and the engine's actions are the reference's within bf16's tolerance, with
    openpi's dtypes (heads and patch conv float32) and with the whole model cast to bf16 (heads bf16 too)."""
    from vlaperf.engine.fusion import build_weights
    from vlaperf.models.pi0 import AdaptiveRMSNorm

    model = build_model(tiny_model.config, "cpu", torch.bfloat16, seed=0)
    if heads == "bf16":
        model = model.to(torch.bfloat16)
    assert (model.head_dtype == torch.bfloat16) == (heads == "bf16")
    ew = build_weights(model, fuse=True)
    for layer, lw in zip(model.backbone.layers + model.expert.layers, ew.backbone + ew.expert):
        a, m = layer.self_attn, layer.mlp
        assert lw.qkv.dtype == lw.gate_up.dtype == torch.bfloat16
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight])
        if isinstance(layer.input_layernorm, AdaptiveRMSNorm):  # pi0.5's expert: adaptive norms, nothing folded
            assert torch.equal(lw.qkv, qkv) and torch.equal(lw.gate_up, gate_up)
        else:
            scale = lambda norm: 1 + norm.weight.float()  # noqa: E731
            assert torch.equal(lw.qkv, (qkv.float() * scale(layer.input_layernorm)).to(torch.bfloat16))
            assert torch.equal(lw.gate_up, (gate_up.float() * scale(layer.post_attention_layernorm)).to(torch.bfloat16))
    obs, noise = (f(tiny_workload, model.config, seed=3) for f in (random_observation, random_noise))
    ref = model.sample_actions(obs, noise, tiny_workload.steps)
    for levers in (ALL_PLAIN, "for_loop,static_kv_cache,fuse_projections"):
        r = compare(Engine(model, levers).sample_actions(obs, noise, tiny_workload.steps), ref, torch.bfloat16)
        assert r["passed"], (levers, r)


def test_expert_stack_holds_each_layer_s_fused_weights_once_and_only_where_the_step_kernel_applies(tiny_model):
    """stack_expert (the megakernel's weights, built on any device): (L, ...) stacks of the fused expert weights
    whose rows every layer's weights are views of, flagged adaptive for pi0.5; None for unfused weights and for more
    than one K/V head, which the step kernel does not handle."""
    from vlaperf.engine.fusion import build_weights, stack_expert

    assert stack_expert(build_weights(tiny_model, fuse=False)) is None
    ew = build_weights(tiny_model, fuse=True)
    want = {n: [getattr(lw, n).clone() for lw in ew.expert] for n in ("qkv", "o", "gate_up", "down")}
    stack = stack_expert(ew)
    assert stack.adaptive == tiny_model.config.pi05
    for n, layers in want.items():
        assert getattr(stack, n).shape == (len(layers), *layers[0].shape), n
        for i, lw in enumerate(ew.expert):
            held = getattr(lw, n)
            assert torch.equal(held, layers[i]) and held.data_ptr() == getattr(stack, n)[i].data_ptr(), (n, i)
    cfg = tiny_model.config
    gqa = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, num_kv_heads=2),
                              expert=dataclasses.replace(cfg.expert, num_kv_heads=2))
    assert stack_expert(build_weights(build_model(gqa, "cpu", torch.float32, seed=0), fuse=True)) is None


def test_a_non_finite_call_leaves_no_trace_in_the_static_cache_of_a_shorter_prefix(tiny_model):
    """Two prompt buckets whose prefixes round up to the same static-cache length (12 prompt slots: buckets 8
    and 12, 40 + 11 and 44 + 11 keys -> 56) get buffers of their own: shared, the longer call's suffix keys stayed
    in the shorter one's alignment padding, masked, but a NaN there (one NaN in that call's noise) made every later
    call of the shorter prompt NaN (a zero probability times NaN)."""
    cfg = dataclasses.replace(tiny_model.config, max_token_len=12)
    w = dataclasses.replace(get_workload("tiny"), prompt_slots=12)
    long_obs = random_observation(dataclasses.replace(w, prompt_valid=(11,)), cfg, seed=1)
    short_obs = random_observation(dataclasses.replace(w, prompt_valid=(3,)), cfg, seed=2)
    noise = random_noise(w, cfg, seed=1)
    engine = Engine(tiny_model, "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa")
    poisoned = noise.clone()
    poisoned[0, 0, 0] = float("nan")
    assert not torch.isfinite(engine.sample_actions(long_obs, poisoned, 2)).all()  # NaN in, NaN out: that call only
    assert engine.last_plan.prompt_len == 12
    out = engine.sample_actions(short_obs, noise, 2)
    assert engine.last_plan.prompt_len == 8
    assert rel_l2(out, tiny_model.sample_actions(short_obs, noise, 2)) < FP32_TOL
    assert len(engine._kv) == 2 and len({shape[3] for shape, _ in engine._kv}) == 1  # one cache length, two sets


def test_a_state_of_another_batch_than_every_other_field_is_named_as_the_odd_one(tiny_model, tiny_inputs):
    """The batch is the state's, so a state of batch 1 beside images, masks and tokens of batch 2 was reported as
    "obs.images: expected ... (B=1, ...)": the one field that was right blamed, the wrong one unnamed."""
    obs, noise = tiny_inputs
    two = dataclasses.replace(obs, **{f: torch.cat([getattr(obs, f)] * 2) for f in ("images", "image_mask", "tokens",
                                                                                     "token_mask")})
    engine = Engine(tiny_model, "for_loop")
    for sample in (tiny_model.sample_actions, engine.sample_actions):
        with pytest.raises(ValueError, match=r"obs.state: a batch of 1, the other fields' is 2 \(images, masks"):
            sample(two, noise, 2)


def test_a_lever_set_built_directly_is_checked_as_a_parsed_one(tiny_model):
    """Levers(compile='bogus') given to an Engine is a LeverError naming the modes, as '--levers compile=bogus' is,
    not torch.compile's own error from inside the build."""
    with pytest.raises(LeverError, match="compile mode must be one of default, .*, got 'bogus'"):
        Engine(tiny_model, Levers(for_loop=True, compile="bogus"))
