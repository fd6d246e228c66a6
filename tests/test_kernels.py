"""The experimental Triton kernels, checked on the CPU with Triton's interpreter.

The interpreter runs each program with numpy, so these tests say nothing about speed, and
its bf16 matmul is broken on this stack (triton 3.9): the checks run in float32. The bf16
check and the timing are in benchmarks/small_m_matmul_bench.py (GPU).
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from vlaperf.engine.kernels.small_m_matmul import small_m_matmul

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    torch.manual_seed(0)
    cases = [(51, 96, 256, 1), (51, 64, 512, 4), (10, 40, 100, None), (64, 33, 130, 2)]
    for M, N, K, split in cases:
        x = torch.randn(M, K)
        w, w2 = torch.randn(N, K) / K**0.5, torch.randn(N, K) / K**0.5
        r, g = torch.randn(M, N), torch.rand(N)
        kw = dict(split_k=split, block_n=32, block_k=64)
        assert rel(small_m_matmul(x, w, **kw), x @ w.T) < 1e-5, ("plain", M, N, K)
        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = F.gelu(xn @ w.T, approximate="tanh") * (xn @ w2.T)
        assert rel(small_m_matmul(x, w, w_up=w2, rms_eps=1e-6, **kw), ref) < 1e-5, ("geglu", M, N, K)
        assert rel(small_m_matmul(x, w, residual=r, gate=g, **kw), r + (x @ w.T) * g) < 1e-5, ("residual", M, N, K)
        assert rel(small_m_matmul(x, w, residual=r, rms_eps=1e-6, **kw), r + xn @ w.T) < 1e-5, ("rms+residual", M, N, K)
    try:
        small_m_matmul(torch.randn(65, 8), torch.randn(4, 8))
        raise SystemExit("65 rows must be refused")
    except ValueError as e:
        assert "at most 64 rows" in str(e)
    print("ok")
    """
)


def test_small_m_matmul_matches_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


LEVER_SCRIPT = textwrap.dedent(
    """
    import torch
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    import vlaperf.engine.kernels.small_m_matmul as K
    calls = []
    real = K.small_m_matmul
    K.small_m_matmul = lambda *a, **kw: calls.append(1) or real(*a, **kw)

    w = get_workload("tiny")
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(w, model.config, seed=4), random_noise(w, model.config, seed=4)
    ref = model.sample_actions(obs, noise, w.steps)
    for levers in ("for_loop,fuse_projections,triton_matmul",
                   "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_matmul"):
        out = Engine(model, levers).sample_actions(obs, noise, w.steps)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-4, (levers, err)
    # 4 kernels per layer, 2 expert layers, 4 steps, 2 variants: the kernels really ran
    assert len(calls) == 4 * 2 * 4 * 2, len(calls)
    print("ok")
    """
)


def test_triton_matmul_lever_matches_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", LEVER_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
