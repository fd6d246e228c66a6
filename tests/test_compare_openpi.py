"""vlaperf.compare.openpi against a stand-in for openpi's PI0Pytorch (openpi is not installable
here). The stand-in has openpi's interface: `state_dict()` with openpi's names (vlaperf's, one
to one), `config` like openpi's Pi0Config, and `sample_actions(device, observation, noise=,
num_steps=)` reading exactly the observation attributes openpi's preprocessing reads. Its
weights differ from anything vlaperf would build, so agreement proves the weights were copied."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from vlaperf.checkpoints import EMBED, LM_HEAD, CheckpointError
from vlaperf.compare import (OpenpiObservation, action_metrics, comparison_engine, from_openpi_observation,
                             to_openpi_observation)
from vlaperf.compare.openpi import _workload_for, compare_openpi, openpi_config, vlaperf_from_openpi
from vlaperf.inputs import IMAGE_SLOTS, random_observation
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.workloads import get_workload

OPENPI_READS = ("images", "image_masks", "state", "tokenized_prompt", "tokenized_prompt_mask", "token_ar_mask", "token_loss_mask")


class FakePI0Pytorch:
    """openpi's PI0Pytorch interface around a vlaperf model with its own (seed 7) weights."""

    def __init__(self, cfg, dtype=torch.float32, seed=7):
        self._model = build_model(cfg, "cpu", dtype, seed=seed)
        self.config = SimpleNamespace(pi05=cfg.pi05, action_dim=cfg.action_dim, action_horizon=cfg.action_horizon,
                                      max_token_len=cfg.max_token_len, paligemma_variant="gemma_2b",
                                      action_expert_variant="gemma_300m")
        self.calls = []

    def state_dict(self):
        return self._model.state_dict()

    def sample_actions(self, device, observation, noise=None, num_steps=10):
        seen = {name: getattr(observation, name) for name in OPENPI_READS}  # AttributeError if one is missing
        assert set(seen["images"]) >= set(IMAGE_SLOTS)
        B = seen["state"].shape[0]
        for key in IMAGE_SLOTS:
            img, mask = seen["images"][key], seen["image_masks"][key]
            assert img.shape[:2] == (B, 3) and img.dtype == torch.float32 and -1 <= img.min() and img.max() <= 1
            assert mask.shape == (B,) and mask.dtype == torch.bool
        assert seen["tokenized_prompt"].dtype == torch.int64 and seen["tokenized_prompt_mask"].dtype == torch.bool
        assert seen["token_ar_mask"] is None and seen["token_loss_mask"] is None
        self.calls.append({"device": device, "num_steps": num_steps, "noise": noise})
        return self._model.sample_actions(from_openpi_observation(observation), noise, num_steps)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_compare_against_fake_openpi_is_exact(pi05):
    cfg = get_config("tiny", pi05=pi05)
    theirs = FakePI0Pytorch(cfg)
    out = compare_openpi(theirs, "tiny", config=cfg, seed=5)
    ref, best = out["equivalence"]["reference"], out["equivalence"]["best"]
    assert ref["max_abs"] == 0.0 and ref["passed"]  # same weights, same computation: bit-exact
    assert best["rel_l2"] < 1e-4 and best["passed"] and out["passed"]
    assert len(ref["per_dim"]["rel_l2"]) == cfg.action_dim and out["levers"]["spec"] == "best"
    (call,) = theirs.calls
    assert call["num_steps"] == 4 and call["device"] == torch.device("cpu") and call["noise"].shape == (1, 10, 8)
    assert out["actions"]["openpi"].shape == (1, 10, 8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=-1), r"steps: expected an integer in 1\.\.1000, got -1"),  # openpi's `while` would never end
    (dict(steps=0), r"steps: expected an integer in 1\.\.1000, got 0"),  # was the workload's 4, silently
    (dict(levers="bogus"), "unknown lever 'bogus'"),
])
def test_bad_arguments_are_refused_before_openpis_model_runs(kwargs, message):
    cfg = get_config("tiny")
    theirs = FakePI0Pytorch(cfg)
    with pytest.raises(ValueError, match=message):
        compare_openpi(theirs, "tiny", config=cfg, **kwargs)
    assert theirs.calls == []  # the peer's call (minutes where it compiles) never started


def test_weights_are_copied_not_rebuilt():
    cfg = get_config("tiny")
    theirs = FakePI0Pytorch(cfg, seed=11)
    ours = vlaperf_from_openpi(theirs, cfg)
    a, b = theirs.state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.paligemma_with_expert.paligemma.lm_head.weight is ours.backbone.embed_tokens.weight  # tie kept


def test_bf16_openpi_model_gives_a_bf16_vlaperf_model():
    cfg = get_config("tiny")
    theirs = FakePI0Pytorch(cfg, dtype=torch.bfloat16)
    out = compare_openpi(theirs, "tiny", config=cfg, levers=None)
    assert out["dtype"] == "bfloat16" and out["equivalence"]["reference"]["max_abs"] == 0.0
    assert set(out["equivalence"]) == {"reference"} and out["levers"] is None


def test_mismatched_openpi_model_names_the_keys():
    theirs = FakePI0Pytorch(get_config("tiny", pi05=True))
    with pytest.raises(CheckpointError, match=r"(?s)openpi.s state dict does not match.*missing tensor action_time_mlp_in.weight \(model expects shape \[32, 64\]\)"):
        compare_openpi(theirs, "tiny", config=get_config("tiny"))


def test_not_a_pi0_model():
    with pytest.raises(CheckpointError, match="is it a PI0Pytorch"):
        vlaperf_from_openpi(SimpleNamespace(state_dict=lambda: {"w": torch.ones(1)}), get_config("tiny"))


def test_openpi_config_mapping():
    c = SimpleNamespace(pi05=True, action_dim=32, action_horizon=15, max_token_len=200,
                        paligemma_variant="gemma_2b", action_expert_variant="gemma_300m")
    cfg = openpi_config(SimpleNamespace(config=c))
    assert cfg.pi05 and cfg.action_horizon == 15 and cfg.max_token_len == 200 and cfg.backbone.width == 2048
    c.action_expert_variant = "gemma_2b"
    with pytest.raises(ValueError, match="pass config="):
        openpi_config(SimpleNamespace(config=c))
    with pytest.raises(ValueError, match="has no `config`"):
        openpi_config(object())


def test_observation_round_trip(tiny_workload):
    obs = random_observation(tiny_workload, get_config("tiny"), seed=2)
    op = to_openpi_observation(obs)
    assert isinstance(op, OpenpiObservation) and list(op.images) == list(IMAGE_SLOTS)
    back = from_openpi_observation(op)
    for a, b in zip(obs.tensors(), back.tensors()):
        assert torch.equal(a, b)
    del op.image_masks["right_wrist_0_rgb"]  # openpi: an absent mask means a valid image
    assert bool(from_openpi_observation(op).image_mask[:, 2].all())


def test_action_metrics_per_dimension():
    ref = torch.ones(2, 3, 4)
    out = ref.clone()
    out[..., 2] += 0.5
    m = action_metrics(out, ref, torch.float32)
    assert m["worst_dim"] == 2 and m["per_dim"]["max_abs"] == [0.0, 0.0, 0.5, 0.0]
    assert m["per_dim"]["rel_l2"][2] == pytest.approx(0.5) and not m["passed"]
    with pytest.raises(ValueError, match="action shapes differ"):
        action_metrics(out[:, :2], ref, torch.float32)
    nan = out.clone()
    nan[0, 0, 0] = float("nan")
    assert not action_metrics(nan, ref, torch.float32)["passed"]


def test_action_metrics_take_absolute_differences_and_name_a_non_finite_dimension_worst():
    ref = torch.ones(2, 3, 4)
    out = ref.clone()
    out[..., 1] -= 0.25  # below the reference
    out[..., 2] += 0.5
    m = action_metrics(out, ref, torch.float32)
    assert m["per_dim"]["max_abs"] == [0.0, 0.25, 0.5, 0.0] and m["dtype"] == "float32"
    out[1, 2, 3] = float("nan")
    m = action_metrics(out, ref, torch.bfloat16)
    assert m["worst_dim"] == 3 and m["dtype"] == "bfloat16"  # NaN is worse than the 0.5 of dimension 2


def test_reference_only_lever_specs_build_no_engine():
    model = build_model("tiny")
    for spec in (None, "", "reference", "none"):
        assert comparison_engine(model, spec) is None, spec
    assert comparison_engine(model, "for_loop").name == "for_loop"


def test_observation_layout_errors_name_what_is_wrong(tiny_workload):
    obs = random_observation(tiny_workload, get_config("tiny"), seed=2)
    two = dataclasses.replace(obs, images=obs.images[:, :2], image_mask=obs.image_mask[:, :2])
    with pytest.raises(ValueError) as e:
        to_openpi_observation(two)
    assert str(e.value) == f"openpi expects 3 image slots {IMAGE_SLOTS}, the observation has 2"
    op = to_openpi_observation(obs)
    del op.images["left_wrist_0_rgb"]
    with pytest.raises(ValueError, match=r"images dict missing keys \['left_wrist_0_rgb'\]: expected"):
        from_openpi_observation(op)


def test_openpi_config_defaults_and_variants():
    # openpi's Pi0Config without the variant fields, pi05 or a horizon: the full pi0 variants, pi0, the preset's horizon
    cfg = openpi_config(SimpleNamespace(config=SimpleNamespace(action_dim=14, action_horizon=None, max_token_len=64)))
    assert cfg == get_config("pi0", action_dim=14, max_token_len=64)
    c = SimpleNamespace(pi05=True, action_dim=32, action_horizon=10, max_token_len=200, paligemma_variant="gemma_300m",
                        action_expert_variant="gemma_300m")
    with pytest.raises(ValueError, match=r"uses variants \('gemma_300m', 'gemma_300m'\)"):
        openpi_config(SimpleNamespace(config=c))


def test_vlaperf_from_openpi_takes_the_embedding_and_the_given_dtype():
    cfg = get_config("tiny")
    state = dict(FakePI0Pytorch(cfg).state_dict())
    state[LM_HEAD] = torch.zeros_like(state[LM_HEAD])  # an untied head: the embedding is what inference reads
    ours = vlaperf_from_openpi(SimpleNamespace(state_dict=lambda: state), cfg, dtype=torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours.backbone.embed_tokens.weight, state[EMBED].bfloat16())
    assert not any(p.requires_grad for p in ours.parameters())
    meta = vlaperf_from_openpi(SimpleNamespace(state_dict=lambda: state), cfg, device="meta")
    assert meta.action_in_proj.weight.is_meta and meta.dtype == torch.float32  # dtype still openpi's


def test_workload_shapes_come_from_the_model():
    wl = _workload_for(None, get_config("tiny", pi05=True))
    assert (wl.id, wl.horizon, wl.action_dim) == ("libero-pi05", 10, 8)
    wl = _workload_for("libero-pi0", get_config("tiny", action_horizon=7))
    assert (wl.id, wl.horizon, wl.action_dim, wl.prompt_slots) == ("libero-pi0", 7, 8, 48)


def test_compare_openpi_reports_the_run():
    theirs = FakePI0Pytorch(get_config("tiny"))
    out = compare_openpi(theirs, get_workload("tiny"), config="tiny", seed=5, steps=2)
    assert [c["num_steps"] for c in theirs.calls] == [2]
    assert {k: out[k] for k in ("against", "model", "workload", "dtype", "device", "steps", "seed")} == {
        "against": "openpi", "model": "tiny", "workload": "tiny", "dtype": "float32", "device": "cpu", "steps": 2, "seed": 5}
    assert out["levers"] == {"spec": "best", "label": comparison_engine(build_model("tiny"), "best").name}
    assert set(out["actions"]) == {"openpi", "vlaperf_reference", "vlaperf_best"}


class OffsetPI0Pytorch(FakePI0Pytorch):
    """openpi's model, 0.5 off vlaperf's actions."""

    def sample_actions(self, device, observation, noise=None, num_steps=10):
        return super().sample_actions(device, observation, noise, num_steps) + 0.5


def test_a_failing_variant_fails_the_comparison(monkeypatch):
    from vlaperf.compare import openpi

    cfg = get_config("tiny")
    out = compare_openpi(OffsetPI0Pytorch(cfg), "tiny", config=cfg, levers=None)
    assert not out["passed"] and torch.equal(out["actions"]["openpi"], out["actions"]["vlaperf_reference"] + 0.5)

    engine = SimpleNamespace(name="off", sample_actions=lambda obs, noise, steps: torch.ones(1, 10, 8))
    monkeypatch.setattr(openpi, "comparison_engine", lambda model, levers: engine)
    out = compare_openpi(FakePI0Pytorch(cfg), "tiny", config=cfg, levers="off")
    eq = out["equivalence"]
    assert eq["reference"]["passed"] and not eq["off"]["passed"] and not out["passed"]
    assert torch.equal(out["actions"]["vlaperf_off"], torch.ones(1, 10, 8))


# ------------------------------------------------ with openpi's own PyTorch model (where it imports)


def _openpi_pytorch():
    """openpi's PI0Pytorch and its gemma module where openpi imports (its src/ on the path, transformers 4.53.2 with
    openpi's transformers_replace files copied in), else None."""
    try:
        import openpi.models.gemma as gemma
        from openpi.models_pytorch.pi0_pytorch import PI0Pytorch
    except Exception:  # noqa: BLE001 - not importable here, whatever the reason
        return None
    return PI0Pytorch, gemma


needs_openpi = pytest.mark.skipif(_openpi_pytorch() is None, reason="openpi's PyTorch model is not importable here "
                                  "(openpi's src/ on PYTHONPATH, transformers 4.53.2 with its transformers_replace files)")


@needs_openpi
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_openpis_own_pytorch_model_at_a_reduced_size(pi05, dtype, monkeypatch):
    """openpi's PI0Pytorch, built by openpi with transformers' random init, against vlaperf on its weights: openpi's
    Gemma sizes shrunk (its get_config patched; the projector's 2048 output and SigLIP So400m are hard-coded, so the
    backbone keeps width 2048 and the tower its full size), everything else openpi's own."""
    from vlaperf.compare.lerobot import Reduced, matching_config
    from vlaperf.models.pi0 import VisionConfig

    PI0Pytorch, gemma = _openpi_pytorch()
    wl = get_workload("libero-pi05" if pi05 else "libero-pi0")
    cfg = dataclasses.replace(matching_config(wl, Reduced()), name="openpi-reduced", vision=VisionConfig())

    def size(g):
        return SimpleNamespace(width=g.width, depth=g.depth, mlp_dim=g.mlp_dim, num_heads=g.num_heads,
                               num_kv_heads=g.num_kv_heads, head_dim=g.head_dim)

    monkeypatch.setattr(gemma, "get_config", {"gemma_2b": size(cfg.backbone), "gemma_300m": size(cfg.expert)}.get)
    torch.manual_seed(0)
    theirs = PI0Pytorch(SimpleNamespace(pi05=pi05, paligemma_variant="gemma_2b", action_expert_variant="gemma_300m",
                                        dtype=dtype, action_dim=cfg.action_dim, action_horizon=cfg.action_horizon,
                                        max_token_len=cfg.max_token_len, pytorch_compile_mode=None)).eval()
    # the sizes are read from openpi's modules, not its variant names (which say gemma_2b / gemma_300m here)
    assert dataclasses.replace(openpi_config(theirs), name=cfg.name) == cfg
    out = compare_openpi(theirs, wl, steps=3, levers="best")
    assert out["passed"], out["equivalence"]
    if dtype == "float32":
        assert max(m["rel_l2"] for m in out["equivalence"].values()) < 1e-5
