"""The opt-in Triton kernels (`triton_kernels`), checked on the CPU with Triton's interpreter.

The interpreter runs each program with numpy, so these tests say nothing about speed, and
its bf16 matmul is broken on this stack (triton 3.9): the checks run in float32. The bf16
checks and the timing are on the GPU: benchmarks/small_m_matmul_bench.py and the matrix in
benchmarks/h200_next.sh (`vlaperf matrix` checks equivalence before it times).
"""

import os
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

# What the CPU checks of the kernels need of Triton. Seen on the H200 machine (torch 2.11, Triton 3.6; sessions 31
# and 32): 3.6's interpreter cannot take a loop over a program's runtime bounds (`range(layer_lo, layer_hi)`,
# `range(k_start, k_start + k_per_split, BLOCK_K)`: "only 0-dimensional arrays can be converted to Python scalars"),
# and 3.6 compiles one of the checked non-default step-kernel tilings with 4 bytes of spills where the register
# budget was set under 3.9 (the default tiling: 238 registers, no spills, with and without its timeline). There
# tests/test_engine_cuda.py runs the same kernels compiled for the GPU.
TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
needs_triton_39 = pytest.mark.skipif(TRITON_VERSION < (3, 9), reason=f"the kernels' CPU checks need Triton >= 3.9 "
                                     f"(its interpreter and register budget), found {triton.__version__}")


def run_in_interpreter(script: str, timeout: int) -> None:
    """Run `script` in a fresh Python under Triton's CPU interpreter; it must print "ok"."""
    # a compile cache of its own: an earlier run's cached graphs (another checkout's custom ops) stay out
    with tempfile.TemporaryDirectory(prefix="vlaperf-test-inductor-") as cache:
        env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=cache)
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                              timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


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
    # a bias broadcast over the rows (stride 0) is a residual: the step's float32 heads
    x, w, b = torch.randn(50, 1024), torch.randn(32, 1024) / 32, torch.randn(32)
    assert rel(small_m_matmul(x, w, residual=b.expand(50, -1)), F.linear(x, w, b)) < 1e-6, "bias"
    assert rel(small_m_matmul(x, w, precision="tf32x3"), F.linear(x, w)) < 1e-5, "tf32x3"
    for bad in (dict(precision="fp8"), dict(precision="tf32x3", x=x.bfloat16(), w=w.bfloat16())):
        try:
            small_m_matmul(bad.pop("x", x), bad.pop("w", w), **bad)
            raise SystemExit(f"{bad} must be refused")
        except ValueError as e:
            assert "precision=" in str(e), e
    try:
        small_m_matmul(torch.randn(65, 8), torch.randn(4, 8))
        raise SystemExit("65 rows must be refused")
    except ValueError as e:
        assert "at most 64 rows" in str(e)
    try:
        small_m_matmul(torch.randn(5, 8), torch.randn(4, 8, dtype=torch.bfloat16))
        raise SystemExit("mixed dtypes must be refused")
    except ValueError as e:
        assert "expected the same dtype" in str(e)
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
        for block_d in (None, h // 2):  # the merge fitted (here: the whole head dim a program), or in halves
            out = suffix_attention(q, k, v, mask, block_m=16, block_n=16, splits=splits, block_d=block_d)
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, (B, N, Tq, Tk, h, block_d, err)
    # the merge in four parts of the head dim, the output token-major; the step's op writes it so
    from vlaperf.engine.kernels import ops
    q, k, v = torch.randn(2, 8, 7, 32), torch.randn(2, 1, 130, 32), torch.randn(2, 1, 130, 32)
    mask = torch.rand(2, 7, 130) > 0.3
    mask[:, :, 0] = True
    ref = eager_attention(q, k, v, mask)
    out = suffix_attention(q, k, v, mask, block_m=16, block_n=16, splits=3, block_d=8, token_major=True)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()  # (B, T, N, h) memory: a view for o_proj
    out = ops.step_attention(q, k, v, mask)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5 and out.transpose(1, 2).is_contiguous()
    assert ((ops.suffix_attention(q, k, v, mask) - ref).norm() / ref.norm()).item() < 1e-5
    # a fully masked row stays finite and matches the reference's uniform weights
    q, k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 20, 16), torch.randn(1, 1, 20, 16)
    mask = torch.ones(1, 3, 20, dtype=torch.bool)
    mask[0, 1] = False
    assert (suffix_attention(q, k, v, mask, block_m=16, block_n=16, splits=2) - eager_attention(q, k, v, mask)).abs().max() < 1e-5
    # the prefix: one pass (no merge), bidirectional over valid tokens, padded rows attend to themselves
    from vlaperf.engine.attention import prefix_mask
    from vlaperf.engine.kernels.suffix_attention import prefix_attention
    pad = torch.ones(2, 37, dtype=torch.bool)
    pad[0, 30:] = False
    pad[1, 12:20] = False  # a masked image slot in the middle
    q, k, v = torch.randn(2, 4, 37, 16), torch.randn(2, 1, 37, 16), torch.randn(2, 1, 37, 16)
    mask = prefix_mask(pad)
    ref = eager_attention(q, k, v, mask)
    for splits in (1, 2, 3):  # one pass, or keys split with partials and the merge (benchmarks/prefix_tiles_ab.py)
        out = prefix_attention(q, k, v, mask, block_m=16, block_n=16, splits=splits, num_warps=4)
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5, splits
    # mask rows padded to 48 bytes with random bytes past the 37 keys: the kernel reads them (its mask loads are
    # bounded by the 48 columns, so they vectorize) and must ignore them, as when bounded by the keys themselves
    from vlaperf.engine.kernels.suffix_attention import readable_mask_cols, suffix_attention
    buf = torch.randint(0, 2, (2, 37, 48), dtype=torch.uint8)
    buf[..., :37] = mask
    padded = buf[..., :37]
    assert readable_mask_cols(padded) == 48
    for cols in (None, 37, 40):
        out = suffix_attention(q, k, v, padded, block_m=16, block_n=16, splits=2, token_major=True, mask_cols=cols)
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5, cols
    print("ok")
    """
)


ROPE_SCRIPT = textwrap.dedent(
    """
    import torch
    from vlaperf.engine.kernels.rope_qkv import rope_qkv
    from vlaperf.models.pi0 import apply_rope, rope_cos_sin

    torch.manual_seed(0)
    # (B, T, N, K, h, start, write_q): Gemma's one K/V head; several K/V heads; a cache offset;
    # keys and values only (the prefill's last layer)
    for B, T, N, K, h, start, write_q in [(1, 37, 4, 1, 16, 0, True), (2, 45, 2, 1, 32, 3, True), (2, 20, 4, 2, 16, 5, False)]:
        qkv = torch.randn(B, T, (N + 2 * K) * h)
        positions = torch.cumsum(torch.rand(B, T) > 0.2, 1) - 1  # padded tokens repeat a position
        cos, sin = rope_cos_sin(positions, h, 10000.0, torch.float32)
        kc = torch.randn(3, B, K, start + T + 4, h)
        vc = torch.randn_like(kc)
        want_k, want_v = kc.clone(), vc.clone()
        q, k, v = (t.reshape(B, T, -1, h).transpose(1, 2) for t in qkv.split([N * h, K * h, K * h], -1))
        want_k[1, :, :, start : start + T] = apply_rope(k, cos, sin)
        want_v[1, :, :, start : start + T] = v
        out_q, out_k = rope_qkv(qkv, cos, sin, kc, vc, 1, start, N, K, write_q=write_q, block_t=16)
        if write_q:
            assert (out_q - apply_rope(q, cos, sin)).abs().max() < 1e-5, (B, T, N, K)
        else:
            assert out_q.shape == (B, 0, T, h), out_q.shape
        assert (out_k - apply_rope(k, cos, sin)).abs().max() < 1e-5, (B, T, N, K)
        # the layer's slots hold the new keys and values; every other element is untouched
        assert (kc - want_k).abs().max() < 1e-5 and torch.equal(vc, want_v), (B, T, N, K)
    for bad, field in [(dict(cos=torch.zeros(1, 9, 16)), "cos and sin"), (dict(layer=3), "outside the cache"),
                       (dict(qkv=torch.zeros(1, 10, 100)), "head dim")]:
        args = dict(qkv=torch.zeros(1, 10, 96), cos=torch.zeros(1, 10, 16), sin=torch.zeros(1, 10, 16),
                    k_cache=torch.zeros(3, 1, 1, 12, 16), v_cache=torch.zeros(3, 1, 1, 12, 16), layer=0, start=0,
                    num_heads=4, num_kv_heads=1)
        args.update(bad)
        if field == "cos and sin":
            args["sin"] = args["cos"]
        try:
            rope_qkv(**args)
            raise SystemExit(f"{bad} must be refused")
        except ValueError as e:
            assert field in str(e), e

    # the prefix attention writes token-major memory: (B, T, N * h) is a view of its output
    from vlaperf.engine.attention import prefix_mask
    from vlaperf.engine.kernels.suffix_attention import prefix_attention
    q, k, v = torch.randn(1, 4, 20, 16), torch.randn(1, 1, 20, 16), torch.randn(1, 1, 20, 16)
    out = prefix_attention(q, k, v, prefix_mask(torch.ones(1, 20, dtype=torch.bool)), block_m=16, block_n=16)
    assert out.shape == (1, 4, 20, 16) and out.transpose(1, 2).is_contiguous(), out.stride()
    print("ok")
    """
)


@needs_triton_39
def test_rope_qkv_kernel_matches_reference_rope_and_cache_write_in_the_interpreter():
    run_in_interpreter(ROPE_SCRIPT, timeout=600)


@needs_triton_39
def test_suffix_attention_matches_eager_in_the_interpreter():
    run_in_interpreter(ATTENTION_SCRIPT, timeout=600)


def test_merge_programs_split_the_head_dim_until_the_gpu_is_covered():
    from vlaperf.engine.kernels.suffix_attention import MERGE_PROGRAMS, merge_block_d, suffix_attention

    assert MERGE_PROGRAMS == 264
    # the step at batch 4: 4 samples x 13 row blocks of 32 -> 32 dims a program, 416 programs
    assert merge_block_d(52, 256) == 32
    assert merge_block_d(68, 256) == 64  # the prefix at batch 1: 68 row blocks x 4 parts = 272
    assert merge_block_d(300, 256) == 256  # enough programs already: one a row block
    assert merge_block_d(1, 32) == 32  # never below MIN_MERGE_DIMS
    assert merge_block_d(1, 72) == 72  # a head dim whose halves are no power of two stays whole
    from vlaperf.engine.kernels.suffix_attention import WAVE_PROGRAMS, default_splits
    # key splits: ~4 tiles of keys each, capped at one wave of programs
    assert WAVE_PROGRAMS == 264
    assert default_splits(600, 32, 8 * 13) == 2  # batch 8: 208 programs, not 312 in 1.2 waves
    assert default_splits(600, 32, 4 * 13) == 5  # batch 4: 260 programs
    assert default_splits(595, 32, 13) == 5  # batch 1: 5 splits of 4 tiles
    assert default_splits(600, 32, 400) == 1  # more blocks than a wave: no split
    # the prefix's key splits (session 36's sweep, prefix_splits_probe.py): up to 3 while the programs fit one wave
    from vlaperf.engine.kernels.suffix_attention import PREFIX_TILES, prefix_splits
    assert PREFIX_TILES["splits"] is None  # picked per shape, not fixed
    assert prefix_splits(68) == 3  # libero-pi0: 8 x 544 rows in 68 blocks of 64, 204 programs
    assert prefix_splits(88) == 3  # 704 rows: 264 programs, exactly one wave
    assert prefix_splits(89) == 2  # pi0.5's 200-token bucket, 712 rows: 3 splits would be 267 programs
    assert prefix_splits(121) == 2  # three images and a 200-token prompt
    assert prefix_splits(132) == 2 and prefix_splits(133) == 1  # one split fills a wave from 133 blocks on
    assert prefix_splits(272) == 1 and prefix_splits(544) == 1  # batch 4 and 8: one pass, no partials or merge
    assert prefix_splits(33) == 3  # one image: never more than PREFIX_MAX_SPLITS
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 20, 16)
    with pytest.raises(ValueError, match="block_d=12, expected a power of two dividing the head dim 16"):
        suffix_attention(q, k, k, torch.ones(1, 3, 20, dtype=torch.bool), splits=2, block_d=12)


def test_mask_loads_read_the_padded_columns_only_where_the_storage_holds_them():
    """`readable_mask_cols`: the attention kernel bounds its mask loads by the columns each row's memory holds (a
    multiple of 16 for aligned rows, so the loads vectorize: session 36, 712 prefix rows), never past the storage."""
    from vlaperf.engine.kernels.suffix_attention import aligned_mask, readable_mask_cols, suffix_attention

    mask = torch.ones(2, 5, 37, dtype=torch.bool)
    assert readable_mask_cols(mask.to(torch.uint8)) == 37  # contiguous rows: exactly the keys
    assert readable_mask_cols(aligned_mask(mask)) == 48  # aligned rows: 48 bytes each, the last row's too
    wide = torch.zeros(2, 5, 64, dtype=torch.uint8)
    assert readable_mask_cols(wide[..., :37]) == 64  # a view of wider rows
    assert readable_mask_cols(wide[:, :, :47][:, :-1]) == 64  # fewer rows than the storage holds
    assert readable_mask_cols(wide[:, :, 10:47]) == 37  # 10 bytes into each row: the last row's 64 would pass the end
    assert readable_mask_cols(wide.view(-1)[10:].as_strided((2, 5, 37), (320, 64, 1))) == 37  # last row cut short
    assert readable_mask_cols(wide.transpose(1, 2)[:, :5, :]) == 5  # keys not contiguous: no padding is assumed
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 20, 16)
    narrow = torch.ones(1, 3, 20, dtype=torch.bool)
    for cols in (19, 21):  # below the keys, or past what contiguous rows hold
        with pytest.raises(ValueError, match=f"mask_cols={cols}, expected from Tk=20 up to the columns the mask's "
                                             f"rows hold \\(20\\)"):
            suffix_attention(q, k, k, narrow, splits=2, mask_cols=cols)


@needs_triton_39
def test_small_m_matmul_matches_torch_in_the_interpreter():
    run_in_interpreter(SCRIPT, timeout=600)


# The lever scripts: the tiny model in float32, one observation, and the reference actions.
TINY_SETUP = textwrap.dedent(
    """
    import torch
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import build_model
    from vlaperf.workloads import get_workload

    w = get_workload("tiny")
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    obs, noise = random_observation(w, model.config, seed=4), random_noise(w, model.config, seed=4)
    ref = model.sample_actions(obs, noise, w.steps)
    """
)


LEVER_SCRIPT = TINY_SETUP + textwrap.dedent(
    """

    import vlaperf.engine.kernels.small_m_matmul as K
    import vlaperf.engine.kernels.suffix_attention as A
    import vlaperf.engine.kernels.rope_qkv as R
    calls, attn_calls, prefix_calls, rope_calls = [], [], [], []
    real, real_attn, real_prefix, real_rope = K.small_m_matmul, A.suffix_attention, A.prefix_attention, R.rope_qkv
    K.small_m_matmul = lambda *a, **kw: calls.append(kw.get("precision")) or real(*a, **kw)
    A.suffix_attention = lambda *a, **kw: attn_calls.append(1) or real_attn(*a, **kw)
    A.prefix_attention = lambda *a, **kw: prefix_calls.append(1) or real_prefix(*a, **kw)
    R.rope_qkv = lambda *a, **kw: rope_calls.append(kw["write_q"]) or real_rope(*a, **kw)

    for levers in ("for_loop,fuse_projections,triton_kernels",
                   "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels"):
        out = Engine(model, levers).sample_actions(obs, noise, w.steps)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-4, (levers, err)
    # 4 kernels per layer x 2 expert layers, plus the 3 float32 heads (action + time in, time
    # MLP out, action out) as TF32x3 products, 4 steps, 2 variants: the kernels really ran
    assert len(calls) == (4 * 2 + 3) * 4 * 2, len(calls)
    assert calls.count("tf32x3") == 3 * 4 * 2 and calls.count(None) == 4 * 2 * 4 * 2, calls
    # the prefix: both backbone layers attend, except with static_kv_cache the last (its K/V only)
    assert len(prefix_calls) == 2 + 1, len(prefix_calls)
    # with static_kv_cache, RoPE and the cache write are one kernel a layer (the last: K/V only)
    assert rope_calls == [True, False], rope_calls
    # one attention per expert layer and step, and the prefix's (they run the same kernel)
    assert len(attn_calls) == 2 * 4 * 2 + len(prefix_calls), len(attn_calls)

    # pi0.5: the prefix kernel applies to its backbone; the layer kernels do not (adaptive
    # norms), its two float32 heads (action in, action out) do
    from vlaperf.models.pi0 import get_config
    m5 = build_model(get_config("tiny", pi05=True), "cpu", torch.float32, seed=0)
    obs5, noise5 = random_observation(w, m5.config, seed=4), random_noise(w, m5.config, seed=4)
    ref5 = m5.sample_actions(obs5, noise5, w.steps)
    before = (len(calls), len(prefix_calls), len(attn_calls))
    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels"
    out5 = Engine(m5, levers).sample_actions(obs5, noise5, w.steps)
    err = ((out5 - ref5).norm() / ref5.norm()).item()
    assert err < 1e-4, err
    assert (len(calls), len(prefix_calls)) == (before[0] + 2 * 4, before[1] + 1), (len(calls), len(prefix_calls))
    # its expert layers (torch layers) write the step's keys with the same kernel: 2 layers x 4 steps
    assert rope_calls[2:] == [True, False] + [True] * 2 * 4, rope_calls
    # its expert layers (torch layers) attend through the split-key kernel: 2 layers x 4 steps
    assert len(attn_calls) == before[2] + 2 * 4 + 1, len(attn_calls)

    # batch 8 (88 suffix rows, more than the layer kernels take): the step's torch layers attend
    # through the split-key kernel too, per sample over its own cache and mask
    w8 = w.with_overrides(batch=8)
    obs8, noise8 = random_observation(w8, model.config, seed=5), random_noise(w8, model.config, seed=5)
    ref8 = model.sample_actions(obs8, noise8, w8.steps)
    before = (len(calls), len(attn_calls), len(rope_calls))
    out8 = Engine(model, levers).sample_actions(obs8, noise8, w8.steps)
    err = ((out8 - ref8).norm() / ref8.norm()).item()
    assert err < 1e-4, err
    # no layer kernel (rows > 64), the 3 float32 heads don't apply (more than 64 rows) either
    assert len(attn_calls) == before[1] + 2 * 4 + 1, len(attn_calls)
    # RoPE and the cache write: the prefix's two layers, then each step layer's keys at [Tp, Tp + Ts)
    assert rope_calls[before[2]:] == [True, False] + [True] * 2 * 4, rope_calls
    # the same without the step's kernel (its two copies into the cache): the same actions
    import vlaperf.engine.loop as L
    L.FUSED_STEP_ROPE_CACHE_WRITE = False
    out8_copies = Engine(model, levers).sample_actions(obs8, noise8, w8.steps)
    L.FUSED_STEP_ROPE_CACHE_WRITE = True
    assert ((out8 - out8_copies).norm() / out8_copies.norm()).item() < 1e-5
    assert len(rope_calls) == before[2] + 2 + 2 + 2 * 4, len(rope_calls)
    print("ok")
    """
)


@needs_triton_39
def test_triton_kernels_lever_matches_reference_in_the_interpreter():
    run_in_interpreter(LEVER_SCRIPT, timeout=900)


STEP_CACHE_WRITE_SCRIPT = TINY_SETUP + textwrap.dedent(
    """
    from torch._inductor.utils import run_and_get_code
    import vlaperf.engine.loop as L

    # batch 8: 88 suffix rows, so the step runs the torch layers (not the small-M layer kernels)
    w8 = w.with_overrides(batch=8)
    obs8, noise8 = random_observation(w8, model.config, seed=5), random_noise(w8, model.config, seed=5)
    ref8 = model.sample_actions(obs8, noise8, w8.steps)
    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels,compile"
    whole_cache_buffers = {}
    for fused in (True, False):
        L.FUSED_STEP_ROPE_CACHE_WRITE = fused
        torch._dynamo.reset()
        engine = Engine(model, levers)  # inductor, on the CPU
        out, code = run_and_get_code(lambda: engine.sample_actions(obs8, noise8, w8.steps))
        assert ((out - ref8).norm() / ref8.norm()).item() < 1e-4
        (shape,) = [s for s, _ in engine._kv if s[1] == 8]
        whole_cache_buffers[fused] = "\\n".join(code).count(f"empty_strided_cpu({shape}")
    # the two copies into slices of the cache: inductor allocates buffers of the whole cache
    # (the layers of all depths) to scatter into; the kernel's declared mutation: none
    assert whole_cache_buffers[False] > 0 and whole_cache_buffers[True] == 0, whole_cache_buffers
    print("ok")
    """
)


@needs_triton_39
def test_step_cache_write_compiles_without_copies_of_the_whole_cache():
    """The step's RoPE + cache write through kernels/rope_qkv.py (loop.step_rope_cache_kernel)
    under inductor: no buffer the size of the whole static cache, where the two `copy_` calls
    into its slices got them (a full copy per write, 12-14 us each at batch 4 on the H200)."""
    run_in_interpreter(STEP_CACHE_WRITE_SCRIPT, timeout=600)


COMPILE_SCRIPT = TINY_SETUP + textwrap.dedent(
    """
    import torch._dynamo

    import vlaperf.engine.kernels.small_m_matmul as K
    calls = []
    real = K.small_m_matmul
    K.small_m_matmul = lambda *a, **kw: calls.append(1) or real(*a, **kw)

    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels,compile"
    # aot_eager traces with the custom ops' fake implementations, as inductor would;
    # fullgraph=True (compile.py) makes any graph break an error
    engine = Engine(model, levers, compile_backend="aot_eager")
    out = engine.sample_actions(obs, noise, w.steps)
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 1e-4, err
    assert len(calls) == (4 * 2 + 3) * 4, len(calls)  # the layer and head kernels ran inside the compiled step
    # compile_layers: the prefix's layer blocks compiled one by one, the RoPE + cache-write kernel
    # writing each layer's slice of the static cache from inside its compiled block
    layered = Engine(model, levers + ",compile_layers", compile_backend="aot_eager")
    out_layered = layered.sample_actions(obs, noise, w.steps)
    err = ((out_layered - ref).norm() / ref.norm()).item()
    assert err < 1e-4, err
    print("ok")
    """
)


PRECOMPILE_SCRIPT = TINY_SETUP + textwrap.dedent(
    """
    from collections import Counter

    import vlaperf.engine.kernels.expert_step as S
    import vlaperf.engine.kernels.rope_qkv as R
    import vlaperf.engine.kernels.small_m_matmul as K
    import vlaperf.engine.kernels.suffix_attention as A
    from vlaperf.engine.prefix import plan_prefix

    warmups, runs = Counter(), Counter()
    for mod, name in ((S, "_expert_step_kernel"), (R, "_rope_qkv_kernel"), (K, "_small_m_kernel"), (A, "_partial_kernel"),
                      (A, "_merge_kernel")):
        kernel = getattr(mod, name)
        real_warmup, real_run = kernel.warmup, kernel.run
        kernel.warmup = lambda *a, _n=name, _w=real_warmup, **kw: warmups.update([_n]) or _w(*a, **kw)
        kernel.run = lambda *a, _n=name, _r=real_run, **kw: (runs.update([_n]) if not kw.get("warmup") else None) or _r(*a, **kw)

    levers = "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels,megakernel"
    engine = Engine(model, levers)
    plan = plan_prefix(obs, True, True)
    inputs = [obs.images, obs.image_mask, obs.tokens, obs.token_mask, obs.state, noise]
    engine.prepare(w.steps)
    engine._precompile_kernels(inputs, plan, w.steps)()  # start the thread, wait for it
    assert engine.precompile_error is None, engine.precompile_error
    # every kernel of the path was compiled for its arguments, none ran
    assert set(warmups) == {"_expert_step_kernel", "_rope_qkv_kernel", "_small_m_kernel", "_partial_kernel",
                            "_merge_kernel"}, warmups
    assert not runs, runs
    out = engine.sample_actions(obs, noise, w.steps)  # the real call afterwards: unaffected
    assert ((out - ref).norm() / ref.norm()).item() < 1e-4
    assert runs["_expert_step_kernel"] > 0 and runs["_rope_qkv_kernel"] > 0, runs

    # with compile workers (a CUDA engine's first call), the thread hands them its recorded launches
    # first, closes them, and still compiles itself (on the GPU, cache hits)
    class FakeWorkers:
        def __init__(self):
            self.calls, self.closed = [], False

        def compile(self, launches, first=()):
            self.calls.append(([k.__name__ for k, *_ in launches], first))
            return {"_expert_step_kernel": 1.5}

        def close(self, kill=False):
            self.closed = True

    engine2 = Engine(model, levers)
    engine2.prepare(w.steps)
    fake = engine2._compile_workers = FakeWorkers()
    warmups.clear()
    engine2._precompile_kernels(inputs, plan, w.steps)()
    assert engine2.precompile_error is None, engine2.precompile_error
    (names, first), = fake.calls
    assert first == ("_expert_step_kernel",) and "_expert_step_kernel" in names and "_rope_qkv_kernel" in names, names
    assert fake.closed and engine2._compile_workers is None  # the first call's only
    assert engine2.compile_worker_seconds == {"_expert_step_kernel": 1.5}
    assert set(warmups) == {"_expert_step_kernel", "_rope_qkv_kernel", "_small_m_kernel", "_partial_kernel",
                            "_merge_kernel"}, warmups
    print("ok")
    """
)


@needs_triton_39
def test_first_call_kernel_compile_thread_compiles_every_kernel_and_runs_none():
    """Engine._precompile_kernels (the first call of a compiled engine on the GPU): the uncompiled
    path in a thread with every launch recorded, then compiled (kernels/launch.py); with compile
    workers, they get the recorded launches first and are closed after."""
    run_in_interpreter(PRECOMPILE_SCRIPT, timeout=600)


def test_launch_compiles_only_inside_compile_only_and_only_in_its_thread():
    import threading

    from vlaperf.engine.kernels.launch import compile_only, launch

    class Kernel:
        def __init__(self):
            self.calls = []

        def __getitem__(self, grid):
            return lambda *a, **kw: self.calls.append(("run", grid, a, kw))

        def warmup(self, *a, grid, **kw):
            self.calls.append(("warmup", grid, a, kw))

    k = Kernel()
    launch(k, (2,), 1, X=3)
    with compile_only():
        launch(k, (4,), 5, X=6)
        other = threading.Thread(target=launch, args=(k, (7,), 8))  # another thread still launches
        other.start()
        other.join()
    launch(k, (9,), 10)
    fma = {"enable_fp_fusion": True}
    assert k.calls == [("run", (2,), (1,), {"X": 3, **fma}), ("warmup", (4,), (5,), {"X": 6, **fma}),
                       ("run", (7,), (8,), fma), ("run", (9,), (10,), fma)]


def test_recorded_launches_compile_in_threads_the_named_kernel_first():
    """compile_only(record=...) collects the launches without compiling; compile_recorded then
    compiles each kernel's launches in order, in threads, the kernels named `first` submitted
    first, and raises a compile's error."""
    import threading

    from vlaperf.engine.kernels.launch import compile_only, compile_recorded, launch

    log, lock = [], threading.Lock()

    class Kernel:
        def __init__(self, name):
            self.__name__ = name

        def __getitem__(self, grid):
            raise AssertionError("a recorded launch must not run")

        def warmup(self, *a, grid, **kw):
            if kw.get("fail"):
                raise ValueError("compile failed")
            with lock:
                log.append((self.__name__, grid, a, threading.current_thread().name))

    small, step = Kernel("_small"), Kernel("_expert_step_kernel")
    launches = []
    with compile_only(record=launches):
        launch(small, (1,), 1)
        launch(step, (2,), 2)
        launch(small, (3,), 3)
    assert not log and [r[0] for r in launches] == [small, step, small]
    with compile_only(record=[]):  # the flag and the record end with the block
        pass
    compile_recorded(launches, first=("_expert_step_kernel",), workers=1)  # one thread: submission order
    assert [(n, g, a) for n, g, a, _ in log] == [("_expert_step_kernel", (2,), (2,)), ("_small", (1,), (1,)),
                                                 ("_small", (3,), (3,))]
    assert all(t.startswith("vlaperf-kernel-compile") for *_, t in log)
    log.clear()
    compile_recorded(launches, first=("_expert_step_kernel",))
    assert sorted((n, g) for n, g, _, _ in log) == [("_expert_step_kernel", (2,)), ("_small", (1,)), ("_small", (3,))]
    assert [g for n, g, _, _ in log if n == "_small"] == [(1,), (3,)]  # one kernel's launches stay in order
    with pytest.raises(ValueError, match="compile failed"):
        compile_recorded([(small, (1,), (), {"fail": True})])


@needs_triton_39
def test_triton_kernels_compose_with_compile_without_graph_breaks():
    """The kernels are custom ops (kernels/ops.py), so the compiled step traces them whole."""
    run_in_interpreter(COMPILE_SCRIPT, timeout=900)


class OutOfResources(Exception):  # a stand-in with the name Triton's exception has (the levers match it by name)
    def __init__(self, message, required=None, limit=None):  # Triton's also holds what was asked for and what fits
        super().__init__(message)
        if required is not None:
            self.required, self.limit, self.name = required, limit, "shared memory"


def test_kernel_that_does_not_fit_the_gpu_is_a_clear_lever_error(monkeypatch):
    """Triton's OutOfResources (tiles too big for a GPU's shared memory) names the lever and the fix."""
    import torch

    import vlaperf.engine.kernels.small_m_matmul as K
    from vlaperf.engine.kernels.ops import small_m_matmul
    from vlaperf.engine.levers import LeverError

    def too_big(*a, **kw):  # in bfloat16 too (half the bytes, 120 KiB, above 99 KiB): the dtype is not the cause
        raise OutOfResources("out of resource: shared memory, Required: 245760, Hardware limit: 101376", 245760, 101376)

    monkeypatch.setattr(K, "small_m_matmul", too_big)
    with pytest.raises(LeverError, match="triton_kernels: the small_m_matmul kernel does not fit .*Run without the lever"):
        small_m_matmul(torch.randn(4, 8), torch.randn(6, 8))
    monkeypatch.setattr(K, "small_m_matmul", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):  # anything else passes through unchanged
        small_m_matmul(torch.randn(4, 8), torch.randn(6, 8))


def test_a_float32_model_is_named_where_its_tiles_are_what_does_not_fit(monkeypatch):
    """Every kernel's op names a float32 model as the cause where its bfloat16 tiles, half the bytes, would fit: on a
    GPU of 99 KiB a block (sm_86, sm_89) the float32 tiles of small_m_matmul's gate_up (128 KiB) and of the step's and
    the prefix's attention (101 and 139 KiB) do not fit, their bfloat16 ones (64, 51 and 70 KiB) do (Triton 3.6's
    sm_89 compiles at libero-pi0's shapes). Where half would not fit either (the step kernel there: 288 KiB in
    float32, 144 in bfloat16), or for a float32 head (float32 in a bfloat16 model too), the GPU is named, not the
    dtype."""
    from vlaperf.engine.kernels import expert_step as S
    from vlaperf.engine.kernels import ops, rope_qkv as R, small_m_matmul as K, suffix_attention as A
    from vlaperf.engine.levers import LeverError

    def fails(required, limit=101376):
        def launch(*a, **kw):
            raise OutOfResources(f"out of resource: shared memory, Required: {required}, Hardware limit: {limit}",
                                 required, limit)
        return launch

    as_float32 = "in float32 .*Run in bfloat16, or without the lever"
    as_gpu = r"does not fit [^(]*\(out of resource[^)]*\); its tiles are tuned for an H200 \(Hopper\)\. Run without"
    q, kv, mask = (1, 2, 3, 16), (1, 1, 5, 16), torch.ones(1, 3, 5, dtype=torch.bool)
    calls = {  # op -> (module, launcher, float32 bytes asked for, the call with tensors of `dtype`)
        "small_m_matmul": (K, "small_m_matmul", 131072, lambda t: ops.small_m_matmul(t(4, 8), t(6, 8))),
        "suffix_attention": (A, "suffix_attention", 103936,
                             lambda t: ops.suffix_attention(t(*q), t(*kv), t(*kv), mask)),
        "step_attention": (A, "suffix_attention", 103936, lambda t: ops.step_attention(t(*q), t(*kv), t(*kv), mask)),
        "prefix_attention": (A, "prefix_attention", 142336, lambda t: ops.prefix_attention(
            t(1, 2, 5, 16), t(*kv), t(*kv), torch.ones(1, 5, 5, dtype=torch.bool))),
        "rope_qkv": (R, "rope_qkv", 131072, lambda t: ops.rope_qkv(
            t(1, 5, 64), t(1, 5, 16), t(1, 5, 16), t(2, 1, 1, 8, 16), t(2, 1, 1, 8, 16), 0, 0, 2, 1)),
    }
    f32, bf16 = torch.randn, lambda *shape: torch.randn(*shape).bfloat16()
    for op, (module, name, required, call) in calls.items():
        monkeypatch.setattr(module, name, fails(required))
        with pytest.raises(LeverError, match=f"triton_kernels: the {name} kernel does not fit .*{as_float32}"):
            call(f32)
        with pytest.raises(LeverError, match=as_gpu):  # a bfloat16 model: the GPU (the same bytes, for the test)
            call(bf16)
        monkeypatch.setattr(module, name, fails(2 * 101376 + 4))  # half of it would not fit either
        with pytest.raises(LeverError, match=as_gpu):
            call(f32)
    monkeypatch.setattr(K, "small_m_matmul", fails(131072))
    with pytest.raises(LeverError, match=as_gpu):  # a float32 head
        ops.small_m_matmul(torch.randn(4, 8), torch.randn(6, 8), precision="tf32x3")
    a = _step_inputs(L=2)
    x = a.pop("x")
    monkeypatch.setattr(S, "expert_step", fails(294912))
    with pytest.raises(LeverError, match="megakernel: the expert_step kernel " + as_gpu):
        ops.expert_step(x, *a.values())
    monkeypatch.setattr(S, "expert_step", fails(393216, 232448))  # an H100 (session 65): 192 KiB in bfloat16
    with pytest.raises(LeverError, match="megakernel: the expert_step kernel does not fit .*" + as_float32):
        ops.expert_step(x, *a.values())


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


STEP_KERNEL_SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from dataclasses import asdict, replace
    from vlaperf.engine.kernels.expert_step import StepKernelConfig, expert_step
    from vlaperf.models.pi0 import apply_rope, eager_attention, rope_cos_sin

    def reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, eps, NH, HD):
        L, M, Tp, Fd = wqkv.shape[0], x.shape[0], kc.shape[1] - x.shape[0], wgu.shape[1] // 2
        rms = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
        for l in range(L):
            q, k, v = (rms(x) @ wqkv[l].T).split([NH * HD, HD, HD], -1)
            q = apply_rope(q.view(1, M, NH, HD).transpose(1, 2), cos[None], sin[None])
            k, v = apply_rope(k.view(1, 1, M, HD), cos[None], sin[None]), v.view(1, 1, M, HD)
            keys, vals = torch.cat([kc[l, :Tp][None, None], k], 2), torch.cat([vc[l, :Tp][None, None], v], 2)
            x = x + eager_attention(q, keys, vals, mask[None]).transpose(1, 2).reshape(M, NH * HD) @ wo[l].T
            n = rms(x)
            x = x + (F.gelu(n @ wgu[l, :Fd].T, approximate="tanh") * (n @ wgu[l, Fd:].T)) @ wd[l].T
        return x

    def modulated_reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, eps, NH, HD, mods):
        # pi0.5's layers: each norm modulated by its (scale, shift), each residual branch gated
        L, M, Tp, Fd = wqkv.shape[0], x.shape[0], kc.shape[1] - x.shape[0], wgu.shape[1] // 2
        rms = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
        for l in range(L):
            s1, b1, g1, s2, b2, g2 = mods[6 * l : 6 * l + 6]
            q, k, v = ((rms(x) * (1 + s1) + b1) @ wqkv[l].T).split([NH * HD, HD, HD], -1)
            q = apply_rope(q.view(1, M, NH, HD).transpose(1, 2), cos[None], sin[None])
            k, v = apply_rope(k.view(1, 1, M, HD), cos[None], sin[None]), v.view(1, 1, M, HD)
            keys, vals = torch.cat([kc[l, :Tp][None, None], k], 2), torch.cat([vc[l, :Tp][None, None], v], 2)
            x = x + (eager_attention(q, keys, vals, mask[None]).transpose(1, 2).reshape(M, NH * HD) @ wo[l].T) * g1
            n = rms(x) * (1 + s2) + b2
            x = x + ((F.gelu(n @ wgu[l, :Fd].T, approximate="tanh") * (n @ wgu[l, Fd:].T)) @ wd[l].T) * g2
        return x

    torch.manual_seed(0)
    small = StepKernelConfig(att_bm=16, att_bn=16, splits=3, merge_bd=16, bk_o=64, bk_down=64, num_warps=4)
    # the defaults split o_proj's and down's K in 4; also unsplit with the merge folded into attention,
    # 4 slices with gate_up split too, the attention's value loads issued after the scores (before
    # session 6's default), and each task starting its K loop and its key tiles at its own offset
    # (k_rotate), with 16-deep K blocks so that there are several to rotate; and attention / merge
    # waiting on counters instead of barriers (dataflow: here the counters are complete already,
    # one launch per phase, so this checks the counting and the waits' indexing, not the timing)
    configs = [small, replace(small, ks_o=1, ks_down=1, fold_merge=True), replace(small, ks_o=4, bn_down=8, ks_down=4, ks_gu=2),
               replace(small, att_early_v=False), replace(small, k_rotate=True, bk_qkv=16, bk_gu=16, bk_o=16, bk_down=16),
               replace(small, dataflow=True),
               # the norm statistics from o_proj's and down's writers, added after or (stats_ahead) loaded before the K loops
               replace(small, ssq_from_writers=True, stats_ahead=False), replace(small, ssq_from_writers=True, stats_ahead=True),
               replace(small, ssq_from_writers=True, stats_ahead=True, ks_o=1, bn_down=8, ks_down=4, ks_gu=2),
               replace(small, rope_ahead=False),  # qkv's RoPE tables loaded after its K loop (before session 14)
               # qkv's tasks as runs of rotary pairs across the slots: 5 (a run spans two slots, the last is
               # short), 16 (whole slots and more), with the tables ahead, and with one row a task's lanes
               replace(small, qkv_pairs=5), replace(small, qkv_pairs=16), replace(small, qkv_pairs=5, rope_ahead=False),
               replace(small, qkv_pairs=1),
               replace(small, qkv_pairs=0),  # (small's default, -1, fits 12 or 16 pairs a task to the 4 programs)
               # the norm statistics summed on the tensor cores, also with gate_up split in K (partial sums)
               replace(small, ssq_mma=True), replace(small, ssq_mma=True, ks_gu=2, bn_down=8),
               # the squares summed across the threads in every K block (before session 15's ssq_local)
               replace(small, ssq_local=False), replace(small, ssq_local=False, ks_gu=2, bn_down=8),
               # qkv's rotary halves and gate_up's gate and up as two products (before session 16's one_dot), also
               # with gate_up split in K, with qkv's tasks as runs of pairs, and with the squares summed per K block
               replace(small, one_dot=False), replace(small, one_dot=False, ks_gu=2, bn_down=8),
               replace(small, one_dot=False, qkv_pairs=5), replace(small, one_dot=False, ssq_local=False),
               # attention's value / output dims in parts a task (att_dsplit): 2 and 4 parts, with 32-row blocks
               replace(small, att_dsplit=2), replace(small, att_dsplit=4, att_bm=32), replace(small, att_dsplit=2, att_early_v=False)]
    # (layers, D, heads, head dim, F, rows, prefix): head dim 16 has 8-dim RoPE halves, less than a tile
    for L, D, NH, HD, Fd, M, Tp in [(2, 32, 4, 16, 64, 11, 20), (1, 64, 2, 32, 96, 7, 45)]:
        x = torch.randn(M, D)
        wqkv, wo = torch.randn(L, NH * HD + 2 * HD, D) / D**0.5, torch.randn(L, D, NH * HD) / (NH * HD) ** 0.5
        wgu, wd = torch.randn(L, 2 * Fd, D) / D**0.5, torch.randn(L, D, Fd) / Fd**0.5
        kc, vc = torch.randn(L, Tp + M, HD), torch.randn(L, Tp + M, HD)
        cos, sin = (t[0] for t in rope_cos_sin(Tp + torch.arange(M)[None], HD, 10000.0, torch.float32))
        mask = torch.rand(M, Tp + M) > 0.2
        mask[:, 0] = True
        ref = reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, NH, HD)
        kc[:, Tp:] = float("nan")  # the cache's suffix slots are never read: the step's own k/v are scratch
        vc[:, Tp:] = float("nan")
        for cfg in configs:
            out = expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=cfg)
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, (L, D, NH, HD, cfg, err)
        # several samples in one launch, each with its own cache, positions and mask: 3 samples
        # (one block of 64 rows or fewer) and 7 (77 or 49 rows: a 128- or 64-row block, K blocks
        # halved for 128); each must equal its own single-sample reference
        for B in (3, 7):
            xb = torch.randn(B, M, D)
            kcb, vcb = torch.randn(L, B, Tp + M, HD), torch.randn(L, B, Tp + M, HD)
            tables = [rope_cos_sin(Tp - b + torch.arange(M)[None], HD, 10000.0, torch.float32) for b in range(B)]
            cosb, sinb = torch.stack([c[0] for c, _ in tables]), torch.stack([s_[0] for _, s_ in tables])
            maskb = torch.rand(B, M, Tp + M) > 0.2
            maskb[:, :, 0] = True
            refs = torch.stack([reference(xb[b], wqkv, wo, wgu, wd, kcb[:, b], vcb[:, b], cosb[b], sinb[b], maskb[b], 1e-6,
                                          NH, HD) for b in range(B)])
            for cfg in (small, replace(small, fold_merge=True, ks_o=1), replace(small, dataflow=True),
                        replace(small, ssq_from_writers=True, stats_ahead=True), replace(small, qkv_pairs=5),
                        replace(small, att_dsplit=2, att_bm=32),
                        # the K loops' products as a batch of 16-row products (sub_m): 2 or 8 a K block
                        replace(small, sub_m=16), replace(small, sub_m=16, ks_gu=2, bn_down=8)):
                out = expert_step(xb, wqkv, wo, wgu, wd, kcb, vcb, cosb, sinb, maskb, 1e-6, config=cfg)
                assert out.shape == (B, M, D)
                err = ((out - refs).norm(dim=(1, 2)) / refs.norm(dim=(1, 2))).max().item()
                assert err < 1e-5, (B, L, D, NH, HD, cfg, err)
        # pi0.5: adaptive norms (n (1 + scale) + shift) and gated residuals, from the kernel's table
        from vlaperf.engine.kernels.expert_step import modulation_table
        mods = torch.randn(2, 6 * L + 2, D) * 0.5  # two steps of a schedule; the last 2 rows: the final norm
        table = modulation_table(mods, wqkv, wgu)
        assert table.shape == (2, L, 4 * D + NH * HD + 2 * HD + 2 * Fd) and table.dtype == torch.float32
        for step in range(2):
            ref = modulated_reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, NH, HD, mods[step])
            # (stats_ahead is a default: the statistics added after the loop as before, too)
            for cfg in (small, replace(small, ks_o=1, ks_down=1), replace(small, ks_gu=2, bn_down=8),
                        replace(small, stats_ahead=False), replace(small, stats_ahead=False, ks_o=1, ks_down=1, ks_gu=2),
                        replace(small, early_mod_loads=True), replace(small, early_mod_loads=True, ks_o=1, ks_down=1),
                        replace(small, scale_after_loop=True), replace(small, scale_after_loop=True, ks_o=1, ks_down=1),
                        replace(small, stats_ahead=True), replace(small, stats_ahead=True, ks_o=1, ks_down=1, ks_gu=2),
                        replace(small, stats_ahead=True, ssq_from_writers=True), replace(small, rope_ahead=False),
                        replace(small, qkv_pairs=5), replace(small, qkv_pairs=5, stats_ahead=False),
                        replace(small, one_dot=False), replace(small, one_dot=False, ks_gu=2, bn_down=8)):
                out = expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=cfg, mod=table[step])
                err = ((out - ref).norm() / ref.norm()).item()
                assert err < 1e-5, ("pi0.5", step, cfg, err)
    try:
        expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, mod=table[0, :, :-1])
        raise SystemExit("a modulation table of the wrong width must be refused")
    except ValueError as e:
        assert "mod has shape" in str(e), e
    from vlaperf.engine.kernels.expert_step import barrier_timeouts, fit_config, last_launch
    assert barrier_timeouts("cpu") == 0  # no wait gave up (a short count would spin until it did)
    # the last launch is recorded with its fitted fields resolved for its shape and the interpreter's 4 programs
    expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=replace(small, splits=0, merge_bd=0))
    launched = last_launch("cpu")
    assert launched == {"config": asdict(fit_config(replace(small, splits=0, merge_bd=0), M, 1, NH, HD, Tp + M, 4)),
                        "rows": M, "samples": 1, "keys": Tp + M, "programs": 4}, launched
    assert launched["config"]["splits"] > 0 and launched["config"]["merge_bd"] > 0 and launched["config"]["qkv_pairs"] >= 0
    try:
        expert_step(x, wqkv[:, :-1], wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6)
        raise SystemExit("a wrong weight shape must be refused")
    except ValueError as e:
        assert "wqkv has shape" in str(e) and "expected" in str(e), e
    try:
        expert_step(torch.randn(37, 7, D), wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6)
        raise SystemExit("37 x 7 rows must be refused")
    except ValueError as e:
        assert "at most 256 suffix rows" in str(e), e
    try:  # batched x with a one-sample cache
        expert_step(torch.randn(2, M, D), wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6)
        raise SystemExit("a cache without the batch axis must be refused for batched x")
    except ValueError as e:
        assert "k_cache has shape" in str(e) and f"expected ({L}, 2, {Tp + M}, {HD})" in str(e), e
    try:  # token rows 17 floats apart: not 16-byte aligned, so not loadable as vectors
        odd = torch.randn(L, Tp + M, HD + 1)[..., :HD]
        expert_step(x, wqkv, wo, wgu, wd, odd, odd, cos, sin, mask, 1e-6)
        raise SystemExit("a misaligned cache must be refused")
    except ValueError as e:
        assert "16-byte aligned" in str(e), e
    try:
        expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=replace(small, dataflow=True, fold_merge=True))
        raise SystemExit("dataflow with a folded merge must be refused")
    except ValueError as e:
        assert "dataflow and fold_merge" in str(e), e
    for bad, words in ((replace(small, qkv_pairs=17), "qkv_pairs=17: expected -1 (fitted), 0 (per-slot tiles) or 1..bn_qkv (16)"),
                       (replace(small, qkv_pairs=5, dataflow=True), "qkv_pairs excludes dataflow"),
                       (replace(small, poll_depth=5), "poll_depth=5, poll_gap=128: expected a depth of 1 to 4"),
                       (replace(small, poll_depth=2, poll_one=False), "it needs barrier_asm and poll_one"),
                       (replace(small, att_dsplit=3), "att_dsplit=3: expected a divisor of the head dim"),
                       (replace(small, att_dsplit=2, fold_merge=True), "att_dsplit > 1 excludes dataflow and fold_merge")):
        try:
            expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=bad)
            raise SystemExit(f"{bad} must be refused")
        except ValueError as e:
            assert words in str(e), e
    # width 48 in 16-column tiles: 3 statistics tiles, not one power-of-two block: stats_ahead falls back to
    # adding them after the loop, and the result is still the layers' (pi0 with ssq_from_writers, and pi0.5)
    from vlaperf.engine.kernels.expert_step import ssq_constexprs
    odd = replace(small, stats_ahead=True, ssq_from_writers=True, bn_o=16, bn_down=16)
    assert not ssq_constexprs(odd, False, 48)["STATS_AHEAD"] and ssq_constexprs(odd, False, 64)["STATS_AHEAD"]
    L, D, NH, HD, Fd, M, Tp = 1, 48, 2, 16, 32, 5, 12
    x = torch.randn(M, D)
    wqkv, wo = torch.randn(L, NH * HD + 2 * HD, D) / D**0.5, torch.randn(L, D, NH * HD) / (NH * HD) ** 0.5
    wgu, wd = torch.randn(L, 2 * Fd, D) / D**0.5, torch.randn(L, D, Fd) / Fd**0.5
    kc, vc = torch.randn(L, Tp + M, HD), torch.randn(L, Tp + M, HD)
    cos, sin = (t[0] for t in rope_cos_sin(Tp + torch.arange(M)[None], HD, 10000.0, torch.float32))
    mask = torch.ones(M, Tp + M, dtype=torch.bool)
    out = expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=odd)
    ref0 = reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, NH, HD)
    assert ((out - ref0).norm() / ref0.norm()).item() < 1e-5
    mods = torch.randn(1, 6 * L + 2, D) * 0.5
    out = expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=odd,
                      mod=modulation_table(mods, wqkv, wgu)[0])
    ref5 = modulated_reference(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, NH, HD, mods[0])
    assert ((out - ref5).norm() / ref5.norm()).item() < 1e-5
    try:
        expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=replace(small, ks_down=5))
        raise SystemExit("a split that does not divide F must be refused")
    except ValueError as e:
        assert "ks_down=5" in str(e) and "divisor" in str(e), e
    try:
        expert_step(x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, 1e-6, config=replace(small, prefetch=7))
        raise SystemExit("an unknown prefetch plan must be refused, on the CPU too")
    except ValueError as e:
        assert "prefetch=7" in str(e) and "plan" in str(e), e
    # every plan names real phases and weights, each weight prefetched at most once
    from vlaperf.engine.kernels.expert_step import PHASES, PREFETCH_PLANS, prefetch_phases
    assert all(set(plan) <= set(PHASES) for plan in PREFETCH_PLANS.values())
    for n in PREFETCH_PLANS:
        at = prefetch_phases(n)
        assert set(at) == {"PF_O", "PF_GU", "PF_DOWN", "PF_QKV_NEXT"} and all(-1 <= v < len(PHASES) for v in at.values())
        assert sum(len(ws) for ws in PREFETCH_PLANS[n].values()) == sum(v >= 0 for v in at.values())
    assert set(prefetch_phases(0).values()) == {-1}
    print("ok")
    """
)


@needs_triton_39
def test_step_kernel_matches_torch_layers_in_the_interpreter():
    """The `megakernel` step kernel, run as one launch per (layer, phase): the interpreter runs
    programs one after another, so the grid barriers of the GPU launch cannot run there. On
    the GPU, benchmarks/expert_step_bench.py checks the persistent launch bit for bit against
    these per-phase launches and reads every barrier counter back."""
    run_in_interpreter(STEP_KERNEL_SCRIPT, timeout=600)


MEGAKERNEL_LEVER_SCRIPT = TINY_SETUP + textwrap.dedent(
    """

    import vlaperf.engine.kernels.expert_step as S
    calls = []
    real = S.expert_step
    S.expert_step = lambda *a, **kw: calls.append(1) or real(*a, **kw)

    variants = ["for_loop,static_kv_cache,fuse_projections,megakernel",
                "for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections,triton_kernels,megakernel"]
    for levers in variants:
        out = Engine(model, levers).sample_actions(obs, noise, w.steps)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-4, (levers, err)
    assert len(calls) == 4 * 2, len(calls)  # one kernel per step (4 steps), both variants
    # compiled (aot_eager traces the custom op's fake as inductor would; fullgraph=True: no breaks)
    engine = Engine(model, variants[1] + ",compile", compile_backend="aot_eager")
    out = engine.sample_actions(obs, noise, w.steps)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-4
    assert len(calls) == 4 * 3, len(calls)
    # batch 2 (22 suffix rows over two prefixes) falls back to the layer-by-layer path, still exact
    w2 = get_workload("tiny")
    import dataclasses
    w2 = dataclasses.replace(w2, batch=2)
    obs2, noise2 = random_observation(w2, model.config, seed=5), random_noise(w2, model.config, seed=5)
    out2 = Engine(model, variants[0]).sample_actions(obs2, noise2, w.steps)
    ref2 = model.sample_actions(obs2, noise2, w.steps)
    assert ((out2 - ref2).norm() / ref2.norm()).item() < 1e-4
    assert len(calls) == 4 * 3, len(calls)
    # megakernel=batched: both samples through one launch a step, still exact
    out2b = Engine(model, variants[0].replace("megakernel", "megakernel=batched")).sample_actions(obs2, noise2, w.steps)
    assert ((out2b - ref2).norm() / ref2.norm()).item() < 1e-4
    assert len(calls) == 4 * 4, len(calls)
    # pi0.5: its adaptive norms go to the kernel as a per-step table (fusion.step_kernel_modulation)
    from vlaperf.models.pi0 import get_config
    m5 = build_model(get_config("tiny", pi05=True), "cpu", torch.float32, seed=0)
    obs5, noise5 = random_observation(w, m5.config, seed=4), random_noise(w, m5.config, seed=4)
    ref5 = m5.sample_actions(obs5, noise5, w.steps)
    before = len(calls)
    for levers in (variants[1], variants[1] + ",compile"):
        out5 = Engine(m5, levers, compile_backend="aot_eager").sample_actions(obs5, noise5, w.steps)
        assert ((out5 - ref5).norm() / ref5.norm()).item() < 1e-4, levers
    assert len(calls) == before + 4 * 2, len(calls)  # the kernel ran every step, eager and compiled
    # and two pi0.5 samples in one launch a step (megakernel=batched): one table for both
    obs52, noise52 = random_observation(w2, m5.config, seed=5), random_noise(w2, m5.config, seed=5)
    ref52 = m5.sample_actions(obs52, noise52, w.steps)
    out52 = Engine(m5, variants[0].replace("megakernel", "megakernel=batched")).sample_actions(obs52, noise52, w.steps)
    assert ((out52 - ref52).norm() / ref52.norm()).item() < 1e-4
    assert len(calls) == before + 4 * 3, len(calls)
    # serving frees the reference's copies, the expert's o/down too (the engine reads them from its stack)
    engine = Engine(model, variants[0])
    before = engine.sample_actions(obs, noise, w.steps)
    oc = sum(l.self_attn.o_proj.weight.numel() + l.mlp.down_proj.weight.numel() for l in model.expert.layers) * 4
    freed = engine.release_reference_weights()
    assert freed > oc and all(l.self_attn.o_proj.weight.numel() == 0 for l in model.expert.layers), freed
    assert torch.equal(engine.sample_actions(obs, noise, w.steps), before)
    assert torch.equal(engine.sample_actions(obs2, noise2, w.steps), out2)  # batch 2: the per-layer path, views
    # vlaperf bench records the step kernel's tiling as launched: its fitted fields resolved for pi0's suffix
    # (the state token and the action horizon) and the interpreter's 4 programs
    import json, os, tempfile
    from vlaperf.cli import main
    path = os.path.join(tempfile.mkdtemp(), "bench.json")
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", variants[0], "--warmup", "0",
                 "--iters", "1", "--no-progress", "--json", path]) == 0
    launched = json.load(open(path))["step_kernel"]
    assert (launched["rows"], launched["samples"], launched["programs"]) == (noise.shape[1] + 1, 1, 4), launched
    assert launched["config"]["splits"] >= 1 and launched["config"]["merge_bd"] >= 1 and launched["config"]["qkv_pairs"] >= 0
    print("ok")
    """
)


@needs_triton_39
def test_megakernel_lever_matches_reference_and_compiles_without_graph_breaks():
    run_in_interpreter(MEGAKERNEL_LEVER_SCRIPT, timeout=900)


def test_step_kernel_attention_loads_cache_rows_as_vectors():
    """Compiled for sm_90a on this CPU machine (benchmarks/kernel_resources.py): the attention
    phase loads its K/V rows as 16-byte vectors. Before the cached and scratch rows went
    through one aligned row pointer, Triton 3.9 issued 2-byte loads for them (256 a thread
    per key tile) and spilled registers; this guards the kernel against the Triton installed."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import kernel_resources as resources

    for early_v in (False, True):  # values loaded after the scores, or issued with the keys
        r = resources.compile_kernel(resources._attention_alone,
                                     dict(ABM=32, ABN=64, SPLITS=10, MD=32, ATT_STAGES=1, EARLY_V=early_v),
                                     num_warps=8, num_stages=3, ptxas=False)
        assert not [op for op in r["loads"] if op.endswith(".b16")], r["loads"]  # no element-wise bf16 loads
        # q (32 x 256), then a 64 x 256 K and V tile per key tile: 16-byte loads
        assert r["loads"].get("ld.global.cg.v4.b32", 0) >= 16, (early_v, r["loads"])


def test_attention_kernel_multiplies_float32_in_full_precision_and_bfloat16_on_tensor_cores():
    """suffix_attention's kernel compiled for sm_90 on this CPU machine: with float32 operands its dots are FMA
    instructions (IEEE float32, as torch's float32 attention), not tensor-core TF32, which put a float32 libero-pi0
    at 7.9e-4 rel L2 against float32's 1e-4 on an H100 (session 66); with bfloat16 operands they stay tensor-core
    MMAs. Both at the step's and the prefix's tiles, whose float32 shared memory fits Hopper's 232,448 bytes."""
    import inspect
    import re

    import triton
    from triton.backends.compiler import GPUTarget

    from vlaperf.engine.kernels.suffix_attention import PREFIX_TILES, _partial_kernel
    from vlaperf.models.pi0 import ATTENTION_MASK_VALUE

    def compiled(dtype: str, precision, block_m: int, block_n: int, splits: int):
        names = list(inspect.signature(_partial_kernel.fn).parameters)
        constexprs = dict(MASK_VALUE=ATTENTION_MASK_VALUE, HEAD_DIM=256, BLOCK_M=block_m, BLOCK_N=block_n,
                          SPLITS=splits, PRECISION=precision, USE_PDL=False)
        signature = {n: "constexpr" if n in constexprs else "*fp32" if n in ("acc_ptr", "m_ptr", "l_ptr")
                     else "*u8" if n == "mask_ptr" else dtype if n.endswith("_ptr") else "fp32" if n == "scale"
                     else "i32" for n in names}
        hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
        source = triton.compiler.ASTSource(fn=_partial_kernel, signature=signature, constexprs=constexprs, attrs=hints)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))

    for block_m, block_n, splits in ((32, 32, 5), (PREFIX_TILES["block_m"], PREFIX_TILES["block_n"], 3)):
        full = compiled("*fp32", "ieee", block_m, block_n, splits)
        ptx = full.asm["ptx"]
        assert not re.search(r"\b(w?gmma|mma)\.", ptx) and len(re.findall(r"\bfma\.rn\.f32", ptx)) > 1000
        assert full.metadata.shared <= 232_448, full.metadata.shared
        assert re.search(r"\b(wgmma|mma)\.", compiled("*bf16", None, block_m, block_n, splits).asm["ptx"])


@needs_triton_39
def test_step_kernel_multiplies_float32_in_full_precision():
    """The step kernel (`megakernel`) compiled for sm_90a on this CPU machine with float32 weights and activations,
    at the row counts where its float32 tiles fit a Hopper block (pi0.5's 10 rows, pi0's 11): every dot (the
    matmuls, the attention, the norm statistics) is FMA instructions, IEEE float32 as torch's float32 matmul,
    not tensor-core TF32 (~1e-3 rel a product, as suffix_attention's dots put float32 libero-pi0 at 7.9e-4 rel L2
    against float32's 1e-4 on an H100 in session 66). The same kernel in bfloat16 keeps its tensor-core MMAs."""
    resources = _resources()
    from vlaperf.engine.kernels import expert_step as S

    mma = re.compile(r"\b(w?gmma|mma)\.")
    shape = resources.M, resources.TK
    try:
        for rows, mod in ((10, True), (11, False)):
            resources.M, resources.TK = rows, 586
            cfg = S.StepKernelConfig()
            consts = resources.whole_kernel_constexprs(cfg, mod=mod)
            for weights in ("*fp32", "*bf16"):
                r = resources.compile_kernel(S._expert_step_kernel, consts, cfg.num_warps, cfg.num_stages, ptxas=False,
                                             weights=weights)
                ptx = resources.last_ptx()
                if weights == "*fp32":
                    assert not mma.search(ptx) and len(re.findall(r"\bfma\.rn\.f32", ptx)) > 1000, (rows, mod)
                    assert r["shared_bytes"] <= 232_448, (rows, mod, r["shared_bytes"])
                else:
                    assert mma.search(ptx), (rows, mod)
    finally:
        resources.M, resources.TK = shape


def _synthetic_timeline(L=2, phases=7, programs=3):
    """Readings for a launch where, in every (layer, phase), program p works 2 + p us
    starting at the slot's start + p * 0.1 us, all pass the barrier 0.5 us after the last
    arrival, and the next phase starts 0.2 us later; the empty phase (6) never runs."""
    import torch

    ts = torch.zeros(L, phases, programs, 3, dtype=torch.int64)
    t = 1_000_000
    for layer in range(L):
        for ph in range(6):
            for p in range(programs):
                ts[layer, ph, p, 0] = t + 100 * p
                ts[layer, ph, p, 1] = t + 100 * p + 1000 * (2 + p)
            last = int(ts[layer, ph, :, 1].max())
            ts[layer, ph, :, 2] = last + 500
            t = last + 700
    return ts


def test_timeline_summary_reads_slots_work_and_barriers():
    from vlaperf.engine.kernels.expert_step import PHASES, timeline_summary

    ts = _synthetic_timeline()
    s = timeline_summary(ts, (0, 6))
    assert set(s["phases"]) == set(PHASES) and s["programs"] == 3 and s["layers"] == 2
    qkv = s["phases"]["qkv"]
    # the last program starts 0.2 us late and works 4 us: the slot is 4.2 + 0.5 + 0.2 us
    assert qkv["slot"] == pytest.approx(4.9) and qkv["slot_total_us"] == pytest.approx(9.8)
    assert (qkv["work_min"], qkv["work_median"], qkv["work_max"]) == pytest.approx((2.0, 3.0, 4.0))
    assert qkv["start_skew"] == pytest.approx(0.2) and qkv["release"] == pytest.approx(0.5)
    # the very last phase ends at its last arrival (the kernel's end syncs it): no barrier reading
    assert s["total_us"] == pytest.approx(12 * 4.9 - 0.7)
    assert s["work_share"] == pytest.approx(12 * 3.0 / (12 * 4.9 - 0.7))


def test_timeline_needs_a_persistent_cuda_launch():
    import torch

    from vlaperf.engine.kernels.expert_step import expert_step

    L, D, NH, HD, F, M, Tk = 1, 32, 2, 16, 64, 4, 16
    w = lambda *s: torch.zeros(*s)  # noqa: E731
    args = (w(M, D), w(L, NH * HD + 2 * HD, D), w(L, D, NH * HD), w(L, 2 * F, D), w(L, D, F), w(L, Tk, HD), w(L, Tk, HD),
            w(M, HD), w(M, HD), torch.ones(M, Tk, dtype=torch.bool), 1e-6)
    with pytest.raises(ValueError, match="timeline needs a persistent launch on CUDA"):
        expert_step(*args, persistent=False, timeline=torch.zeros(L, 7, 4, 3, dtype=torch.int64))


@needs_triton_39
def test_step_kernel_compiles_for_hopper_with_its_inline_ptx():
    """The whole step kernel compiled for sm_90a and assembled by ptxas (Triton's bundled one)
    on this CPU machine: the inline PTX the GPU launch relies on (the one-thread barrier poll
    with its spin loop, the clock reads of the timeline) must assemble, in both barrier
    variants, and the L2 prefetches (of the programs idle in qkv, `idle_prefetch`, and by plan,
    `prefetch`); with and
    without rotated K loops, still pipelined; and for 4 samples in one launch; pi0.5's with and
    without `mod_prefetch`. The interpreter cannot run any of it."""
    from dataclasses import replace

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import kernel_resources as resources

    from vlaperf.engine.kernels import expert_step as S

    configs = ((S.StepKernelConfig(), True, 1), (replace(S.StepKernelConfig(), poll_one=False, idle_prefetch=2), False, 1),
               (replace(S.StepKernelConfig(), k_rotate=True), False, 1), (S.StepKernelConfig(), False, 4),
               (replace(S.StepKernelConfig(), dataflow=True), False, 1),
               (replace(S.StepKernelConfig(), idle_prefetch=0, prefetch=2), False, 1),
               (replace(S.StepKernelConfig(), idle_prefetch=0), False, 1),
               (replace(S.StepKernelConfig(), rope_ahead=False), False, 1),
               (replace(S.StepKernelConfig(), qkv_pairs=10), False, 1),
               (replace(S.StepKernelConfig(), ssq_mma=True, bk_qkv=64, bk_gu=64), False, 1),
               (replace(S.StepKernelConfig(), ssq_local=False), False, 1),
               (replace(S.StepKernelConfig(), poll_depth=4, poll_gap=64), False, 1),
               (replace(S.StepKernelConfig(), one_dot=False), False, 1),
               (replace(S.StepKernelConfig(), att_bm=32, att_dsplit=2), False, 1),
               (replace(S.StepKernelConfig(), sub_m=16), False, 1))
    for cfg, timeline, samples in configs:
        consts = resources.whole_kernel_constexprs(cfg, timeline, samples)
        r = resources.compile_kernel(S._expert_step_kernel, consts, cfg.num_warps, cfg.num_stages, ptxas=True)
        assert r["registers"] <= 255 and r["shared_bytes"] <= 227 * 1024, r
        ptx = resources.last_ptx()
        assert ("%globaltimer" in ptx) == timeline
        # thread 0's spin loop, present only with poll_one; with poll_depth, relaxed reads a clock gap apart
        assert ("SPIN" in ptx) == (cfg.poll_one and cfg.poll_depth == 1)
        polls = ptx.count("ld.relaxed.gpu.global.u32")  # each barrier: depth reads first, depth in its loop
        assert (polls > 0 and polls % (2 * cfg.poll_depth) == 0 if cfg.poll_depth > 1 else "%clock" not in ptx), cfg
        assert ("prefetch.global.L2" in ptx) == (cfg.idle_prefetch > 0 or cfg.prefetch > 0)
        # the K loops stay software-pipelined (asynchronous copies to shared memory): a modulo on
        # a strided loop variable once stopped that for k_rotate, and the kernel spilled. One
        # sample compiles without spills; 4 samples (a 256-row block) spilled 32 B under Triton 3.6
        assert r["async_copies"] >= 100 and r["spill_store_bytes"] <= (0 if samples == 1 else 256), (cfg, samples, r)
    # pi0.5 (the modulated norms), with and without the idle programs' prefetch of the modulation table
    # at libero-pi05's shape (10 rows over 586 keys), where the defaults fit 10 qkv pairs and 10 key splits
    prefetches = {}
    shape = resources.M, resources.TK
    resources.M, resources.TK = 10, 586
    try:
        for mod_prefetch in (False, True):
            cfg = replace(S.StepKernelConfig(), mod_prefetch=mod_prefetch)
            consts = resources.whole_kernel_constexprs(cfg, mod=True)
            assert (consts["QKV_PAIRS"], consts["SPLITS"], consts["BLOCK_M"]) == (10, 10, 16), consts
            r = resources.compile_kernel(S._expert_step_kernel, consts, cfg.num_warps, cfg.num_stages, ptxas=True)
            # (under the GPU's Triton 3.6 this kernel spills 8-12 B, at the defaults before this session too)
            assert r["registers"] <= 255 and r["spill_store_bytes"] <= 64, (mod_prefetch, r)
            prefetches[mod_prefetch] = resources.last_ptx().count("prefetch.global.L2")
    finally:
        resources.M, resources.TK = shape
    assert prefetches[True] > prefetches[False] > 0, prefetches


def _resources():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import kernel_resources

    return kernel_resources


def test_launch_gives_pdl_only_to_kernels_that_wait_and_only_where_the_gpu_has_it(monkeypatch):
    """`launch` hands USE_PDL (and the PDL launch option) to the kernels that take it, and only
    where `pdl_here(kernel)`: a kernel named in PDL_KERNELS, on a CUDA GPU of compute capability
    9+, never in the interpreter; a kernel without USE_PDL is launched as it was, since launching
    it with PDL would let it read before the kernel it follows has written."""
    # imported before TRITON_INTERPRET is set below: Triton picks the interpreter when a kernel is defined
    from vlaperf.engine.kernels import expert_step, rope_qkv, small_m_matmul, suffix_attention
    from vlaperf.engine.kernels import launch as L

    class FakeKernel:
        def __init__(self, name, arg_names):
            self.__name__, self.arg_names, self.calls = name, arg_names, []

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))

    waits = FakeKernel("_small_m_kernel", ["x_ptr", "N", "USE_PDL"])
    plain = FakeKernel("_small_m_kernel", ["x_ptr", "N"])
    assert not L.PDL_KERNELS  # off by default (session 21: no variant measured faster yet)
    monkeypatch.setattr(L, "PDL_KERNELS", L.DENOISE_LOOP_KERNELS)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU (the H200 has one)
    for kernel in (waits, plain):
        L.launch(kernel, (4,), "x", 7, BLOCK=16)
    assert not L.pdl_here(waits)
    fma = {"enable_fp_fusion": True}  # every launch asks for fused multiply-add (the next test)
    assert waits.calls == [((4,), ("x", 7), {"BLOCK": 16, "USE_PDL": False, **fma})]
    assert plain.calls == [((4,), ("x", 7), {"BLOCK": 16, **fma})]
    # a Hopper GPU: the listed kernels get PDL, the others not
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(L, "_device_has_pdl", lambda index: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    L.launch(waits, (4,), "x", 7)
    L.launch(plain, (4,), "x", 7)
    assert waits.calls[-1][2] == {"USE_PDL": True, "launch_pdl": True, **fma}
    assert plain.calls[-1][2] == fma
    prefix_kernel = FakeKernel("_partial_kernel", ["q_ptr", "USE_PDL"])
    L.launch(prefix_kernel, (4,), "q")
    assert prefix_kernel.calls[-1][2] == {"USE_PDL": False, **fma}  # not a denoise-loop kernel
    monkeypatch.setattr(L, "_device_has_pdl", lambda index: False)  # an Ampere GPU
    assert not L.pdl_here(waits)
    monkeypatch.setattr(L, "_device_has_pdl", lambda index: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not L.pdl_here(waits)
    # every kernel the engine launches takes USE_PDL (each waits before its first access), and
    # PDL_KERNELS names only kernels that exist
    kernels = (expert_step._expert_step_kernel, expert_step._mod_prologue_kernel, rope_qkv._rope_qkv_kernel,
               small_m_matmul._small_m_kernel, small_m_matmul._reduce_kernel, suffix_attention._partial_kernel,
               suffix_attention._merge_kernel)
    for kernel in kernels:
        assert kernel.arg_names[-1] == "USE_PDL", kernel
    assert L.DENOISE_LOOP_KERNELS <= {k.__name__ for k in kernels}


def test_launch_asks_for_fused_multiply_add_which_triton_compiles_into_the_kernel():
    """Triton 3.9 warns that its default for kernels that do not ask turns fused multiply-add off in 3.10: `launch`
    asks for it by name, in real launches, compile-only passes and recorded ones (which the compile workers
    replay), so a new Triton compiles the kernels every figure was measured with. A caller's own choice stands.
    The option is one Triton's CUDA backend takes (a misspelt one is a KeyError at the first launch on a GPU),
    and it is what puts fma into the merge kernel's PTX."""
    from triton.backends.nvidia.compiler import CUDAOptions

    from vlaperf.engine.kernels import launch as L
    from vlaperf.engine.kernels import suffix_attention as A

    class FakeKernel:
        def __init__(self):
            self.__name__, self.arg_names, self.calls, self.warmups = "_merge_kernel", ["x_ptr"], [], []

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.calls.append(kwargs)

        def warmup(self, *args, grid, **kwargs):
            self.warmups.append(kwargs)

    kernel = FakeKernel()
    L.launch(kernel, (1,), "x")
    L.launch(kernel, (1,), "x", enable_fp_fusion=False)
    assert kernel.calls == [{"enable_fp_fusion": True}, {"enable_fp_fusion": False}]
    with L.compile_only():
        L.launch(kernel, (1,), "x")
    recorded = []
    with L.compile_only(record=recorded):
        L.launch(kernel, (1,), "x")
    assert kernel.warmups == [{"enable_fp_fusion": True}] and recorded[0][3] == {"enable_fp_fusion": True}
    assert "enable_fp_fusion" in CUDAOptions.__dataclass_fields__
    resources = _resources()
    consts = dict(HEAD_DIM=256, BLOCK_M=32, BLOCK_D=64, SPLITS=5, USE_PDL=False)
    fmas = []
    for fusion in (True, False):
        resources.compile_kernel(A._merge_kernel, consts, 4, 2, ptxas=False, fp_fusion=fusion)
        fmas.append(len(re.findall(r"\bfma\.rn\.f32", resources.last_ptx())))
    assert fmas[0] > 0 and fmas[1] == 0, fmas


def test_kernels_launched_with_pdl_wait_before_anything_else_when_compiled_for_hopper():
    """Compiled for sm_90 on this CPU machine: with USE_PDL the merge kernel's PTX waits for
    the kernel before it (griddepcontrol.wait) ahead of its first global load, then releases
    the next one; without it there is no such instruction. The step kernel at its defaults
    still assembles without spills with the wait in it."""
    from vlaperf.engine.kernels import expert_step as S
    from vlaperf.engine.kernels import suffix_attention as A

    resources = _resources()
    consts = dict(HEAD_DIM=256, BLOCK_M=32, BLOCK_D=64, SPLITS=5)
    for use in (False, True):
        resources.compile_kernel(A._merge_kernel, {**consts, "USE_PDL": use}, 4, 2, ptxas=False)
        ptx = resources.last_ptx()
        assert ("griddepcontrol.wait" in ptx) == use and ("griddepcontrol.launch_dependents" in ptx) == use
        if use:
            assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    cfg = S.StepKernelConfig()
    consts = {**resources.whole_kernel_constexprs(cfg, False, 1), "USE_PDL": True}
    r = resources.compile_kernel(S._expert_step_kernel, consts, cfg.num_warps, cfg.num_stages, ptxas=True)
    ptx = resources.last_ptx()
    assert "griddepcontrol.wait" in ptx and ptx.index("griddepcontrol.wait") < ptx.index("ld.global"), r
    assert r["registers"] <= 255 and r["spill_store_bytes"] == 0, r


def test_compile_asks_inductor_for_pdl_only_for_graph_replays_on_hopper(monkeypatch):
    """`compile_fn(pdl=True)` passes the mode's own options plus triton.enable_pdl (torch.compile
    takes a mode or options, not both); the engine asks for it only where its calls replay from
    a CUDA graph on a GPU of compute capability 9+; with the module switch off, or a torch whose
    inductor lacks the option, the mode alone."""
    from vlaperf.engine import compile as C

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    C.compile_fn(len, "max-autotune-no-cudagraphs", pdl=True)
    assert seen[-1]["options"] == {**torch._inductor.list_mode_options("max-autotune-no-cudagraphs"),
                                   "triton.enable_pdl": True} and "mode" not in seen[-1]
    C.compile_fn(len, "default", pdl=False)
    assert seen[-1]["mode"] == "default" and "options" not in seen[-1]
    monkeypatch.setattr(C, "inductor_has_pdl", lambda: False)  # a torch whose inductor has no such option
    C.compile_fn(len, "default", pdl=True)
    assert seen[-1]["mode"] == "default" and "options" not in seen[-1]
    monkeypatch.undo()
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(C, "INDUCTOR_PDL", False)
    C.compile_fn(len, "default", pdl=True)
    assert seen[-1]["mode"] == "default" and "options" not in seen[-1]
    assert not C.wants_pdl(torch.device("cpu"), in_graph=True)
    for major, in_graph, want in ((9, True, True), (9, False, False), (8, True, False), (10, True, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, m=major: (m, 0))
        assert C.wants_pdl(torch.device("cuda"), in_graph=in_graph) == want, (major, in_graph)


def test_head_precision_follows_dtype_and_gpu(monkeypatch):
    """The step's float32 heads multiply as TF32x3 where TF32 tensor cores exist, in full float32
    FMA on older GPUs (compute capability < 8), and bf16 heads take no precision option."""
    import torch

    from vlaperf.engine import loop

    assert loop.head_precision(torch.zeros(2, 2)) == "tf32x3"
    assert loop.head_precision(torch.zeros(2, 2, dtype=torch.bfloat16)) is None
    fake = type("FakeWeight", (), {"dtype": torch.float32, "device": torch.device("cuda", 0)})()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert loop.head_precision(fake) == "ieee"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert loop.head_precision(fake) == "tf32x3"


def test_step_kernel_fits_qkv_tasks_and_key_splits_to_the_programs():
    """fit_config resolves qkv_pairs=-1, splits=0 and merge_bd=0 (the defaults) for a launch's shape and
    programs: pi0 (51 rows, 595 keys) and pi0.5 (libero-pi05: 10 rows, 586 keys) on the H200's 132 SMs get
    the configurations the session-14 sweeps timed (10 pairs a task; 5 and 10 key splits; merge chunks of 64
    and 32 dims); explicit values stay; the interpreter's 4 programs keep the per-slot qkv tiles; dataflow
    never gets pairs."""
    from dataclasses import replace

    from vlaperf.engine.kernels.expert_step import MIN_SPLITS, StepKernelConfig, fit_config

    d = StepKernelConfig()
    assert (d.qkv_pairs, d.splits, d.merge_bd) == (-1, 0, 0)
    pi0 = fit_config(d, 51, 1, 8, 256, 595, 132)
    # 1280 pairs in 128 tasks; 26 row blocks x 5 splits = 130; merge 26 x 4 chunks = 104 tasks (32 dims: 208)
    assert (pi0.qkv_pairs, pi0.splits, pi0.merge_bd) == (10, 5, 64)
    pi05 = fit_config(d, 10, 1, 8, 256, 586, 132)
    assert (pi05.qkv_pairs, pi05.splits, pi05.merge_bd) == (10, 10, 32)  # 5 row blocks: 26 splits wanted, 10 key tiles
    assert fit_config(pi05, 51, 1, 8, 256, 595, 132) == pi05  # resolved fields stay
    batch4 = fit_config(d, 51, 4, 8, 256, 595, 132)
    assert batch4.splits == MIN_SPLITS and batch4.merge_bd == 256  # 104 row blocks: the floor; whole rows a merge task
    assert fit_config(d, 51, 1, 8, 256, 100, 132).splits == 2  # only 2 tiles of keys
    cpu = fit_config(d, 51, 1, 8, 256, 595, 4)
    assert (cpu.qkv_pairs, cpu.splits) == (0, MIN_SPLITS)  # 320 pairs a task would not fit a 16-lane block
    assert fit_config(d, 51, 1, 8, 16, 595, 4).merge_bd == 16  # never wider than the head
    # the norm statistics' squares: summed within each thread by default (ssq_local), ssq_mma wins where set
    from vlaperf.engine.kernels.expert_step import ssq_sum_mode
    assert [ssq_sum_mode(c) for c in (d, replace(d, ssq_local=False), replace(d, ssq_mma=True))] == [2, 0, 1]
    assert fit_config(replace(d, dataflow=True), 51, 1, 8, 256, 595, 132).qkv_pairs == 0
    assert fit_config(replace(d, prefetch_own=8), 51, 1, 8, 256, 595, 132).qkv_pairs == 0
    explicit = fit_config(replace(d, qkv_pairs=4, splits=3, merge_bd=16), 10, 1, 8, 256, 586, 132)
    assert (explicit.qkv_pairs, explicit.splits, explicit.merge_bd) == (4, 3, 16)
    # the norm statistics from the writers: fitted on for one sample's 16-row block (droid-pi0's 11 rows: the
    # call 1.08x on the H200), off at pi0's 51 rows (0.92x) and for batched launches (not measured); explicit stays
    assert d.ssq_from_writers == -1
    assert [fit_config(d, rows, n, 8, 256, 595, 132).ssq_from_writers for rows, n in ((11, 1), (16, 1), (17, 1),
                                                                                      (51, 1), (6, 2))] == [1, 1, 0, 0, 0]
    assert fit_config(replace(d, ssq_from_writers=0), 11, 1, 8, 256, 595, 132).ssq_from_writers == 0
    assert fit_config(replace(d, ssq_from_writers=1), 51, 1, 8, 256, 595, 132).ssq_from_writers == 1


def test_step_kernel_l2_traffic_model():
    """The L2 model of one layer (expert_step.l2_traffic): the weights of every matmul counted
    once, activation re-reads growing with the tile count and the samples, partials only
    where a phase splits K."""
    from dataclasses import replace

    from vlaperf.engine.kernels.expert_step import StepKernelConfig, l2_traffic

    M, NH, HD, D, F, Tk = 51, 8, 256, 1024, 4096, 595
    cfg = StepKernelConfig()
    t = l2_traffic(cfg, M, NH, HD, D, F, Tk)
    assert sum(p["weights"] for p in t.values()) == 2 * ((NH * HD + 2 * HD) * D + D * NH * HD + 2 * F * D + D * F)
    narrow = l2_traffic(replace(cfg, bn_gu=cfg.bn_gu // 2), M, NH, HD, D, F, Tk)
    assert narrow["gate_up"]["activations"] == 2 * t["gate_up"]["activations"]
    assert narrow["gate_up"]["weights"] == t["gate_up"]["weights"]
    assert t["down"]["partials"] == 2 * cfg.ks_down * M * D * 4 > 0
    assert l2_traffic(replace(cfg, ks_down=1), M, NH, HD, D, F, Tk)["down"]["partials"] == 0
    four = l2_traffic(cfg, M, NH, HD, D, F, Tk, samples=4)
    for phase in ("qkv", "o_proj", "gate_up", "down"):
        assert four[phase]["activations"] == 4 * t[phase]["activations"] and four[phase]["weights"] == t[phase]["weights"]
    # pi0's defaults: ~107 MB a layer through L2 (qkv's 128 tasks each read x), against 34.6 MB of weights
    assert 95e6 < sum(sum(p.values()) for p in t.values()) < 110e6


@pytest.mark.parametrize("probe, kernels", [("cluster_probe.cu", 11),  # nine streaming variants, reference, fill
                                            ("phase_probe.cu", 11),  # nine phase variants, reference, fill
                                            ("mlp_probe.cu", 5)])  # two MLP variants, two references, fill
def test_cuda_probe_builds_for_hopper_without_spills(tmp_path, probe, kernels):
    """The CUDA C++ probes (benchmarks/*.cu: the GPU machine builds and runs them) stay
    buildable: compiled for sm_90a wherever nvcc exists, every kernel without register spills."""
    import re
    import shutil

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", probe)
    proc = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
                           src, "-o", str(tmp_path / "probe.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert len(spills) == kernels, proc.stderr[-3000:]
    assert all(s == ("0", "0") for s in spills), spills


FAKE_KERNELS = textwrap.dedent(
    """
    import json, os


    def _body():
        pass


    class Kernel:
        '''Stands for a Triton kernel: compile_worker imports it by module and name, calls warmup.'''

        def __init__(self, name, fail=False):
            self.__name__, self.fail, self.fn = name, fail, _body

        def warmup(self, *args, grid, **kwargs):
            if self.fail:
                raise ValueError("no registers left")
            print("compiling", self.__name__)  # a stray print: the worker must keep it out of its replies
            seen = [[str(a.dtype), a.data_ptr() % 16 == 0] if hasattr(a, "dtype") else a for a in args]
            with open(os.environ["FAKE_KERNEL_LOG"], "a") as f:
                f.write(json.dumps([self.__name__, list(grid), seen, kwargs]) + "\\n")


    _expert_step_kernel = Kernel("_expert_step_kernel")  # the module attribute is the kernel's name, as with @triton.jit
    _small = Kernel("_small")
    broken = Kernel("broken", fail=True)
    """
)


def test_compile_worker_args_specialize_like_the_launch():
    """describe_args keeps what Triton specializes on (dtype, 16-byte alignment, the scalars);
    rebuild_args makes arguments that specialize the same way."""
    from vlaperf.engine.kernels.compile_worker import describe_args, rebuild_args

    x = torch.zeros(40, dtype=torch.bfloat16)
    args = [x, x[1:], torch.zeros(8, dtype=torch.uint8)[3:], 51, 1, 0.5, None, True]
    described = describe_args(args)
    assert described == [("tensor", "bfloat16", True), ("tensor", "bfloat16", False), ("tensor", "uint8", False),
                         51, 1, 0.5, None, True]
    assert describe_args(rebuild_args(described, "cpu")) == described


def test_compile_workers_compile_each_kernel_in_a_process_and_report_failures(tmp_path, monkeypatch):
    """CompileWorkers: fresh interpreters that import each recorded kernel by module and name and
    compile its launches with rebuilt arguments, the kernel named first handed out first; a
    kernel that fails to compile fails the whole, with its message (the engine then compiles)."""
    import json

    from vlaperf.engine.kernels.compile_worker import CompileWorkers

    (tmp_path / "fakekern.py").write_text(FAKE_KERNELS)
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("FAKE_KERNEL_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fakekern

    x = torch.zeros(16, dtype=torch.float32)
    launches = [(fakekern._small, (4,), (x, 7), {"BLOCK": 32}),
                (fakekern._expert_step_kernel, (132,), (x[1:], 51), {"num_warps": 8}),
                (fakekern._small, (8,), (x[1:], 16), {"BLOCK": 64})]
    workers = CompileWorkers(1, "cpu")
    try:
        seconds = workers.compile(launches, first=("_expert_step_kernel",))
    finally:
        workers.close()
    assert set(seconds) == {"_expert_step_kernel", "_small"}
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows == [["_expert_step_kernel", [132], [["torch.float32", False], 51], {"num_warps": 8}],
                    ["_small", [4], [["torch.float32", True], 7], {"BLOCK": 32}],
                    ["_small", [8], [["torch.float32", False], 16], {"BLOCK": 64}]]
    workers = CompileWorkers(2, "cpu")
    try:
        with pytest.raises(RuntimeError, match="broken: ValueError: no registers left"):
            workers.compile([(fakekern.broken, (1,), (x,), {})])
    finally:
        workers.close()
    assert not workers.procs


def test_compile_workers_that_hang_are_killed_after_the_timeout(tmp_path):
    """A worker that never answers must not hold the first call: compile gives up after its
    timeout and kills the workers (the engine then compiles by itself)."""
    import time

    from vlaperf.engine.kernels.compile_worker import CompileWorkers

    class Kernel:
        __name__ = "_k"
        fn = test_compile_workers_that_hang_are_killed_after_the_timeout

    workers = CompileWorkers(2, "cpu", command=[sys.executable, "-c", "import time; time.sleep(60)"])
    procs = list(workers.procs)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="longer than 1 s"):
        workers.compile([(Kernel(), (1,), (), {})], timeout=1.0)
    assert time.monotonic() - start < 15
    assert not workers.procs and all(p.poll() is not None for p in procs)


def test_step_kernel_bench_launches_the_workloads_shapes():
    """benchmarks/expert_step_bench.py times the step kernel at the shapes its workloads launch:
    libero-pi0's 51 suffix rows (50 actions and the state token) over its kept prefix (2 images
    and a 32-token prompt bucket, 532 valid), and with --pi05 libero-pi05's 10 action rows over a
    576-token prefix. Sessions 9-13 timed pi0.5 at 50 rows while its call launched 10, and read the
    wrong shape's numbers as the call's (docs/perf-notes.md, version 63)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import expert_step_bench as bench

    from vlaperf.engine.prefix import plan_prefix
    from vlaperf.inputs import random_observation
    from vlaperf.models.pi0 import get_config
    from vlaperf.workloads import get_workload

    def launched(workload_id):
        w = get_workload(workload_id)
        cfg = get_config(w.preset)
        obs = random_observation(w, cfg)
        plan = plan_prefix(obs, skip_masked_images=True, trim_prompt_padding=True)
        prefix = len(plan.slots) * cfg.vision.num_patches + plan.prompt_len
        valid = len(plan.slots) * cfg.vision.num_patches + w.prompt_valid[0]
        return cfg.action_horizon + (0 if cfg.pi05 else 1), prefix, valid  # pi0's state token is a suffix row

    assert launched("libero-pi0") == (bench.M, bench.TP, bench.VALID)
    rows, prefix, valid = launched("libero-pi05")
    assert (rows, prefix) == (bench.PI05_ROWS, bench.PI05_PREFIX) and valid == prefix  # a full 64-token bucket


RECORD_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, BENCH_DIR)
    import torch
    import expert_step_bench as bench
    from vlaperf.engine.kernels import expert_step as S
    from vlaperf.workloads import get_workload

    w = get_workload("tiny")
    steps = bench.record_engine_steps("tiny", "cpu")
    assert len(steps) == w.steps, len(steps)
    x, wqkv, wo, wgu, wd, kc, vc, cos, sin, mask, eps = steps[0]["args"]
    assert x.shape[0] == 11 and kc.shape == vc.shape and mask.shape == (11, kc.shape[-2]) and mask.dtype == torch.uint8
    assert all(st["mod"] is None for st in steps)  # pi0: no modulation table
    # the recorded arguments are complete and were not overwritten by later steps: each step's kernel
    # run again on them gives what it gave inside the call, bit for bit
    for st in steps:
        assert torch.equal(S.expert_step(*st["args"], mod=st["mod"]), st["out"])
    assert not torch.equal(steps[0]["args"][0], steps[1]["args"][0])  # each step's own input
    print("ok")
    """
)


@needs_triton_39
def test_step_kernel_bench_records_what_the_engine_launches():
    """expert_step_bench.py --from-engine times the kernel on the arguments the engine passes it:
    one eager call of the workload is recorded step by step (run here on `tiny` in the interpreter)."""
    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    run_in_interpreter(RECORD_SCRIPT.replace("BENCH_DIR", repr(bench_dir)), timeout=600)


def test_attention_masks_are_passed_with_16_byte_aligned_rows():
    """The kernels' uint8 mask rows are padded to a multiple of 16 bytes, so that Triton can prove their loads
    aligned (520 keys: 0.72 against 0.33 ms a call for the prefix's attention on the H200); the values are the
    mask's, and a mask already in that form is passed as it is."""
    from vlaperf.engine.kernels.suffix_attention import aligned_mask

    mask = torch.rand(2, 5, 520) > 0.3
    out = aligned_mask(mask)
    assert out.dtype == torch.uint8 and out.shape == mask.shape
    assert out.stride() == (5 * 528, 528, 1) and torch.equal(out.bool(), mask)
    assert aligned_mask(out) is out
    ready = torch.zeros(2, 5, 528, dtype=torch.uint8)
    assert aligned_mask(ready) is ready


# ---------------------------------------------------------------- the kernels' host logic, without a kernel
# The launchers' choices (tiles, splits, buffers, constants) and their argument checks, run on the CPU with each
# module's `launch` replaced by a recorder: no kernel is compiled or run, so these take milliseconds where the
# interpreter checks above take minutes (and are skipped under the GPU machine's Triton 3.6).


def _record_launches(monkeypatch, module, add_to_x=False):
    """Replace `module.launch` with a recorder of (kernel name, grid, args, kwargs); with `add_to_x`, each step-kernel
    launch adds 1 to its first argument (x, the buffer the kernel updates), so a test sees which buffer it got."""
    launches = []

    def record(kernel, grid, *args, **kwargs):
        launches.append((kernel.__name__, grid, args, kwargs))
        if add_to_x and kernel.__name__ == "_expert_step_kernel":
            args[0].add_(1)

    monkeypatch.setattr(module, "launch", record)
    return launches


def _step_inputs(L=2, D=32, NH=2, HD=16, F=64, M=5, Tk=24, B=None):
    """Arguments of expert_step for a small expert (zeros: nothing is computed), one sample or B of them."""
    lead = () if B is None else (B,)
    return dict(x=torch.zeros(*lead, M, D), wqkv=torch.zeros(L, NH * HD + 2 * HD, D), wo=torch.zeros(L, D, NH * HD),
                wgu=torch.zeros(L, 2 * F, D), wd=torch.zeros(L, D, F), k_cache=torch.zeros(L, *lead, Tk, HD),
                v_cache=torch.zeros(L, *lead, Tk, HD), cos=torch.zeros(*lead, M, HD), sin=torch.zeros(*lead, M, HD),
                mask=torch.ones(*lead, M, Tk, dtype=torch.bool), eps=1e-6)


def test_step_kernel_launches_what_its_config_resolves_to(monkeypatch):
    """expert_step's launch on the CPU: one launch per (layer, phase) (the interpreter cannot run grid barriers), the
    phases asked for only, one launch of every layer and phase with persistent=True; the constants are fit_config's
    resolution of the config for this shape (key splits, merge dims, row block, K depths, sub-rows), the CUDA-only
    options (prefetches, the PTX barrier) off; the split counters laid out as split_counter_targets reads them;
    last_launch records the same; x is updated in place with in_place, else a copy is."""
    from dataclasses import asdict, replace

    from vlaperf.engine.kernels import expert_step as S

    launches = _record_launches(monkeypatch, S, add_to_x=True)
    L, D, NH, HD, F, M, Tk = 2, 32, 2, 16, 64, 5, 24
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    x0 = a["x"].clone()
    out = S.expert_step(**a)
    step = [r for r in launches if r[0] == "_expert_step_kernel"]
    assert [r[2][-4:] for r in step] == [(layer, layer + 1, ph, ph + 1) for layer in range(L) for ph in range(6)]
    assert all(r[1] == (S.num_sms(torch.device("cpu")),) and r[3]["USE_BARRIER"] is False for r in step)
    assert torch.equal(a["x"], x0) and torch.equal(out, x0 + len(step))  # a copy was updated, not the caller's x
    cfg = S.fit_config(S.StepKernelConfig(), M, 1, NH, HD, Tk, 4)
    assert S.last_launch("cpu") == {"config": asdict(cfg), "rows": M, "samples": 1, "keys": Tk, "programs": 4}
    launches.clear()
    out = S.expert_step(**a, in_place=True, phases=(2, 4), programs=3)
    assert out.data_ptr() == a["x"].data_ptr() and torch.equal(a["x"], x0 + 2 * L)  # in place: the caller's x
    assert [(r[1], r[2][-4:]) for r in launches if r[0] == "_expert_step_kernel"] == [
        ((3,), (layer, layer + 1, ph, ph + 1)) for layer in range(L) for ph in (2, 3)]
    launches.clear()
    S.expert_step(**_step_inputs(L, D, NH, HD, F, M, Tk), persistent=True)
    assert [(r[2][-4:], r[3]["USE_BARRIER"]) for r in launches if r[0] == "_expert_step_kernel"] == [((0, L, 0, 6), True)]

    # three samples of 7 rows (a 32-row block) over 200 keys, non-default tiles, CUDA-only options asked for
    B, M, Tk = 3, 7, 200
    asked = replace(S.StepKernelConfig(), merge_bd=64, prefetch=2, idle_prefetch=2, prefetch_own=3, sub_m=32,
                    mod_prefetch=True, dataflow=True, ks_o=1, bn_down=16, bn_qkv=4)
    a = _step_inputs(L, D, NH, HD, F, M, Tk, B=B)
    a["cos"] = torch.zeros(B, HD, M).transpose(1, 2)  # a non-contiguous table: the kernel indexes it densely
    launches.clear()
    out = S.expert_step(**a, config=asked)
    assert out.shape == (B, M, D)
    assert {n: S.last_launch("cpu")[n] for n in ("rows", "samples", "keys")} == {"rows": M, "samples": B, "keys": Tk}
    (_, grid, args, k), = [r for r in launches if r[0] == "_expert_step_kernel"][:1]
    cfg = S.fit_config(asked, M, B, NH, HD, Tk, 4)
    splits, keys_per_split = S.key_splits(cfg, Tk)
    assert args[24:28] == (M, Tk, Tk - M, keys_per_split)  # rows a sample, keys, prefix keys, keys a split
    assert (k["SPLITS"], k["MD"], k["BLOCK_M"], k["NB"]) == (splits, HD, S.row_block(B * M), B)  # MD: at most HD
    assert {n: k[n.upper()] for n in ("bk_qkv", "bk_o", "bk_gu", "bk_down")} == S.k_depths(cfg, S.row_block(B * M))
    assert k["SUB_M"] == S.sub_rows(cfg, k["BLOCK_M"]) and k["QKV_PAIRS"] == cfg.qkv_pairs == 0
    assert {n: k[n] for n in ("PF_O", "PF_GU", "PF_DOWN", "PF_QKV_NEXT")} == S.prefetch_phases(0)  # PTX: CUDA only
    assert (k["IDLE_PREFETCH"], k["PREFETCH_OWN"], k["MOD_PREFETCH"], k["BARRIER_ASM"]) == (0, 0, False, False)
    assert args[18].is_contiguous() and args[20].dtype == torch.uint8  # cos made dense; the mask as bytes
    # the partials: every split's (HD) output and its running max and sum (2) for every sample's folded rows
    assert args[5].numel() >= splits * B * NH * M * HD and args[6].numel() >= 2 * splits * B * NH * M
    # the split counters of a layer, in the order split_counter_targets lists them: attention row blocks, o_proj,
    # gate_up, down tiles, qkv slots; with dataflow each slot counts its qkv tasks (the per-slot tiling)
    targets = S.split_counter_targets(asked, M, NH, D, F, Tk, B, HD, programs=4)
    assert len(targets) == k["CTR_LAYER"] and args[9].numel() == L * k["CTR_LAYER"] and args[8].numel() == L * 7
    assert targets[:k["CTR_O"]] == [splits] * (B * -(-NH * M // cfg.att_bm))
    assert set(targets[k["CTR_O"]:k["CTR_GU"]]) == {0} and len(targets[k["CTR_O"]:k["CTR_GU"]]) == -(-D // cfg.bn_o)
    assert set(targets[k["CTR_GU"]:k["CTR_DOWN"]]) == {0}  # ks_gu = 1: nothing counts
    assert targets[k["CTR_DOWN"]:k["CTR_SLOT"]] == [cfg.ks_down] * -(-D // cfg.bn_down)
    assert targets[k["CTR_SLOT"]:] == [S.qkv_task_count(cfg, NH, HD) // (NH + 2)] * (NH + 2)
    # the folded merge counts the key splits of each row block too
    folded = replace(S.StepKernelConfig(), fold_merge=True, ks_gu=2)
    assert S.split_counter_targets(folded, M, NH, D, F, Tk, B, HD, programs=4)[:k["CTR_O"]] == [splits] * k["CTR_O"]


def test_step_kernel_statistics_prologue_runs_where_the_writers_supply_them(monkeypatch):
    """The first layer's norm statistics come from a small kernel before the step kernel wherever the writers supply
    them to later layers: pi0 with ssq_from_writers (fitted on for one sample of at most 16 rows), and pi0.5's
    modulated input (with its x (1 + scale))."""
    from dataclasses import replace

    from vlaperf.engine.kernels import expert_step as S

    launches = _record_launches(monkeypatch, S)
    L, D, NH, HD, F, M, Tk = 1, 32, 2, 16, 64, 5, 24

    def kernels(**kw):
        launches.clear()
        S.expert_step(**_step_inputs(L, D, NH, HD, F, M, Tk, B=kw.pop("B", None)), **kw)
        return [(r[0], r[3].get("XM")) for r in launches if r[0] == "_mod_prologue_kernel"] + \
            [("SSQ_IN", launches[-1][3]["SSQ_IN"])]

    assert kernels() == [("_mod_prologue_kernel", False), ("SSQ_IN", True)]  # fitted: 5 rows, one sample
    assert kernels(config=replace(S.StepKernelConfig(), ssq_from_writers=0)) == [("SSQ_IN", False)]
    assert kernels(B=2) == [("SSQ_IN", False)]  # batched: fitted off
    mod = torch.zeros(L, 4 * D + (NH + 2) * HD + 2 * F)
    assert kernels(config=replace(S.StepKernelConfig(), ssq_from_writers=0), mod=mod) == [
        ("_mod_prologue_kernel", True), ("SSQ_IN", True)]


def test_step_kernel_refuses_bad_arguments_before_launching(monkeypatch):
    """Every argument check of expert_step raises a ValueError that names the field, before anything is launched."""
    import re
    from dataclasses import replace

    from vlaperf.engine.kernels import expert_step as S

    launches = _record_launches(monkeypatch, S)
    d = S.StepKernelConfig()
    L, D, NH, HD, F, M, Tk = 1, 64, 2, 16, 96, 5, 16

    def refused(message, config=d, inputs=None, **kw):
        a = inputs or _step_inputs(L, D, NH, HD, F, M, Tk)
        with pytest.raises(ValueError, match=re.escape(message)):
            S.expert_step(**a, config=config, **kw)
        assert not launches, message

    def accepted(config, inputs=None, **kw):
        S.expert_step(**(inputs or _step_inputs(L, D, NH, HD, F, M, Tk)), config=config, **kw)
        assert launches, config
        launches.clear()

    # rows: at most MAX_ROWS of all samples together
    big = _step_inputs(L, D, NH, HD, F, 64, Tk + 64, B=5)
    refused(f"the step kernel takes at most {S.MAX_ROWS} suffix rows (batch x rows), got 5 x 64", inputs=big)
    accepted(d, inputs=_step_inputs(L, D, NH, HD, F, 64, Tk + 64, B=S.MAX_ROWS // 64))
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    a["wo"] = a["wo"].transpose(1, 2).contiguous()  # (L, NH*HD, D): the unfused layout
    refused(f"expert_step: wo has shape {(L, NH * HD, D)}, expected {(L, D, NH * HD)}", inputs=a)
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    a["wd"] = torch.zeros(L, F, D).transpose(1, 2)
    refused("expert_step: wd must be contiguous", inputs=a)
    width = 4 * D + (NH + 2) * HD + 2 * F
    refused(f"expert_step: mod has shape {(L, width - F)}, expected {(L, width)}", mod=torch.zeros(L, width - F))
    refused("expert_step: mod must be a contiguous float32 table, got torch.float64",
            mod=torch.zeros(L, width, dtype=torch.float64))
    refused("expert_step: mod must be a contiguous float32 table", mod=torch.zeros(L, 2 * width)[:, ::2])
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    a["x"] = torch.zeros(D, M).T
    refused("expert_step: in_place needs a contiguous x", inputs=a, in_place=True)
    refused("expert_step: timeline needs a persistent launch on CUDA", persistent=True,
            timeline=torch.zeros(L, 7, 4, 3, dtype=torch.int64))
    # the cache: equal strides, token rows 16-byte aligned (base, layer and token strides)
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    a["v_cache"] = torch.zeros(L, Tk, 2 * HD)[..., :HD]
    refused("expert_step: k_cache and v_cache need the same strides", inputs=a)
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    # layer stride 16 x 17 elements: only the token stride is off
    a["k_cache"] = a["v_cache"] = torch.zeros(L, Tk, HD + 1)[..., :HD]
    refused("every token row of k_cache / v_cache must start 16-byte aligned", inputs=a)
    a = _step_inputs(L, D, NH, HD, F, M, Tk)
    a["k_cache"] = a["v_cache"] = torch.zeros(4 + L * Tk * HD)[4:].view(L, Tk, HD)  # a base 16 bytes off 32
    refused("every token row of k_cache / v_cache must start 16-byte aligned", inputs=a)
    # the config's fields
    refused("StepKernelConfig: dataflow and fold_merge exclude each other", replace(d, dataflow=True, fold_merge=True))
    refused(f"StepKernelConfig.att_dsplit=0: expected a divisor of the head dim {HD}", replace(d, att_dsplit=0))
    refused("StepKernelConfig: att_dsplit > 1 excludes dataflow and fold_merge",
            replace(d, att_dsplit=2, dataflow=True))
    refused("StepKernelConfig.att_dsplit=2: expected a divisor of the head dim 24 leaving a power of two",
            replace(d, att_dsplit=2), inputs=_step_inputs(L, D, NH, 24, F, M, Tk))  # 12 dims a part
    for own in (-1, 16):
        refused(f"StepKernelConfig.prefetch_own={own}: expected a bit mask", replace(d, prefetch_own=own))
    refused("StepKernelConfig.ssq_from_writers=2: expected -1 (fitted), 0 or 1", replace(d, ssq_from_writers=2))
    refused("StepKernelConfig.poll_depth=0, poll_gap=128: expected a depth of 1 to 4", replace(d, poll_depth=0))
    refused("StepKernelConfig.poll_depth=1, poll_gap=-1: expected a depth of 1 to 4", replace(d, poll_gap=-1))
    refused("StepKernelConfig.poll_depth > 1 is thread 0's poll in PTX: it needs barrier_asm and poll_one",
            replace(d, poll_depth=2, barrier_asm=False))
    refused("StepKernelConfig: qkv_pairs excludes dataflow and prefetch_own's bit 8",
            replace(d, qkv_pairs=5, prefetch_own=8))
    accepted(replace(d, qkv_pairs=d.bn_qkv))  # a whole block of lanes
    refused(f"StepKernelConfig.ks_gu=3: expected a positive divisor of that matmul's depth {D}", replace(d, ks_gu=3))
    refused(f"StepKernelConfig.ks_gu={F}: expected a positive divisor of that matmul's depth {D}", replace(d, ks_gu=F))
    refused(f"StepKernelConfig.ks_o=0: expected a positive divisor of that matmul's depth {NH * HD}",
            replace(d, ks_o=0))


def test_step_kernel_helpers_follow_their_definitions(monkeypatch):
    """The host-side helpers of the step kernel against what their docstrings define."""
    from dataclasses import asdict, replace

    from vlaperf.engine.kernels import expert_step as S

    d = S.StepKernelConfig()
    # one barrier-timeout flag a device, made once (the engine makes it outside any CUDA-graph pool), under one key
    # whether the device is named with its index or not (the engine's "cuda:1", a reader's "cuda")
    assert S.error_flag(torch.device("cpu")) is S.error_flag(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert S._device_key("cuda") == S._device_key(torch.device("cuda", 1)) == "cuda:1" and S._device_key("cpu") == "cpu"
    # sub_rows: 0 where off, where the rows do not split the block into several (or into the 16 rows a product needs
    # at least), or without one_dot
    sub = replace(d, sub_m=16)
    assert [S.sub_rows(sub, b) for b in (64, 32, 16)] == [16, 16, 0]
    assert S.sub_rows(d, 64) == 0 and S.sub_rows(replace(sub, one_dot=False), 64) == 0
    assert S.sub_rows(replace(d, sub_m=24), 64) == 0 and S.sub_rows(replace(d, sub_m=8), 64) == 0
    # fit_config: explicit 0 keeps the per-slot qkv tiles; a task may take a whole block of bn_qkv pairs (pi0's 1280
    # pairs over 80 programs: 16); the att_dsplit parts count as tasks for the key splits (5 row blocks x 2 parts x 13
    # splits = 130 of 132); the merge's dims doubled only while its tasks take more than one round (26 row blocks x 4
    # parts of 64 dims = 104 tasks on 104 programs: one round)
    assert S.fit_config(replace(d, qkv_pairs=0), 51, 1, 8, 256, 595, 132).qkv_pairs == 0
    assert S.fit_config(d, 51, 1, 8, 256, 595, 80).qkv_pairs == 16
    assert S.fit_config(replace(d, att_dsplit=2), 10, 1, 8, 256, 2000, 132).splits == 13
    assert S.fit_config(d, 51, 1, 8, 256, 595, 104).merge_bd == 64
    # key_splits: whole att_bn tiles a split, none empty: 600 keys in 32-key tiles asked in 6 run as 5 of 128
    for Tk, bn, asked in ((600, 32, 6), (595, 64, 5), (100, 64, 10), (64, 64, 3)):
        n, per = S.key_splits(replace(d, att_bn=bn, splits=asked), Tk)
        assert per % bn == 0 and (n - 1) * per < Tk <= n * per and n <= asked, (Tk, bn, asked, n, per)
    assert S.key_splits(replace(d, att_bn=32, splits=6), 600) == (5, 128)
    # qkv_task_count: bn_qkv pairs of one slot (query heads, k, v) a task, or qkv_pairs pairs of all slots
    assert S.qkv_task_count(replace(d, qkv_pairs=0), 2, 64) == 4 * 2  # 4 slots x 32 pairs in 16-pair blocks
    assert S.qkv_task_count(replace(d, qkv_pairs=5), 2, 16) == 7  # 32 pairs in runs of 5, the last short
    # ssq_constexprs: the writers' statistics for pi0.5 always and pi0 with ssq_from_writers (resolved: -1 is off);
    # loaded ahead as one block only where both writers' tile counts are powers of two, never with early_mod_loads
    on = replace(d, ssq_from_writers=1)
    assert S.ssq_constexprs(on, False, 64) == {"SSQ_IN": True, "SSQ_OUT": True, "STATS_AHEAD": True}
    assert S.ssq_constexprs(replace(d, ssq_from_writers=0), True, 64) == {"SSQ_IN": True, "SSQ_OUT": False,
                                                                          "STATS_AHEAD": True}
    assert not S.ssq_constexprs(on, True, 64)["SSQ_OUT"]  # pi0.5's writers store them anyway
    assert not any(S.ssq_constexprs(d, False, 64).values())
    assert not S.ssq_constexprs(replace(on, early_mod_loads=True), False, 64)["STATS_AHEAD"]
    assert not S.ssq_constexprs(replace(on, bn_o=64, bn_down=32), False, 96)["STATS_AHEAD"]  # 2 and 3 tiles
    assert not S.ssq_constexprs(replace(on, bn_o=32, bn_down=64), False, 96)["STATS_AHEAD"]  # 3 and 2 tiles
    # prefetch_phases: each plan's weights at the index of the phase that prefetches them, -1 for the others
    names = {"o": "PF_O", "gate_up": "PF_GU", "down": "PF_DOWN", "qkv+1": "PF_QKV_NEXT"}
    for plan, phases in S.PREFETCH_PLANS.items():
        want = dict.fromkeys(names.values(), -1)
        want.update({names[w]: S.PHASES.index(ph) for ph, ws in phases.items() for w in ws})
        assert S.prefetch_phases(plan) == want, plan
    # row_block: the smallest power of two from 16 that holds the rows; k_depths: the config's depths up to 64
    # rows, shallower in proportion beyond, never below the 16 a product needs
    assert [S.row_block(r) for r in (1, 16, 17, 51, 64, 65, 256)] == [16, 16, 32, 64, 64, 128, 256]
    cfg = replace(d, bk_qkv=16)
    depths = ("bk_qkv", "bk_o", "bk_gu", "bk_down")
    assert S.k_depths(cfg, 16) == S.k_depths(cfg, 64) == {k: getattr(cfg, k) for k in depths}
    assert S.k_depths(cfg, 256) == {"bk_qkv": 16, **{k: getattr(cfg, k) // 4 for k in depths[1:]}}  # a quarter
    assert S.config_dict(sub) == asdict(sub) and S.config_dict() == asdict(d)


def test_step_kernel_modulation_table_is_pi05s_norms_per_layer():
    """modulation_table against its definition: per layer 1 + scale1, shift1 @ Wqkv^T, gate1, 1 + scale2,
    shift2 @ Wgu^T, gate2, the gates rounded to the weights' dtype (bf16 here) as the reference multiplies by them."""
    from vlaperf.engine.kernels.expert_step import modulation_table

    torch.manual_seed(0)
    steps, L, D, QKV, F2 = 2, 3, 8, 12, 10
    mods = torch.randn(steps, 6 * L + 2, D)
    wqkv, wgu = torch.randn(L, QKV, D).bfloat16(), torch.randn(L, F2, D).bfloat16()
    table = modulation_table(mods, wqkv, wgu)
    assert table.shape == (steps, L, 4 * D + QKV + F2) and table.dtype == torch.float32
    for layer in range(L):
        s1, b1, g1, s2, b2, g2 = mods[:, 6 * layer: 6 * layer + 6].unbind(1)
        want = torch.cat([1 + s1, b1 @ wqkv[layer].float().T, g1.bfloat16().float(), 1 + s2, b2 @ wgu[layer].float().T,
                          g2.bfloat16().float()], dim=-1)
        torch.testing.assert_close(table[:, layer], want, rtol=1e-5, atol=1e-5)
    gates = table[:, :, D + QKV: 2 * D + QKV]
    assert not torch.equal(gates, mods[:, 2:6 * L:6])  # the rounding shows: the unrounded gates differ


def _asymmetric_timeline():
    """One layer, all 7 phases: program p (of 3) starts at the slot's start + 0.1 p us and works 1, 2 and 6 us (mean
    3, median 2); it passes the barrier 0.5 + 0.1 p us after the last arrival; the next phase starts 0.2 us after the
    last program passed."""
    ts = torch.zeros(1, 7, 3, 3, dtype=torch.int64)
    t = 1_000_000
    for ph in range(7):
        for p, work in enumerate((1000, 2000, 6000)):
            ts[0, ph, p, 0] = t + 100 * p
            ts[0, ph, p, 1] = t + 100 * p + work
        last = int(ts[0, ph, :, 1].max())
        ts[0, ph, :, 2] = last + 500 + 100 * torch.arange(3)
        t = last + 900
    return ts


def test_timeline_summary_takes_medians_the_first_release_and_no_release_for_the_last_phase():
    """timeline_summary on uneven programs: work is the median program's (not the mean), release the time from the
    last arrival to the first program past the barrier; the last phase run has no barrier reading (NaN) and the
    launch ends at its last arrival; (6, 7) summarises the empty phase; a timeline never written summarises as zeros."""
    import math

    from vlaperf.engine.kernels.expert_step import timeline_summary

    ts = _asymmetric_timeline()
    s = timeline_summary(ts, (0, 6))
    qkv, down = s["phases"]["qkv"], s["phases"]["down"]
    assert (qkv["work_min"], qkv["work_median"], qkv["work_max"]) == pytest.approx((1.0, 2.0, 6.0))
    assert qkv["release"] == pytest.approx(0.5) and qkv["start_skew"] == pytest.approx(0.2)
    assert qkv["slot"] == pytest.approx(0.2 + 6.0 + 0.9) and qkv["slot_total_us"] == pytest.approx(7.1)  # one layer
    assert math.isnan(down["release"]) and down["slot"] == pytest.approx(6.2)  # ends at the last arrival
    assert s["total_us"] == pytest.approx(5 * 7.1 + 6.2)
    assert timeline_summary(ts, (6, 7))["phases"].keys() == {"empty"}
    assert math.isnan(timeline_summary(torch.zeros(1, 7, 3, 3, dtype=torch.int64), (0, 6))["work_share"])


def test_step_kernel_l2_model_counts_each_buffer_it_names():
    """l2_traffic's terms against the buffers they stand for: the attention's partials (every split's output and its
    running max and sum per folded row, written then read back by the merge), the phases' outputs (q, k and v; the
    merge's o; h; the residual phases read and write x), gate_up's split-K partials (gate and up per slice, plus a
    sum of squares per tile), the residual's activation re-reads (one per column tile), and the attention's reads
    (each task: its rows' q, its split's keys, its part of the values)."""
    from dataclasses import replace

    from vlaperf.engine.kernels.expert_step import StepKernelConfig, fit_config, key_splits, l2_traffic

    M, NH, HD, D, F, Tk, S = 51, 8, 256, 1024, 4096, 595, 3
    cfg = StepKernelConfig()
    t = l2_traffic(cfg, M, NH, HD, D, F, Tk, samples=S)
    splits = key_splits(fit_config(cfg, M, S, NH, HD, Tk, 132), Tk)[0]
    rows = S * M
    assert t["attention"]["partials"] == t["merge"]["partials"] == splits * rows * NH * (HD + 2) * 4
    assert t["qkv"]["outputs"] == rows * (NH + 2) * HD * 2 and t["merge"]["outputs"] == rows * NH * HD * 2
    assert t["gate_up"]["outputs"] == rows * F * 2
    assert t["o_proj"]["outputs"] == t["down"]["outputs"] == 2 * rows * D * 2
    split_gu = l2_traffic(replace(cfg, ks_gu=2), M, NH, HD, D, F, Tk)["gate_up"]["partials"]
    assert split_gu == 2 * 2 * M * (2 * F + F // cfg.bn_gu) * 4
    narrow = l2_traffic(replace(cfg, bn_down=cfg.bn_down // 2), M, NH, HD, D, F, Tk)
    assert narrow["down"]["activations"] == 2 * l2_traffic(cfg, M, NH, HD, D, F, Tk)["down"]["activations"]
    for parts in (1, 2):
        c = fit_config(replace(cfg, att_dsplit=parts, att_bm=32), M, 1, NH, HD, Tk, 132)
        n = key_splits(c, Tk)[0]
        tasks = -(-NH * M // 32) * n * parts
        keys = -(-Tk // n)
        want = tasks * (32 * HD + keys * HD + keys * HD // parts) * 2
        assert l2_traffic(c, M, NH, HD, D, F, Tk)["attention"]["activations"] == want, parts


def test_small_m_matmul_launch_tiles_and_checks(monkeypatch):
    """small_m_matmul's launch on the CPU: a row block of 16, 32 or 64 rows (the smallest that holds M), a program
    per block of columns and K split, the reduce kernel only for a split K, a partials buffer that holds both GEGLU
    products of every split, float32 as IEEE products unless asked otherwise; refusals name what is wrong."""
    import vlaperf.engine.kernels.small_m_matmul as K

    launches = _record_launches(monkeypatch, K)

    def run(M, N, Kd, dtype=torch.float32, **kw):
        launches.clear()
        K.small_m_matmul(torch.zeros(M, Kd, dtype=dtype), torch.zeros(N, Kd, dtype=dtype), **kw)
        return launches

    for M, block in ((1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)):
        (name, grid, args, k), = run(M, 100, 64, block_n=32, block_k=64, split_k=1)
        assert (name, grid, k["BLOCK_M"], k["SPLIT_K"]) == ("_small_m_kernel", (4, 1), block, 1), M
        assert k["PRECISION"] == "ieee" and args[11] == 0.0  # eps (no norm)
    with pytest.raises(ValueError, match="small_m_matmul is for at most 64 rows, got 65"):
        run(65, 100, 64)
    first, second = run(10, 100, 64, rms_eps=1e-5, split_k=2, block_n=32, block_k=32, w_up=torch.zeros(100, 64))
    assert (first[0], first[1], second[0], second[1]) == ("_small_m_kernel", (4, 2), "_reduce_kernel", (4,))
    assert first[2][11] == pytest.approx(1e-5) and first[3]["RMS_NORM"] and first[3]["GEGLU"]
    assert first[2][6].numel() >= 2 * 2 * 16 * 100  # the partials: split x (gate, up) x rows x N, float32
    # the measured tiling by default (pick_config), for the GPU's programs
    (_, grid, _, k), = run(51, 1024, 2048, num_sms=32)
    auto = K.pick_config(1024, 2048, False, num_sms=32)
    assert grid == (1024 // auto["block_n"], auto["split_k"]) and k["BLOCK_K"] == auto["block_k"]
    assert auto != K.pick_config(1024, 2048, False)  # 32 column blocks fill a GPU of 32 programs, not the H200's 132
    r = torch.zeros(10, 100)
    (_, _, args, k), = run(10, 100, 64, split_k=1, residual=r)
    assert args[4] is r and k["RESIDUAL"]
    (_, _, _, k), = run(10, 100, 64, split_k=1, precision="tf32x3")
    assert k["PRECISION"] == "tf32x3"
    (_, _, _, k), = run(10, 100, 64, dtype=torch.bfloat16, split_k=1)
    assert k["PRECISION"] is None  # bf16 on tensor cores: no option
    with pytest.raises(ValueError, match="precision='ieee' needs float32 operands"):
        run(10, 100, 64, dtype=torch.bfloat16, precision="ieee")
    with pytest.raises(ValueError, match=r"shape mismatch: x \(10, 64\), w \(100, 64\), w_up \(50, 64\)"):
        run(10, 100, 64, w_up=torch.zeros(50, 64))
    with pytest.raises(ValueError, match="expected the same dtype"):
        run(10, 100, 64, w_up=torch.zeros(100, 64, dtype=torch.float64))
    # a split keeps at least 4 K blocks: K = 512 in 64-deep blocks splits in 2 (4 blocks each), not in 4
    assert K.pick_config(1024, 512, False)["split_k"] == 2 and K.pick_config(1024, 511, False)["split_k"] == 1
    # wide (32 columns a program, no split) from half the SMs' worth of 32-column blocks: 66 blocks of 132 SMs, not 65
    assert K.pick_config(2081, 4096, False) == {"block_n": 32, "block_k": 64, "split_k": 1}
    assert K.pick_config(2080, 4096, False) == {"block_n": 16, "block_k": 64, "split_k": 4}


def test_suffix_attention_launch_splits_merge_and_layout(monkeypatch):
    """suffix_attention's and prefix_attention's launches on the CPU: key splits and merge dims for all samples' row
    blocks, no merge for one split, the token-major output's memory, mask_cols from Tk up to the rows' padding; the
    prefix's tiles (the caller's win), its splits for all samples, its mask aligned; refusals name what is wrong."""
    import vlaperf.engine.kernels.suffix_attention as A

    launches = _record_launches(monkeypatch, A)
    B, N, Tq, h, Tk = 8, 8, 51, 256, 595  # batch 8: 104 row blocks of 32, two key splits
    q, k = torch.zeros(B, N, Tq, h), torch.zeros(B, 1, Tk, h)
    mask = torch.ones(B, Tq, Tk, dtype=torch.bool)
    out = A.suffix_attention(q, k, k, mask, token_major=True)
    (p, pgrid, pargs, _), (m, mgrid, _, mk) = launches
    blocks = -(-N * Tq // 32)
    splits = A.whole_tile_splits(Tk, 32, A.default_splits(Tk, 32, B * blocks))[0]
    assert (p, pgrid, m) == ("_partial_kernel", (B, blocks, splits), "_merge_kernel") and splits > 1
    assert mgrid == (B, blocks, h // A.merge_block_d(B * blocks, h)) and mk["BLOCK_D"] == h // mgrid[2]
    assert out.shape == (B, N, Tq, h) and out.transpose(1, 2).is_contiguous()  # memory (B, Tq, N, h)
    assert pargs[11] == Tk  # contiguous rows: the mask read up to Tk
    launches.clear()
    assert A.suffix_attention(q, k, k, mask, splits=1).is_contiguous()
    assert [r[0] for r in launches] == ["_partial_kernel"]  # one pass normalises in place: no merge
    launches.clear()
    A.suffix_attention(q, k, k, A.aligned_mask(mask), mask_cols=Tk)  # exactly the keys
    assert launches[0][2][11] == Tk
    assert A.whole_tile_splits(600, 32, 6) == (5, 128)  # the docstring's example
    with pytest.raises(ValueError, match="suffix_attention needs one shared K/V head, got 1 key and 2 value heads"):
        A.suffix_attention(q, k, torch.zeros(B, 2, Tk, h), mask)
    with pytest.raises(ValueError, match="suffix_attention needs the head dim contiguous"):
        A.suffix_attention(q, k, torch.zeros(B, 1, h, Tk).transpose(2, 3), mask)
    with pytest.raises(ValueError, match="block_d=3, expected a power of two dividing the head dim 24"):
        A.suffix_attention(torch.zeros(1, 2, 3, 24), torch.zeros(1, 1, 20, 24), torch.zeros(1, 1, 20, 24),
                           torch.ones(1, 3, 20, dtype=torch.bool), splits=2, block_d=3)
    # the prefix: 2 samples of 8 x 544 rows, 68 blocks of 64 each: splits for 136 blocks (one pass), not 68's three
    launches.clear()
    T = 544
    A.prefix_attention(torch.zeros(2, 8, T, 16), torch.zeros(2, 1, T, 16), torch.zeros(2, 1, T, 16),
                       torch.ones(2, T, T, dtype=torch.bool))
    assert [r[0] for r in launches] == ["_partial_kernel"]
    assert launches[0][1] == (2, 68, A.prefix_splits(136)) == (2, 68, 1)
    launches.clear()
    A.prefix_attention(torch.zeros(1, 2, 20, 16), torch.zeros(1, 1, 20, 16), torch.zeros(1, 1, 20, 16),
                       torch.ones(1, 20, 20, dtype=torch.bool), block_m=32, splits=1)
    (_, grid, args, kw), = launches
    assert grid == (1, 2, 1) and kw["BLOCK_M"] == 32  # the caller's tiles
    assert args[3].dtype == torch.uint8 and args[3].stride(1) == 32  # rows padded to 32 bytes
    # float32 operands multiply in full precision: Triton's default TF32 put a float32 libero-pi0 at 7.9e-4 rel L2
    # (session 66, H100), over float32's 1e-4; bfloat16 operands leave the choice to Triton (there is none)
    assert kw["PRECISION"] == "ieee"
    launches.clear()
    A.suffix_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), mask)
    assert launches[0][0] == "_partial_kernel" and launches[0][3]["PRECISION"] is None


def test_merge_dims_and_mask_padding_at_their_boundaries():
    """merge_block_d halves while fewer than MERGE_PROGRAMS programs run and a half keeps MIN_MERGE_DIMS dims;
    aligned_mask pads rows to the next multiple of 16 (none for a multiple) and copies any mask whose rows or
    samples do not start 16-byte aligned or whose keys are not contiguous; readable_mask_cols assumes no padding
    for such keys."""
    from vlaperf.engine.kernels.suffix_attention import MERGE_PROGRAMS, aligned_mask, merge_block_d, readable_mask_cols

    assert merge_block_d(66, 256) == 64 and 66 * 4 == MERGE_PROGRAMS  # 264 programs: not fewer, no more halving
    assert merge_block_d(1, 64) == 32  # the half keeps 32 dims
    mask = torch.rand(2, 5, 32) > 0.5
    assert aligned_mask(mask).stride() == (5 * 32, 32, 1)  # 32 keys: no padding
    odd_samples = torch.zeros(2, 5 * 32 + 8, dtype=torch.uint8)[:, :160].view(2, 5, 32)  # sample stride 168
    assert aligned_mask(odd_samples) is not odd_samples and aligned_mask(odd_samples).stride(0) % 16 == 0
    strided = torch.zeros(1, 2, 32, dtype=torch.uint8)[..., ::2]  # (1, 2, 16), key stride 2
    assert aligned_mask(strided).stride(2) == 1 and torch.equal(aligned_mask(strided), strided)
    wide = torch.zeros(2, 5, 64, dtype=torch.uint8)
    assert readable_mask_cols(wide[..., ::2]) == 32  # keys 2 bytes apart: no padding past them


def test_custom_op_fakes_match_what_the_launchers_return(monkeypatch):
    """The custom ops' fake implementations (what torch.compile plans the graph with) give each output the shape and
    memory layout the launcher's own output has: token-major for step_attention and prefix_attention, no query rows
    for rope_qkv without write_q, (M, N) for small_m_matmul; and the ops hand their launchers unit-stride rows (a
    transposed residual included: the kernel indexes its columns densely)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import vlaperf.engine.kernels.rope_qkv as R
    import vlaperf.engine.kernels.small_m_matmul as K
    import vlaperf.engine.kernels.suffix_attention as A
    from vlaperf.engine.kernels import ops  # the custom ops, as torch.ops.vlaperf has them

    launched = {m.__name__: _record_launches(monkeypatch, m) for m in (A, K, R)}
    q, k = torch.zeros(2, 4, 5, 16), torch.zeros(2, 1, 5, 16)
    mask = torch.ones(2, 5, 5, dtype=torch.bool)
    qkv, cos = torch.zeros(2, 5, (4 + 2) * 16), torch.zeros(2, 5, 16)
    kc, vc = torch.zeros(1, 2, 1, 8, 16), torch.zeros(1, 2, 1, 8, 16)
    x, w = torch.zeros(3, 24), torch.zeros(40, 24)
    calls = [(ops.suffix_attention, (q, k, k, mask)), (ops.step_attention, (q, k, k, mask)),
             (ops.prefix_attention, (q, k, k, mask)), (ops.small_m_matmul, (x, w)),
             (ops.rope_qkv, (qkv, cos, cos, kc, vc, 0, 0, 4, 1, False)),
             (ops.rope_qkv, (qkv, cos, cos, kc, vc, 0, 0, 4, 1, True))]
    for op, args in calls:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        for r, f in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (real, fake))):
            assert (f.shape, f.stride()) == (r.shape, r.stride()), op
    assert ops.rope_qkv(*calls[4][1])[0].shape == (2, 0, 5, 16)
    assert ops.step_attention(q, k, k, mask).transpose(1, 2).is_contiguous()  # memory (B, Tq, N, h)
    # unit-stride rows for the launchers: q with its head dim strided, a transposed residual
    ops.suffix_attention(torch.zeros(2, 4, 16, 5).transpose(2, 3), k, k, mask)
    assert launched[A.__name__][-1][2][0].stride(-1) == 1
    residual = torch.randn(40, 3).T
    ops.small_m_matmul(x, w, residual=residual)
    res = launched[K.__name__][-1][2][4]
    assert res.stride(-1) == 1 and torch.equal(res, residual)


def test_custom_op_expert_step_updates_x_in_place_and_names_megakernel_when_it_does_not_fit(monkeypatch):
    """torch.ops.vlaperf.expert_step declares x mutated and returns nothing: the kernel must update the caller's x
    itself (a copy's update would be lost). A kernel too big for the GPU names the `megakernel` lever, the one to
    turn off."""
    from vlaperf.engine.kernels import expert_step as S
    from vlaperf.engine.kernels.ops import expert_step
    from vlaperf.engine.levers import LeverError

    launches = _record_launches(monkeypatch, S, add_to_x=True)
    a = _step_inputs(L=2)
    x = a.pop("x")
    expert_step(x, *a.values())
    steps = sum(r[0] == "_expert_step_kernel" for r in launches)
    assert steps == 2 * 6 and torch.equal(x, torch.full_like(x, steps))

    def too_big(*args, **kwargs):
        raise OutOfResources("out of resource: shared memory")

    monkeypatch.setattr(S, "expert_step", too_big)
    # float32 weights (these): the dtype is named as the cause, and bfloat16 as the way out (an H100 in session 65:
    # libero-pi0's step in float32 asked for 384 KiB of shared memory a block)
    with pytest.raises(LeverError, match="megakernel: the expert_step kernel does not fit .* in float32 .*Run in "
                                         "bfloat16, or without the lever"):
        expert_step(x, *a.values())
    half = {k: v.bfloat16() if v.is_floating_point() else v for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(LeverError, match="megakernel: the expert_step kernel does not fit [^(]*\\(out of resource: "
                                         "shared memory\\); its tiles are tuned for an H200"):
        expert_step(x.bfloat16(), **half, eps=a["eps"])


def test_launch_gives_pdl_from_compute_capability_9_and_only_with_a_triton_that_has_it(monkeypatch):
    """`_device_has_pdl` is compute capability 9 or newer (Hopper); a Triton without `gdc_wait` (before 3.3) gets
    no PDL even for a listed kernel on such a GPU."""
    from vlaperf.engine.kernels import launch as L

    for major, want in ((8, False), (9, True), (10, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, m=major: (m, 0))
        assert L._device_has_pdl.__wrapped__(0) is want, major
    kernel = type("Kernel", (), {"__name__": "_small_m_kernel", "arg_names": ["x_ptr", "USE_PDL"]})()
    monkeypatch.setattr(L, "PDL_KERNELS", frozenset({"_small_m_kernel"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(L, "_device_has_pdl", lambda index: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert L.pdl_here(kernel)
    monkeypatch.delattr(L.tl.extra.cuda, "gdc_wait")
    assert not L.pdl_here(kernel)


def test_compile_worker_rebuilds_every_width_of_tensor_and_reads_whole_messages():
    """rebuild_args keeps 8-byte dtypes unaligned where they were (one element off is 8 bytes, never 16) and passes a
    tuple that is no tensor description through; _receive returns what _send wrote and reports a pipe closed before
    a whole length header as EOFError (the worker's signal to exit)."""
    import io

    from vlaperf.engine.kernels.compile_worker import _receive, _send, describe_args, rebuild_args

    described = [("tensor", "int64", False), ("tensor", "float64", False), ("tensor", "int64", True), (1, 2, 3)]
    assert describe_args(rebuild_args(described, "cpu")) == described
    buf = io.BytesIO()
    _send(buf, ("ok", 1.5))
    buf.seek(0)
    assert _receive(buf) == ("ok", 1.5)
    for cut in (b"", b"\x01\x00\x00"):
        with pytest.raises(EOFError, match="compile worker closed its pipe"):
            _receive(io.BytesIO(cut))


def test_cublaslt_choice_is_the_first_algorithm_without_workspace_once_per_shape_and_device(monkeypatch):
    """_choose (no GPU needed with a stand-in LtLinear): the heuristic's first algorithm that needs no workspace,
    asked once per (shape, device) and then cached; a cuBLASLt error means no choice (F.linear serves), cached too.
    _loaded_path reads the library's path off the process's memory map."""
    import contextlib
    import io

    from vlaperf.engine.kernels import cublaslt as C

    made = []

    class FakeLt:
        def __init__(self, M, K, N):
            made.append((M, K, N))
            if K == 13:
                raise C.CublasLtError("cuBLASLt MatrixLayoutCreate returned status 7")

        def heuristics(self, bias):
            return [type("Heuristic", (), {"workspace_size": ws, "rank": i})() for i, ws in enumerate((4096, 0, 0))]

    monkeypatch.setattr(C, "LtLinear", FakeLt)
    monkeypatch.setattr(C, "_chosen", {})
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    gpu0, gpu1 = torch.device("cuda", 0), torch.device("cuda", 1)
    _, h = C._choose(8, 16, 32, gpu0, None)
    assert h.rank == 1 and C._choose(8, 16, 32, gpu0, None)[1] is h and made == [(8, 16, 32)]
    C._choose(8, 16, 32, gpu1, None)
    assert made == [(8, 16, 32)] * 2  # another GPU asks its own heuristic
    assert C._choose(8, 13, 32, gpu0, None) is None and C._choose(8, 13, 32, gpu0, None) is None
    assert made.count((8, 13, 32)) == 1
    maps = "7f00-7f10 r-xp 00000000 08:01 42 /opt/cuda/lib64/libcublasLt.so.12\n"
    monkeypatch.setattr(C, "open", lambda path: io.StringIO(maps), raising=False)
    assert C._loaded_path() == "/opt/cuda/lib64/libcublasLt.so.12"
