"""The reference pi0 model: shapes, determinism, presets and openpi's parameter layout."""

from pathlib import Path

import pytest
import torch

from vlaperf.models.pi0 import PRESETS, Pi0Model, build_model, get_config, set_openpi_dtypes

DATA = Path(__file__).parent / "data"


def test_reference_sampler_shape_and_determinism(tiny_model, tiny_workload, tiny_inputs):
    obs, noise = tiny_inputs
    a = tiny_model.sample_actions(obs, noise, tiny_workload.steps)
    b = tiny_model.sample_actions(obs, noise, tiny_workload.steps)
    assert a.shape == (1, tiny_workload.horizon, tiny_model.config.action_dim)
    assert a.dtype == torch.float32
    assert torch.equal(a, b), "same observation and noise must give identical actions"
    c = tiny_model.sample_actions(obs, torch.randn_like(noise), tiny_workload.steps)
    assert not torch.allclose(a, c), "different noise must change the actions"
    assert torch.isfinite(a).all()


def test_steps_change_the_result(tiny_model, tiny_inputs):
    obs, noise = tiny_inputs
    assert not torch.allclose(tiny_model.sample_actions(obs, noise, 1), tiny_model.sample_actions(obs, noise, 4))


def test_seed_reproducible_and_never_zero():
    a, b, c = build_model("tiny", seed=1), build_model("tiny", seed=1), build_model("tiny", seed=2)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        assert pa.abs().sum() > 0, f"{name} is all zeros"
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'pi7'"):
        get_config("pi7")


def test_backbone_expert_attention_must_match():
    cfg = get_config("tiny")
    from dataclasses import replace

    with pytest.raises(ValueError, match="share attention"):
        replace(cfg, expert=replace(cfg.expert, num_heads=2))


def _expected(path: Path) -> dict[str, tuple[list[int], str]]:
    out = {}
    for line in path.read_text().splitlines():
        name, rest = line.split(" ", 1)
        shape, dtype = rest.rsplit(" ", 1)
        out[name] = (eval(shape), dtype)  # noqa: S307 - our own data file: "[1024, 32]"
    return out


def _meta_model(preset: str) -> Pi0Model:
    with torch.device("meta"):
        model = Pi0Model(get_config(preset))
    return set_openpi_dtypes(model, torch.bfloat16)


@pytest.mark.parametrize("preset,keys", [("pi0", "openpi_pi0_keys.txt"), ("pi05", "openpi_pi05_keys.txt")])
def test_state_dict_matches_openpi_tensor_for_tensor(preset, keys):
    """Names, shapes and bf16/fp32 placement equal openpi's PI0Pytorch.state_dict() (dumped
    from openpi with transformers 4.53.2 on the meta device: tests/data)."""
    expected = _expected(DATA / keys)
    model = _meta_model(preset)
    ours = {k: (list(v.shape), str(v.dtype).replace("torch.", "")) for k, v in model.state_dict().items()}
    assert set(ours) - set(expected) == set(), "keys openpi does not have"
    assert set(expected) - set(ours) == set(), "openpi keys we lack"
    wrong = {k: (ours[k], expected[k]) for k in expected if ours[k] != expected[k]}
    assert wrong == {}


@pytest.mark.parametrize("preset,count", [("pi0", 3_501_372_176), ("pi05", 3_616_757_520)])
def test_parameter_count_matches_openpi(preset, count):
    """Unique parameters (the tied LM head counted once), as openpi's model.parameters()."""
    model = _meta_model(preset)
    assert sum(p.numel() for p in model.parameters()) == count
    vision = sum(p.numel() for p in model.paligemma_with_expert.paligemma.model.vision_tower.parameters())
    assert 0.40e9 < vision < 0.42e9
    backbone = sum(p.numel() for p in model.backbone.parameters())
    assert 2.45e9 < backbone < 2.55e9  # Gemma 2B with its 257k x 2048 embedding
    expert = sum(p.numel() for p in model.expert.parameters())
    assert 0.30e9 < expert < 0.44e9


def test_shallow6_is_pi0_with_six_layers():
    pi0 = set(_meta_model("pi0").state_dict())
    shallow = set(_meta_model("shallow6").state_dict())
    assert shallow < pi0
    assert all(".layers." not in k or int(k.split(".layers.")[1].split(".")[0]) < 6 or "vision" in k for k in shallow)
    assert any(".layers.5." in k and "gemma_expert" in k for k in shallow)
    assert not any(".layers.6." in k and "gemma_expert" in k for k in shallow)


def test_presets_follow_workloads_file():
    tiny = PRESETS["tiny"]
    assert (tiny.vision.depth, tiny.vision.width, tiny.vision.patch_size, tiny.vision.image_size) == (2, 32, 14, 56)
    assert tiny.vision.num_patches == 16
    assert (tiny.backbone.depth, tiny.backbone.width, tiny.backbone.num_heads, tiny.backbone.num_kv_heads,
            tiny.backbone.head_dim, tiny.backbone.vocab_size) == (2, 64, 4, 1, 16, 1024)
    assert (tiny.expert.depth, tiny.expert.width) == (2, 32)
    pi0 = PRESETS["pi0"]
    assert (pi0.vision.depth, pi0.vision.width, pi0.vision.mlp_dim, pi0.vision.num_heads) == (27, 1152, 4304, 16)
    assert (pi0.backbone.depth, pi0.backbone.width, pi0.backbone.mlp_dim) == (18, 2048, 16384)
    assert (pi0.expert.width, pi0.expert.mlp_dim) == (1024, 4096)
    assert PRESETS["pi05"].pi05 and PRESETS["pi05"].max_token_len == 200
    assert PRESETS["shallow6"].backbone.depth == PRESETS["shallow6"].expert.depth == 6


def test_bf16_keeps_openpi_float32_parameters():
    model = build_model("tiny", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.head_dtype == torch.float32
    assert model.backbone.layers[0].input_layernorm.weight.dtype == torch.float32
    assert model.vision.embeddings.patch_embedding.weight.dtype == torch.float32
    assert model.backbone.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16


# The shared building blocks against their formulas, written out here: the engine's equivalence tests cannot see
# a fault in what the reference and the engine share, and the outside references (openpi's JAX model,
# tests/test_openpi_jax.py) need tensorstore.

def test_rope_rotates_each_first_half_coordinate_with_its_second_half_partner():
    import math

    from vlaperf.models.pi0 import apply_rope, rope_cos_sin

    h, base, p = 4, 100.0, 3
    cos, sin = rope_cos_sin(torch.tensor([[0, p]]), h, base, torch.float64)
    x = torch.tensor([1.0, 2.0, 5.0, 7.0], dtype=torch.float64).expand(1, 1, 2, h)  # (B, heads, T, h)
    out = apply_rope(x, cos, sin)[0, 0]
    assert torch.equal(out[0], x[0, 0, 0])  # position 0 is no rotation
    for i, freq in enumerate((1.0, base ** -0.5)):  # inverse frequencies base^(-2i/h)
        a, b, angle = x[0, 0, 1, i].item(), x[0, 0, 1, i + h // 2].item(), p * freq
        # the angles are float32, as openpi's are: 1e-6
        assert out[1, i].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-6)
        assert out[1, i + h // 2].item() == pytest.approx(b * math.cos(angle) + a * math.sin(angle), abs=1e-6)


def test_time_embedding_is_sin_then_cos_over_periods_from_4e_3_to_4():
    import math

    from vlaperf.models.pi0 import sinusoidal_time_embedding

    t = torch.tensor([0.0, 0.3], dtype=torch.float64)
    emb = sinusoidal_time_embedding(t, 6)  # 3 periods: 4e-3, 4e-3 * 1000 ** 0.5, 4
    periods = [4e-3, 4e-3 * 1000 ** 0.5, 4.0]
    want = [[math.sin(2 * math.pi * s / q) for q in periods] + [math.cos(2 * math.pi * s / q) for q in periods]
            for s in (0.0, 0.3)]
    assert emb.flatten().tolist() == pytest.approx(sum(want, []), abs=1e-12)


def test_adaptive_rms_norm_splits_its_condition_into_scale_shift_gate():
    from vlaperf.models.pi0 import AdaptiveRMSNorm

    norm = AdaptiveRMSNorm(2, 1, eps=0.0)
    with torch.no_grad():
        norm.dense.weight.zero_()
        norm.dense.bias.copy_(torch.tensor([0.5, 0.5, 1.0, 1.0, 2.0, 3.0]))  # scale 0.5, shift 1, gate (2, 3)
    x = torch.tensor([[[3.0, -4.0]]])  # rms 3.5355: normed (0.8485, -1.1314)
    out, gate = norm(x, torch.zeros(1, 1))
    normed = x / x.pow(2).mean().sqrt()
    assert torch.allclose(out, normed * 1.5 + 1.0) and gate.tolist() == [[[2.0, 3.0]]]
