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


# The tiny preset counted by hand, in multiply-accumulates (2 FLOPs each): SigLIP width 32, depth 2, MLP 64, 16 patches
# of 14 x 14 x 3 pixels; the Gemma backbone width 64, depth 2, MLP 128, 4 query heads and 1 K/V head of 16; the expert
# the same heads at width 32, MLP 64; pi0's suffix is the state token and the 10 actions.
TINY_SIGLIP_LAYER = 16 * 4 * 32 * 32 + 16 * 2 * 32 * 64 + 2 * 16 * 16 * 32  # q, k, v, o; fc1, fc2; QK^T and PV
TINY_IMAGE = 2 * TINY_SIGLIP_LAYER + 16 * (14 * 14 * 3) * 32 + 16 * 32 * 64  # layers, patch embedding, projector
TINY_BACKBONE_LAYER_PARAMS = 64 * 64 + 2 * 64 * 16 + 64 * 64 + 3 * 64 * 128  # q, k and v (1 head), o; gate, up, down
TINY_EXPERT_LAYER_PARAMS = 32 * 64 + 2 * 32 * 16 + 64 * 32 + 3 * 32 * 64


@pytest.mark.parametrize("matmul_flops, bandwidth", [(3e9, 1e8), (1e10, 1e8), (5e8, 1e8)],
                         ids=["prefix-compute-denoise-memory", "both-memory", "both-compute"])
def test_tiny_floor_against_a_hand_count(matmul_flops, bandwidth):
    c, w = get_config("tiny"), get_workload("tiny")
    r = roofline(c, w, images=2, prompt_len=16, matmul_flops=matmul_flops, bandwidth=bandwidth)
    tokens, keys = 2 * 16 + 16, 2 * 16 + 16 + 11  # the expert's queries see the prefix and the suffix
    backbone = 2 * tokens * (TINY_BACKBONE_LAYER_PARAMS + 2 * tokens * 4 * 16)  # 2 layers; attention per query head
    prefix_flops = 2 * (2 * TINY_IMAGE + backbone)
    step_flops = 2 * 2 * 11 * (TINY_EXPERT_LAYER_PARAMS + 2 * keys * 4 * 16)
    # bf16 weights (the patch embedding left out: lower order), and every step the K/V cache of all its keys
    prefix_bytes = 2 * (2 * (4 * 32 * 32 + 2 * 32 * 64) + 32 * 64 + 2 * TINY_BACKBONE_LAYER_PARAMS)
    step_bytes = 2 * 2 * TINY_EXPERT_LAYER_PARAMS + 2 * 2 * 2 * keys * 1 * 16  # 2 layers of K and V, one head
    assert (r["prefix_tokens"], r["suffix_tokens"], r["steps"]) == (48, 11, 4)
    assert r["prefix_tflop"] * 1e12 == pytest.approx(prefix_flops)
    assert r["denoise_tflop"] * 1e12 == pytest.approx(4 * step_flops)
    assert r["prefix_weight_gb"] * 1e9 == pytest.approx(prefix_bytes)
    assert r["denoise_gb_per_step"] * 1e9 == pytest.approx(step_bytes)
    prefix_ms = 1e3 * max(prefix_flops / matmul_flops, prefix_bytes / bandwidth)
    denoise_ms = 4e3 * max(step_flops / matmul_flops, step_bytes / bandwidth)
    assert r["prefix_ms"] == pytest.approx(prefix_ms) and r["denoise_ms"] == pytest.approx(denoise_ms)
    assert r["floor_ms"] == pytest.approx(prefix_ms + denoise_ms)
    assert (r["matmul_flops"], r["bandwidth"]) == (matmul_flops, bandwidth)


def test_tiny_floor_scales_with_batch_and_steps_and_pi05_has_no_state_token():
    c, w = get_config("tiny"), get_workload("tiny")
    one = roofline(c, w, images=2, prompt_len=16)
    two = roofline(c, w.with_overrides(batch=2), images=2, prompt_len=16, steps=3)
    assert two["steps"] == 3
    assert two["prefix_tflop"] == pytest.approx(2 * one["prefix_tflop"])  # every sample's images and prompt
    assert two["denoise_tflop"] == pytest.approx(2 * 3 / 4 * one["denoise_tflop"])
    assert two["prefix_weight_gb"] == one["prefix_weight_gb"]  # weights are read once for the batch ...
    keys = 2 * 16 + 16 + 11
    kv = 2 * 2 * 2 * keys * 16  # ... a sample's K/V cache is not
    assert (two["denoise_gb_per_step"] - one["denoise_gb_per_step"]) * 1e9 == pytest.approx(kv)
    pi05 = roofline(get_config("tiny", pi05=True), w, images=2, prompt_len=16)
    assert pi05["suffix_tokens"] == 10


def test_measured_ceilings_refuse_zero_repetitions():
    from vlaperf.roofline import measure_ceilings

    with pytest.raises(ValueError, match="got 8, 64, 0"):
        measure_ceilings("cpu", matmul_size=8, copy_bytes=64, reps=0)


@pytest.mark.parametrize("rate,bandwidth", [(786e12, 3.03e12), (780e12, 4.23e12), (1e12, 100e12), (1e18, 1e9)])
def test_floor_at_other_ceilings_is_the_floor_counted_at_them(rate, bandwidth):
    """floor_at rescales a result file's floor to a GPU's own ceilings (the standing table reads one GPU's rows
    against one floor): from the phases a pi0-family file records, and for a world-action file from its workload's
    settings, each equal to the floor counted afresh at those ceilings, on either side of the ridge."""
    from vlaperf.models.wam import PRESETS
    from vlaperf.roofline import floor_at, wam_roofline
    from vlaperf.workloads import get_wam_workload

    cfg, w = get_config("pi05"), get_workload("libero-pi05")
    recorded = {"roofline": roofline(cfg, w, images=2, prompt_len=64)}
    fresh = roofline(cfg, w, images=2, prompt_len=64, matmul_flops=rate, bandwidth=bandwidth)
    assert floor_at(recorded, {"matmul_flops": rate, "bandwidth": bandwidth}) == pytest.approx(fresh["floor_ms"])
    wam = get_wam_workload("wam-761").with_overrides(batch=4, sparsity="drop_middle")
    result = {"workload": {"id": "wam-761", "settings": {"batch": 4, "steps": wam.steps, "video_steps": wam.video_steps,
                                                         "sparsity": "drop_middle", "cfg_scale": 0.0, "shift": 3.0}},
              "mode": "model", "roofline": wam_roofline(PRESETS["wam"], wam)}
    assert floor_at(result, {"matmul_flops": rate, "bandwidth": bandwidth}) == pytest.approx(
        wam_roofline(PRESETS["wam"], wam, rate, bandwidth)["floor_ms"])
    assert floor_at({"roofline": None}, {"matmul_flops": rate, "bandwidth": bandwidth}) is None  # a CPU file
    # a floor the count does not give back at the file's own ceilings (a model it does not know) is not rescaled
    other = {"roofline": {**recorded["roofline"], "floor_ms": 2 * recorded["roofline"]["floor_ms"]}}
    assert floor_at(other, {"matmul_flops": rate, "bandwidth": bandwidth}) is None
