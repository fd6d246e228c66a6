"""The prefix's GEMM shapes through every algorithm cuBLASLt's heuristic offers, against what `best`
runs (F.linear, or the fused GELU epilogue), in CUDA-graph replays.

Session 38 (gemm_probe.py) found no Triton template faster than cuBLAS on these shapes, and
session 47 (splitk_probe.py) no other formulation of the same product; both took cuBLAS's first
choice. SigLIP's o_proj and fc2 still run at 256 and 365 TFLOP/s (M = 512: 36 output tiles of
128 x 128 on 132 SMs). cuBLASLt's heuristic returns a ranked list of algorithms (tiles, split-K,
cluster shapes); torch takes the first. This times each of them.

Each timing is a graph of one matmul per weight copy, the copies rotated so that together they
are larger than L2 (as in a call, where each layer's weights come from HBM once), replayed 5
times; the fastest replay over the number of matmuls. Every algorithm's output is checked
against F.linear's (rel L2) before it is timed.

    python benchmarks/cublaslt_probe.py --json $OUT/cublaslt_probe.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math

import torch
import torch.nn.functional as F

from gemm_probe import SHAPES, cublas  # benchmarks/ (the script's folder is on sys.path)
from kernel_timing import capture, replay_ms

from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record

# cublasLt.h's enum values (cuBLAS 12 / 13)
COMPUTE_32F, R_32F, R_16BF = 68, 0, 14
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_GELU_BIAS = 1, 4, 36
PREF_MAX_WORKSPACE_BYTES = 1
ALGO_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
               "inner_shape": 7, "cluster_shape": 8}
WORKSPACE_BYTES = 32 << 20
L2_COVER_BYTES = 180 << 20  # the weight copies of one timing together: three times the H200's 60 MB of L2


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_cublaslt() -> ctypes.CDLL:
    """The libcublasLt torch has loaded (found in the process's memory map after one bf16 matmul)."""
    a = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
    F.linear(a, a, a[0])
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = [line.split()[-1] for line in f if "libcublasLt.so" in line]
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process")
    return ctypes.CDLL(paths[0])


class LtLinear:
    """y = x W^T (+ b) (GELU(tanh)) for one shape, through cuBLASLt: column-major, C (N x M) = W^T' X'."""

    def __init__(self, lib: ctypes.CDLL, M: int, K: int, N: int, has_bias: bool, epilogue: str | None):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        self._ok(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.desc = ctypes.c_void_p()
        self._ok(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "MatmulDescCreate")
        self._set_desc(DESC_TRANSA, ctypes.c_int32(OP_T))
        self._set_desc(DESC_TRANSB, ctypes.c_int32(OP_N))
        ep = EPILOGUE_GELU_BIAS if epilogue == "gelu" else EPILOGUE_BIAS if has_bias else EPILOGUE_DEFAULT
        self._set_desc(DESC_EPILOGUE, ctypes.c_uint32(ep))
        self.has_bias = has_bias
        self.a_layout, self.b_layout, self.d_layout = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        for layout, rows, cols, ld in ((self.a_layout, K, N, K), (self.b_layout, K, M, K), (self.d_layout, N, M, N)):
            self._ok(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), R_16BF, ctypes.c_uint64(rows),
                                                    ctypes.c_uint64(cols), ctypes.c_int64(ld)), "MatrixLayoutCreate")
        self.pref = ctypes.c_void_p()
        self._ok(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        self._ok(lib.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                          ctypes.sizeof(ws)), "PreferenceSetAttribute")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _ok(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cuBLASLt {what} returned status {status}")

    def _set_desc(self, attr: int, value) -> None:
        self._ok(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
                 f"MatmulDescSetAttribute({attr})")

    def heuristics(self, bias: torch.Tensor | None, count: int = 64) -> list[Heuristic]:
        if self.has_bias:
            self._set_desc(DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        results = (Heuristic * count)()
        returned = ctypes.c_int(0)
        self._ok(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.a_layout, self.b_layout,
                                                         self.d_layout, self.d_layout, self.pref, count, results,
                                                         ctypes.byref(returned)), "AlgoGetHeuristic")
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, h: Heuristic) -> dict:
        out = {"workspace": int(h.workspace_size), "waves": round(float(h.waves), 3)}
        get = self.lib.cublasLtMatmulAlgoConfigGetAttribute
        for name, attr in ALGO_CONFIG.items():
            size = ctypes.c_size_t(0)  # asked first: the call wants the attribute's exact size
            if get(ctypes.byref(h.algo), attr, None, ctypes.c_size_t(0), ctypes.byref(size)) != 0 or size.value > 8:
                continue
            buf = ctypes.create_string_buffer(8)
            if get(ctypes.byref(h.algo), attr, buf, size, ctypes.byref(size)) == 0:
                out[name] = int.from_bytes(buf.raw[: size.value], "little")
        return out

    def __call__(self, h: Heuristic, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor):
        if self.has_bias:
            self._set_desc(DESC_BIAS_POINTER, ctypes.c_void_p(b.data_ptr()))
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._ok(self.lib.cublasLtMatmul(
            self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(w.data_ptr()), self.a_layout,
            ctypes.c_void_p(x.data_ptr()), self.b_layout, ctypes.byref(self.beta), ctypes.c_void_p(out.data_ptr()),
            self.d_layout, ctypes.c_void_p(out.data_ptr()), self.d_layout, ctypes.byref(h.algo),
            ctypes.c_void_p(self.workspace.data_ptr()), ctypes.c_size_t(WORKSPACE_BYTES), stream), "Matmul")
        return out


def per_matmul_us(fn_for_copy, copies: int) -> float:
    """One graph of `copies` matmuls (one per weight copy), replayed 5 times: the fastest replay / copies, in us."""
    g = capture(lambda: [fn_for_copy(i) for i in range(copies)], reps=1)
    return min(replay_ms(g) for _ in range(5)) / copies * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of " + ", ".join(SHAPES))
    p.add_argument("--algos", type=int, default=64, help="how many algorithms to ask the heuristic for")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = "cuda"
    lib = load_cublaslt()
    result = {"schema": SCHEMA, "command": "cublaslt-probe", "workload": {"id": "libero-pi0", "overrides": {}},
              "variant": {"levers": [], "label": "gemm shapes, cuBLASLt algorithms", "dtype": "bfloat16"},
              "mode": None, "env": environment_record(dev), "rows": []}
    for name in args.shapes.split(","):
        M, K, N, has_bias, epilogue = SHAPES[name]
        copies = max(4, min(64, math.ceil(L2_COVER_BYTES / (N * K * 2))))
        torch.manual_seed(0)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        ws = [(torch.randn(N, K, device=dev) / K**0.5).to(torch.bfloat16) for _ in range(copies)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) if has_bias else None for _ in range(copies)]
        outs = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        flop = 2 * M * K * N
        ref = cublas(x, ws[0], bs[0], epilogue).float()
        row = {"name": name, "M": M, "K": K, "N": N, "bias": has_bias, "epilogue": epilogue, "copies": copies}
        base = [per_matmul_us(lambda i: cublas(x, ws[i], bs[i], epilogue), copies)]
        lt = LtLinear(lib, M, K, N, has_bias, epilogue)
        algos = []
        for rank, h in enumerate(lt.heuristics(bs[0], args.algos)):
            entry = {"rank": rank, **lt.config(h)}
            try:
                outs[0].fill_(float("nan"))
                lt(h, x, ws[0], bs[0], outs[0])
                torch.cuda.synchronize()
                entry["rel_l2"] = ((outs[0].float() - ref).norm() / ref.norm()).item()
                if not entry["rel_l2"] < 2e-2:  # NaN fails too
                    entry["error"] = "wrong result"
                else:
                    entry["us"] = round(per_matmul_us(lambda i, h=h: lt(h, x, ws[i], bs[i], outs[i]), copies), 2)
                    entry["tflops"] = round(flop / entry["us"] / 1e6, 1)
            except Exception as e:  # one algorithm failing must not lose the others
                entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            algos.append(entry)
        base.append(per_matmul_us(lambda i: cublas(x, ws[i], bs[i], epilogue), copies))
        row["baseline_us"] = [round(b, 2) for b in base]
        row["baseline_tflops"] = round(flop / min(base) / 1e6, 1)
        row["algos"] = algos
        timed = [a for a in algos if "us" in a]
        best = min(timed, key=lambda a: a["us"]) if timed else None
        row["best"] = best
        row["best_vs_baseline"] = round(min(base) / best["us"], 3) if best else None
        result["rows"].append(row)
        print(f"{name:16s} baseline {base[0]:.2f}/{base[1]:.2f} us ({row['baseline_tflops']} TFLOP/s); "
              f"{len(algos)} algos, {len(timed)} timed; best {best and best['us']} us (rank {best and best['rank']}, "
              f"tile {best and best.get('tile')}, splitk {best and best.get('splitk')}, "
              f"cluster {best and best.get('cluster_shape')}) -> {row['best_vs_baseline']}x", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
