"""The roofline floor agrees with the figures measured for the design notes (perf-facts.md)."""

import pytest

from vlaperf.models.pi0 import get_config
from vlaperf.roofline import roofline
from vlaperf.workloads import get_workload


def test_libero_pi0_floor_matches_perf_facts():
    r = roofline(get_config("pi0"), get_workload("libero-pi0"), images=2, prompt_len=20)
    assert r["prefix_tokens"] == 532 and r["suffix_tokens"] == 51
    assert r["prefix_tflop"] == pytest.approx(0.42 + 2.11, rel=0.05)  # SigLIP 2 images + Gemma 532 tokens
    assert r["prefix_ms"] == pytest.approx(3.3, rel=0.05)
    assert r["denoise_gb_per_step"] == pytest.approx(0.62, rel=0.05)
    assert r["denoise_ms"] == pytest.approx(1.5, rel=0.05)
    assert r["floor_ms"] == pytest.approx(4.8, rel=0.05)


def test_full_prefix_costs_more():
    w, c = get_workload("libero-pi0"), get_config("pi0")
    assert roofline(c, w, 3, 48)["floor_ms"] > roofline(c, w, 2, 20)["floor_ms"] + 1.0


def test_measured_ceilings_are_rates_of_their_own_work():
    """measure_ceilings times a square matmul (2 n^3 FLOPs) and a copy (bytes read + written) and says how; bad sizes
    are refused by name."""
    import torch

    from vlaperf.roofline import measure_ceilings

    c = measure_ceilings("cpu", torch.float32, matmul_size=256, copy_bytes=2**22, reps=3)
    assert c["source"] == "measured on this device"
    assert c["matmul"] == "256 x 256 x 256 float32, median of 3" and c["copy"].startswith("4 MiB device to device")
    assert 1e7 < c["matmul_flops"] < 1e15 and 1e7 < c["bandwidth"] < 1e13
    with pytest.raises(ValueError, match="matmul_size, copy_bytes and reps must be positive"):
        measure_ceilings("cpu", matmul_size=-1)
    with pytest.raises(ValueError, match="got 256, 0, 10"):
        measure_ceilings("cpu", matmul_size=256, copy_bytes=0)


def test_pi0_prefix_flops_are_the_ones_torch_counts():
    """The floor's prefix FLOPs against torch's counter over the tiny reference's prefix (every image, the padded
    prompt): its matmuls, attention included (per query head, not per K/V head), and the patch embedding."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vlaperf.inputs import random_observation
    from vlaperf.models.pi0 import build_model

    model, w = build_model(get_config("tiny"), "cpu", torch.float32, seed=0), get_workload("tiny")
    obs = random_observation(w, model.config, seed=1)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.prefill(*model.embed_prefix(obs))
    r = roofline(model.config, w, images=obs.images.shape[1], prompt_len=obs.tokens.shape[1])
    assert model.config.backbone.num_heads != model.config.backbone.num_kv_heads
    assert r["prefix_tflop"] * 1e12 == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_each_prompt_token_adds_its_keys_and_values_to_every_step_s_bytes():
    c, w = get_config("pi0"), get_workload("libero-pi0")
    e = c.expert
    added = roofline(c, w, 2, 21)["denoise_gb_per_step"] - roofline(c, w, 2, 20)["denoise_gb_per_step"]
    assert added * 1e9 == pytest.approx(2 * e.depth * 2 * e.num_kv_heads * e.head_dim)  # bf16 K and V, every layer
