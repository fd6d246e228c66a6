"""y = x W^T + b through cuBLASLt with an algorithm of our choosing (ctypes, the libcublasLt torch has loaded).

Why: torch asks cuBLASLt's heuristic for one algorithm under torch's own workspace limit, and that limit
changes the heuristic's ranking. For SigLIP's fc2 (M = 512, K = 4304, N = 1152) the heuristic's first
algorithm when 32 MiB of workspace is allowed runs 13.3 us on the H200 against 15.4-16.0 us for what
torch gets (benchmarks/cublaslt_probe.py), and needs no workspace at all; in one process, interleaved,
the libero-pi0 call is 1.003x faster (-0.045 ms), aloha-pi0's (three images) 1.007x, batch 4's unchanged
(change_ab.py --change lt_fc2, docs/perf-notes.md session 23). Other prefix shapes are within 1-4% of
the fastest algorithm offered, so the engine uses it for fc2 only (`SiglipLayerW.fc2_lt`).

`LtLinear(M, K, N)` describes one shape: bf16 operands, float32 accumulation and scale, a bias epilogue
(optionally bias + GELU(tanh)). cuBLAS is column-major, so it computes D (N x M) = W (K x N)^T X (K x M):
W row-major (N, K) is a column-major K x N matrix with ld = K, X row-major (M, K) a K x M one, and D
column-major N x M is the row-major (M, N) output. `linear` keeps one LtLinear and algorithm per shape
and falls back to F.linear wherever cuBLASLt cannot serve (no CUDA, another dtype, no algorithm).
"""

from __future__ import annotations

import ctypes
import threading

import torch
import torch.nn.functional as F

# cublasLt.h's values (cuBLAS 12 and 13)
COMPUTE_32F, R_32F, R_16BF = 68, 0, 14
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_GELU_BIAS = 1, 4, 36
PREF_MAX_WORKSPACE_BYTES = 1
ALGO_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
               "inner_shape": 7, "cluster_shape": 8}
# The workspace the heuristic is told it may use: its ranking depends on it (see above)
HEURISTIC_WORKSPACE_BYTES = 32 << 20


class Algo(ctypes.Structure):  # cublasLtMatmulAlgo_t
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t: 96 bytes
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


_lib: ctypes.CDLL | None = None
_handle: ctypes.c_void_p | None = None
_lock = threading.Lock()


def _loaded_path() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            return next((line.split()[-1] for line in f if "libcublasLt.so" in line), None)
    except OSError as e:
        raise CublasLtError(f"cannot read this process's memory map: {e}") from e


def library() -> ctypes.CDLL:
    """The libcublasLt this process has loaded, found in the process's memory map, so no second copy is
    ever loaded (torch loads it with its first bf16 matmul on CUDA, which this runs if none ran yet; the
    engine's warm-up runs come before any capture, so that matmul never lands in a CUDA graph)."""
    global _lib
    if _lib is None:
        if not torch.cuda.is_available():
            raise CublasLtError("cuBLASLt needs CUDA")
        path = _loaded_path()
        if path is None and not torch.cuda.is_current_stream_capturing():
            a = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
            F.linear(a, a, a[0])
            path = _loaded_path()
        if path is None:
            raise CublasLtError("torch has not loaded libcublasLt in this process")
        _lib = ctypes.CDLL(path)
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"cuBLASLt {what} returned status {status}")


class LtLinear:
    """One shape's descriptors: y (M, N) = x (M, K) W^T (N, K) + b, with the GELU(tanh) too if `gelu`."""

    def __init__(self, M: int, K: int, N: int, bias: bool = True, gelu: bool = False):
        global _handle
        self.lib = lib = library()
        with _lock:
            if _handle is None:
                handle = ctypes.c_void_p()
                _check(lib.cublasLtCreate(ctypes.byref(handle)), "Create")
                _handle = handle
        self.handle = _handle
        self.shape, self.has_bias = (M, K, N), bias
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "MatmulDescCreate")
        self._set(DESC_TRANSA, ctypes.c_int32(OP_T))
        self._set(DESC_TRANSB, ctypes.c_int32(OP_N))
        epilogue = EPILOGUE_GELU_BIAS if gelu else EPILOGUE_BIAS if bias else EPILOGUE_DEFAULT
        self._set(DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        self.w_layout, self.x_layout, self.y_layout = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        for layout, rows, cols in ((self.w_layout, K, N), (self.x_layout, K, M), (self.y_layout, N, M)):
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), R_16BF, ctypes.c_uint64(rows),
                                                  ctypes.c_uint64(cols), ctypes.c_int64(rows)), "MatrixLayoutCreate")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._call_lock = threading.Lock()  # the bias pointer lives in the shared descriptor until the call

    def _set(self, attr: int, value) -> None:
        _check(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
               f"MatmulDescSetAttribute({attr})")

    def heuristics(self, bias: torch.Tensor | None, workspace_bytes: int = HEURISTIC_WORKSPACE_BYTES,
                   count: int = 16) -> list[Heuristic]:
        """The algorithms cuBLASLt's heuristic offers for this shape, best first (the bias pointer is
        set first: the heuristic reads its alignment)."""
        if self.has_bias:
            self._set(DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        try:
            ws = ctypes.c_uint64(workspace_bytes)
            _check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                                 ctypes.sizeof(ws)), "PreferenceSetAttribute")
            results, returned = (Heuristic * count)(), ctypes.c_int(0)
            _check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.w_layout, self.x_layout,
                                                           self.y_layout, self.y_layout, pref, count, results,
                                                           ctypes.byref(returned)), "AlgoGetHeuristic")
        finally:
            self.lib.cublasLtMatmulPreferenceDestroy(pref)
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, h: Heuristic) -> dict:
        """What an algorithm is (tile, split-K, cluster shape ids...), as cuBLASLt describes it."""
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

    def __call__(self, h: Heuristic, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor,
                 workspace: torch.Tensor | None = None) -> torch.Tensor:
        """out = x W^T + b with algorithm `h` on the current stream (x, w, out contiguous bf16, shapes as built)."""
        ws_ptr, ws_bytes = (None, 0) if workspace is None else (workspace.data_ptr(), workspace.numel())
        with self._call_lock:
            if self.has_bias:
                self._set(DESC_BIAS_POINTER, ctypes.c_void_p(b.data_ptr()))
            self._matmul(h, x, w, out, ws_ptr, ws_bytes)
        return out

    def _matmul(self, h: Heuristic, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, ws_ptr, ws_bytes: int) -> None:
        _check(self.lib.cublasLtMatmul(
            self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(w.data_ptr()), self.w_layout,
            ctypes.c_void_p(x.data_ptr()), self.x_layout, ctypes.byref(self.beta), ctypes.c_void_p(out.data_ptr()),
            self.y_layout, ctypes.c_void_p(out.data_ptr()), self.y_layout, ctypes.byref(h.algo),
            ctypes.c_void_p(ws_ptr), ctypes.c_size_t(ws_bytes),
            ctypes.c_void_p(torch.cuda.current_stream(out.device).cuda_stream)), "Matmul")


# (M, K, N, device index) -> (LtLinear, algorithm), or None where cuBLASLt offered none usable
_chosen: dict[tuple, tuple[LtLinear, Heuristic] | None] = {}


def _choose(M: int, K: int, N: int, device: torch.device, bias: torch.Tensor) -> tuple[LtLinear, Heuristic] | None:
    """The heuristic's first algorithm that needs no workspace (none to own, none to share with torch's
    streams) when 32 MiB are allowed; None (F.linear serves) if there is none or cuBLASLt fails."""
    key = (M, K, N, device.index)
    with _lock:
        known = key in _chosen
    if not known:
        try:
            with torch.cuda.device(device):
                lt = LtLinear(M, K, N)
                choice = next(((lt, h) for h in lt.heuristics(bias) if h.workspace_size == 0), None)
        except CublasLtError:
            choice = None
        with _lock:
            _chosen.setdefault(key, choice)
    return _chosen[key]


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w, b) through cuBLASLt's chosen algorithm for this shape on CUDA in bf16; F.linear
    itself elsewhere (CPU, other dtypes, no usable algorithm)."""
    if not (x.is_cuda and x.dtype == w.dtype == b.dtype == torch.bfloat16 and w.is_contiguous() and b.is_contiguous()):
        return F.linear(x, w, b)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    (M, K), N = rows.shape, w.shape[0]
    choice = _choose(M, K, N, x.device, b)
    if choice is None:
        return F.linear(x, w, b)
    lt, h = choice
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    lt(h, rows, w, b, out)
    return out.view(*x.shape[:-1], N)
