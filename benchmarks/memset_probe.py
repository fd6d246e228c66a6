"""Where the prefix's memset nodes come from, and what they cost inside a CUDA graph.

The kernel sequence of a libero-pi0 `best` call (profiles/kernel_sequence_best_s16.txt) has 44
`Memset` nodes: one before each SigLIP attention call (cuDNN's SDPA, 27) and one before each
Gemma gate_up GEMM (cuBLASLt's `coopB` kernel, 17). Around each the GPU idles ~4.5 us (1.3 us
before the memset, 3-4 us after it) where two kernels back to back leave ~0.1 us. That is
~0.25 ms a call if it is real and not the profiler's.

This times short chains that look like the call (a norm-like kernel, the op, the next GEMM),
20-40 links in one CUDA graph, with the op in each formulation, interleaved over rounds; and
counts the memset nodes each formulation puts into its graph (torch.profiler over one replay).

    python benchmarks/memset_probe.py --json $OUT/memset_probe.json

The chains run eager between the captured ops, so a formulation that changes its output's layout
changes the eager kernels after it too: the gate_up halves' 1.13x (session 19) is mostly the GELU x up
reading contiguous halves instead of strided ones, which inductor's fused kernel in the call does not
pay. The call itself answers whether the memsets cost anything (change_ab.py split_gate_up: 0.996x).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from kernel_timing import capture, replay_ms  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda


def memsets_in(g) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        kernels.setdefault(e.name[:70], []).append(e.device_time)
    memset = sum(len(v) for k, v in kernels.items() if "memset" in k.lower())
    top = sorted(((round(sum(v), 1), len(v), k) for k, v in kernels.items()), reverse=True)[:6]
    return {"memsets": memset, "top_kernels_us_calls_name": top}


# ----------------------------------------------------------------- chains

def siglip_chain(variant: str, links: int = 27):
    """norm -> qkv GEMM -> attention (variant) -> o GEMM -> residual, 27 times (SigLIP, 2 images)."""
    B, T, D, H = 2, 256, 1152, 16
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(B, T, D, device=dev, dtype=bf)
    wqkv = (torch.randn(3 * D, D, device=dev) / D**0.5).to(bf)
    bqkv = torch.randn(3 * D, device=dev, dtype=bf) * 0.1
    wo = (torch.randn(D, D, device=dev) / D**0.5).to(bf)
    bo = torch.randn(D, device=dev, dtype=bf) * 0.1
    ln = (torch.ones(D, device=dev, dtype=bf), torch.zeros(D, device=dev, dtype=bf))

    def attend(q, k, v):
        if variant == "cudnn":
            return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, False, False)[0]
        if variant == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]
        if variant == "efficient":
            return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0]
        if variant == "sdpa_default":
            return F.scaled_dot_product_attention(q, k, v)
        raise ValueError(variant)

    out_buf = torch.empty_like(x)

    def fn():
        y = x
        for _ in range(links):
            h = F.layer_norm(y, (D,), *ln, 1e-6)
            q, k, v = F.linear(h, wqkv, bqkv).split(D, dim=-1)
            heads = lambda t: t.view(B, T, H, D // H).transpose(1, 2)  # noqa: E731
            o = attend(heads(q), heads(k), heads(v))
            y = y + F.linear(o.transpose(1, 2).reshape(B, T, D), wo, bo)
        out_buf.copy_(y)

    def check():
        q, k, v = (torch.randn(B, H, T, D // H, device=dev, dtype=bf) for _ in range(3))
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * (D // H) ** -0.5, -1) @ v.float()
        return ((attend(q, k, v).float() - ref).norm() / ref.norm()).item()

    return fn, check, links


def gemma_mlp_chain(variant: str, links: int = 17):
    """norm-like scale -> gate_up GEMM (variant) -> GELU x up -> down GEMM -> residual, 17 times."""
    M, D, F_ = 544, 2048, 16384
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(M, D, device=dev, dtype=bf)
    scale = torch.rand(D, device=dev, dtype=bf) + 0.5
    wgu = (torch.randn(2 * F_, D, device=dev) / D**0.5).to(bf)  # (N, K): what F.linear takes
    wgu_t = wgu.t().contiguous()  # (K, N)
    wd = (torch.randn(D, F_, device=dev) / F_**0.5).to(bf)
    zero_bias = torch.zeros(2 * F_, device=dev, dtype=bf)
    out_buf = torch.empty_like(x)

    def gate_up(h):
        if variant == "linear":
            return F.linear(h, wgu)
        if variant == "mm_kn":
            return torch.mm(h, wgu_t)
        if variant == "halves":  # gate and up as two GEMMs of half the width, no concatenation
            return F.linear(h, wgu[:F_]), F.linear(h, wgu[F_:])
        if variant == "addmm_bias0":
            return torch.addmm(zero_bias, h, wgu.t())
        raise ValueError(variant)

    def fn():
        y = x
        for _ in range(links):
            h = y * scale
            gu = gate_up(h)
            g, u = gu if isinstance(gu, tuple) else gu.chunk(2, dim=-1)
            y = y + F.linear(F.gelu(g, approximate="tanh") * u, wd) * 0.01
        out_buf.copy_(y)

    def check():
        h = torch.randn(M, D, device=dev, dtype=bf)
        ref = h.float() @ wgu.float().t()
        gu = gate_up(h)
        gu = torch.cat(gu, dim=-1) if isinstance(gu, tuple) else gu
        return ((gu.float() - ref).norm() / ref.norm()).item()

    return fn, check, links


def gemma_attention_chain(variant: str, links: int = 18):
    """qkv GEMM -> attention (variant) -> o GEMM -> residual, 18 times (Gemma's prefix: 544 tokens,
    8 query heads over one K/V head of 256, the last 12 keys padding). `flash_nomask` attends to the
    padding keys too: a timing of the kernel only, not an equivalent formulation."""
    T, D, N, h, valid = 544, 2048, 8, 256, 532
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(1, T, D, device=dev, dtype=bf)
    wqkv = (torch.randn((N + 2) * h, D, device=dev) / D**0.5).to(bf)
    wo = (torch.randn(D, N * h, device=dev) / (N * h) ** 0.5).to(bf)
    pad = torch.arange(T, device=dev) < valid
    mask = (pad[None, :, None] & pad[None, None, :]) | torch.eye(T, dtype=torch.bool, device=dev)[None]
    mask_u8 = mask.to(torch.uint8)
    cum_q = torch.tensor([0, T], device=dev, dtype=torch.int32)
    cum_k = torch.tensor([0, valid], device=dev, dtype=torch.int32)
    out_buf = torch.empty_like(x)

    def attend(q, k, v):  # q (1, N, T, h), k / v (1, 1, T, h)
        if variant == "triton":
            from vlaperf.engine.kernels.ops import prefix_attention

            return prefix_attention(q, k, v, mask_u8)
        if variant == "cudnn_mask":
            return F.scaled_dot_product_attention(q, k.expand(-1, N, -1, -1), v.expand(-1, N, -1, -1), attn_mask=mask[:, None])
        if variant == "flash_nomask":
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k.expand(-1, N, -1, -1), v.expand(-1, N, -1, -1))[0]
        if variant == "flash_varlen":
            out = torch.ops.aten._flash_attention_forward(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                                          cum_q, cum_k, T, T, 0.0, False, False)[0]
            return out.transpose(0, 1)[None]  # (T, N, h) -> (1, N, T, h)
        raise ValueError(variant)

    def fn():
        y = x
        for _ in range(links):
            q, k, v = F.linear(y, wqkv).split([N * h, h, h], dim=-1)
            q = q.view(1, T, N, h).transpose(1, 2)
            k, v = k.view(1, T, 1, h).transpose(1, 2), v.view(1, T, 1, h).transpose(1, 2)
            o = attend(q, k, v)
            y = y + F.linear(o.transpose(1, 2).reshape(1, T, N * h), wo) * 0.01
        out_buf.copy_(y)

    def check():
        q = torch.randn(1, N, T, h, device=dev, dtype=bf)
        k, v = torch.randn(1, 1, T, h, device=dev, dtype=bf), torch.randn(1, 1, T, h, device=dev, dtype=bf)
        s = (q.float() @ k.float().transpose(-1, -2)) * h**-0.5
        if variant != "flash_nomask":
            s = s.masked_fill(~mask[:, None], float("-inf"))
        ref = torch.softmax(s, -1) @ v.float()
        got = attend(q, k, v).float()
        rows = pad  # the padding queries' outputs are never read
        return ((got[:, :, rows] - ref[:, :, rows]).norm() / ref[:, :, rows].norm()).item()

    return fn, check, links


CHAINS = {
    "siglip_attention": (siglip_chain, ["sdpa_default", "cudnn", "flash", "efficient"]),
    "gemma_gate_up": (gemma_mlp_chain, ["linear", "mm_kn", "halves", "addmm_bias0"]),
    "gemma_attention": (gemma_attention_chain, ["triton", "cudnn_mask", "flash_varlen", "flash_nomask"]),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--blas", default=None, help="torch.backends.cuda.preferred_blas_library before anything runs")
    args = p.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    result = {"schema": SCHEMA, "command": "memset-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": f"memset probe (blas {args.blas or 'default'})", "dtype": "bfloat16"},
              "mode": None, "env": environment_record("cuda"), "chains": {}}
    for chain, (build, variants) in CHAINS.items():
        graphs, rows, keep = {}, {}, {}  # keep: each chain's closure holds the tensors its graph reads
        for v in variants:
            torch.manual_seed(0)
            try:
                fn, check, links = build(v)
                keep[v] = fn
                rows[v] = {"rel_l2_vs_fp32": check(), "links": links}
                graphs[v] = capture(fn, warmup=2)
                rows[v].update(memsets_in(graphs[v]))
            except Exception as e:  # a formulation that fails is a finding
                rows[v] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(chain, v, rows[v], flush=True)
        times = {v: [] for v in graphs}
        for _ in range(args.rounds):  # interleaved: each round replays every formulation once
            for v, g in graphs.items():
                times[v].append(replay_ms(g))
        base = variants[0]
        for v in graphs:
            med = statistics.median(times[v])
            rows[v]["median_ms"] = round(med, 4)
            rows[v]["per_link_us"] = round(med * 1e3 / rows[v]["links"], 2)
            if base in times:
                ratios = sorted(b / a for a, b in zip(times[v], times[base]))
                rows[v]["speedup_vs_" + base] = round(statistics.median(ratios), 4)
        result["chains"][chain] = rows
        del graphs, keep
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'chain':18s} {'variant':14s} {'us/link':>8s} {'speedup':>8s} {'memsets':>8s} {'rel_l2':>9s}")
    for chain, rows in result["chains"].items():
        for v, r in rows.items():
            sp = next((val for key, val in r.items() if key.startswith("speedup_vs_")), "-")
            print(f"{chain:18s} {v:14s} {r.get('per_link_us', '-'):>8} {sp:>8} {r.get('memsets', '-'):>8} "
                  f"{r.get('rel_l2_vs_fp32', float('nan')):>9.2e}")


if __name__ == "__main__":
    require_cuda(__file__)
    main()
