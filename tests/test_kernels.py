"""The opt-in Triton kernels (`triton_kernels`), checked on the CPU with Triton's interpreter.

The interpreter runs each program with numpy, so these tests say nothing about speed, and
its bf16 matmul is broken on this stack (triton 3.9): the checks run in float32. The bf16
checks and the timing are on the GPU: benchmarks/small_m_matmul_bench.py and the matrix in
benchmarks/h200_next.sh (`vlaperf matrix` checks equivalence before it times).
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


ATTENTION_SCRIPT = textwrap.dedent(
    """
    import torch
    from vlaperf.engine.kernels.suffix_attention import suffix_attention
    from vlaperf.models.pi0 import eager_attention

    torch.manual_seed(0)
    for B, N, Tq, Tk, h, splits in [(1, 4, 11, 59, 16, None), (2, 8, 7, 130, 32, 3), (1, 2, 5, 20, 16, 1)]:
        q, k, v = torch.randn(B, N, Tq, h), torch.randn(B, 1, Tk, h), torch.randn(B, 1, Tk, h)
        mask = torch.rand(B, Tq, Tk) > 0.3
        mask[:, :, 0] = True
        ref = eager_attention(q, k, v, mask)
        out = suffix_attention(q, k, v, mask, block_m=16, block_n=16, splits=splits)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (B, N, Tq, Tk, h, err)
    # a fully masked row stays finite and matches the reference's uniform weights
    q, k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 20, 16), torch.randn(1, 1, 20, 16)
    mask = torch.ones(1, 3, 20, dtype=torch.bool)
    mask[0, 1] = False
    assert (suffix_attention(q, k, v, mask, block_m=16, block_n=16, splits=2) - eager_attention(q, k, v, mask)).abs().max() < 1e-5
    print("ok")
    """
)


def test_suffix_attention_matches_eager_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", ATTENTION_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


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
    import vlaperf.engine.kernels.suffix_attention as A
    calls, attn_calls = [], []
    real, real_attn = K.small_m_matmul, A.suffix_attention
    K.small_m_matmul = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    A.suffix_attention = lambda *a, **kw: attn_calls.append(1) or real_attn(*a, **kw)

    w = get_workload("tiny")
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(w, model.config, seed=4), random_noise(w, model.config, seed=4)
    ref = model.sample_actions(obs, noise, w.steps)
    for levers in ("for_loop,fuse_projections,triton_kernels",
                   "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels"):
        out = Engine(model, levers).sample_actions(obs, noise, w.steps)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-4, (levers, err)
    # 4 kernels per layer, 2 expert layers, 4 steps, 2 variants: the kernels really ran
    assert len(calls) == 4 * 2 * 4 * 2, len(calls)
    assert len(attn_calls) == 2 * 4 * 2, len(attn_calls)  # one attention per layer and step
    print("ok")
    """
)


def test_triton_kernels_lever_matches_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", LEVER_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


COMPILE_SCRIPT = textwrap.dedent(
    """
    import torch, torch._dynamo
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
    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels,compile"
    # aot_eager traces with the custom ops' fake implementations, as inductor would;
    # fullgraph=True (compile.py) makes any graph break an error
    engine = Engine(model, levers, compile_backend="aot_eager")
    out = engine.sample_actions(obs, noise, w.steps)
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 1e-4, err
    assert len(calls) == 4 * 2 * 4, len(calls)  # the kernels ran inside the compiled step
    print("ok")
    """
)


def test_triton_kernels_compose_with_compile_without_graph_breaks():
    """The kernels are custom ops (kernels/ops.py), so the compiled step traces them whole."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_kernel_that_does_not_fit_the_gpu_is_a_clear_lever_error(monkeypatch):
    """Triton's OutOfResources (tiles too big for a GPU's shared memory) names the lever and the fix."""
    import torch

    import vlaperf.engine.kernels.small_m_matmul as K
    from vlaperf.engine.kernels.ops import small_m_matmul
    from vlaperf.engine.levers import LeverError

    class OutOfResources(Exception):  # the name Triton's exception has
        pass

    def too_big(*a, **kw):
        raise OutOfResources("out of resource: shared memory, Required: 245760, Hardware limit: 101376")

    monkeypatch.setattr(K, "small_m_matmul", too_big)
    with pytest.raises(LeverError, match="triton_kernels: the small_m_matmul kernel does not fit .*Run without the lever"):
        small_m_matmul(torch.randn(4, 8), torch.randn(6, 8))
    monkeypatch.setattr(K, "small_m_matmul", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):  # anything else passes through unchanged
        small_m_matmul(torch.randn(4, 8), torch.randn(6, 8))


def test_pick_config_takes_the_h200_sweep_winners():
    """The fastest correct tilings of benchmarks/results/h200/kernel_small_m_matmul.json for the
    pi0 expert's four matmuls (M = 51)."""
    import json
    from pathlib import Path

    from vlaperf.engine.kernels.small_m_matmul import pick_config

    sweep = json.loads((Path(__file__).parents[1] / "benchmarks/results/h200/kernel_small_m_matmul.json").read_text())
    shapes = {"qkv": (2560, 1024, False), "o_proj": (1024, 2048, False), "gate_up": (4096, 1024, True), "down": (1024, 4096, False)}
    for case in sweep["cases"]:
        N, K, geglu = shapes[case["case"].split()[0]]
        best = case["best"]
        assert pick_config(N, K, geglu) == {k: best[k] for k in ("block_n", "block_k", "split_k")}, case["case"]
