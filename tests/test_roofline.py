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
