"""Launching the engine's Triton kernels, or only compiling them.

The first call of a compiled engine spends seconds compiling these kernels, one after another,
each at its first launch (first_call.py: 4.7 s of libero-pi0 best's 15.5 s on the H200), while
torch.compile has the main thread. `Engine` runs its uncompiled path once in a thread meanwhile,
inside `compile_only()`: every launch below becomes `kernel.warmup(...)`, which compiles for
exactly the arguments a launch would get (dtypes, alignment, the integers Triton specializes
on) and runs nothing. Part of Triton's compile runs without the GIL (two step-kernel compiles in
two threads took 3.8 s against 3.4-4.0 s each alone on the CPU machine), so the thread overlaps
torch.compile: that first call took 9.4 s with the thread (docs/perf-notes.md, version 52).

With `record`, the pass only collects the launches (a fraction of a second) and
`compile_recorded` then compiles them, the slowest to compile (the step kernel, ~2.3 s) first:
the main thread otherwise reached pi0.5's step kernel while the pass was still compiling the
prefix's kernels, and compiled it a second time. The engine compiles them in one thread: in
four, each compile took 1.4-1.9x longer, and two gave no faster first call (session 12). Worker
processes do overlap them (compile_worker.py): the thread's own compiles then find their work
in Triton's cache.

Programmatic dependent launch (PDL, Hopper and newer): a kernel that takes a `USE_PDL`
constexpr starts with `pdl_wait(USE_PDL)`. Launched with PDL, its programs may be scheduled
while the kernel before it in the stream drains, and wait in-kernel (`griddepcontrol.wait`)
until that kernel has finished and its writes are visible; they then let the next kernel be
scheduled early the same way. Waiting first, before any load or store, keeps the order of
every read and write as without PDL, and since every such kernel waits, a kernel never
completes before the one it follows. What it saves is the launch gap between kernels, which
a CUDA graph shortens but does not remove.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

_state = threading.local()

# The kernels launched with PDL where the GPU has it (compute capability 9+, not in Triton's CPU
# interpreter): none by default. On the H200 every kernel of ours with PDL lost in the call
# (libero-pi0 0.997x, benchmarks/change_ab.py --change kernel_pdl); its kernel sequences
# (profiles/*_s21g.txt) had the steps 34 us faster (the heads' chain between two step launches
# 25.6 -> 22.1 us) and the prefix 65 us slower. The denoise loop's kernels alone (the step kernel
# and the float32 heads between its launches) are the next A/B, not yet measured
# (docs/perf-notes.md, session 21).
DENOISE_LOOP_KERNELS = frozenset({"_expert_step_kernel", "_mod_prologue_kernel", "_small_m_kernel", "_reduce_kernel"})
PDL_KERNELS: frozenset[str] = frozenset()


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """First thing in a kernel that takes USE_PDL: wait for the kernel before it (its writes
    visible), then let the next one be scheduled. A no-op without PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.lru_cache(maxsize=None)
def _device_has_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_here(kernel) -> bool:
    """Whether `kernel` is launched with PDL on the current CUDA device now."""
    if getattr(kernel, "__name__", None) not in PDL_KERNELS:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return False
    if not hasattr(tl.extra.cuda, "gdc_wait"):  # Triton before 3.3 has no PDL
        return False
    return _device_has_pdl(torch.cuda.current_device())


@contextlib.contextmanager
def compile_only(record: list | None = None):
    """In this thread, until the block ends, kernels compile and do not run (their outputs stay
    whatever the buffers held); with `record`, they are not even compiled but appended to it as
    (kernel, grid, args, kwargs), for `compile_recorded`."""
    _state.compile_only, _state.record = True, record
    try:
        yield
    finally:
        _state.compile_only, _state.record = False, None


def compiling_only() -> bool:
    """Whether this thread is inside `compile_only()` (the engine's kernel-compile pass, whose outputs are discarded)."""
    return getattr(_state, "compile_only", False)


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), or only its compile inside `compile_only()`, with fused
    multiply-add asked for. A kernel that takes USE_PDL gets it, and the launch PDL, where
    `pdl_here(kernel)`."""
    # Fused multiply-add, as every figure of these kernels was tuned, checked and measured with. Triton 3.9 warns that
    # its default turns it off in 3.10 (TRITON_DEFAULT_FP_FUSION); asked for by name, a new Triton compiles the same
    # kernels; on the H200's Triton 3.6, whose default is on, the request changes nothing. Triton 3.9's
    # TRITON_FORCE_DISABLE_FP_FUSION still wins over it (the doctor warns).
    kwargs.setdefault("enable_fp_fusion", True)
    if "USE_PDL" in getattr(kernel, "arg_names", ()):
        use = pdl_here(kernel)
        kwargs["USE_PDL"] = use
        if use:
            kwargs["launch_pdl"] = True
    if compiling_only():
        if _state.record is not None:
            _state.record.append((kernel, grid, args, kwargs))
        else:
            kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)


def compile_recorded(launches: list, first: tuple[str, ...] = (), workers: int = 4) -> None:
    """Compile recorded launches in up to `workers` threads: one task per kernel, its launches in
    order (a specialization seen twice is a cache hit the second time, never two compiles at
    once), the kernels named in `first` submitted first. Raises the first task's error."""
    by_kernel: dict = {}
    for kernel, grid, args, kwargs in launches:
        by_kernel.setdefault(kernel, []).append((grid, args, kwargs))
    order = sorted(by_kernel, key=lambda k: getattr(k, "__name__", "") not in first)  # stable: first ones first

    def compile_kernel(kernel) -> None:
        for grid, args, kwargs in by_kernel[kernel]:
            kernel.warmup(*args, grid=grid, **kwargs)

    if not order:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(order))), thread_name_prefix="vlaperf-kernel-compile") as pool:
        for done in [pool.submit(compile_kernel, k) for k in order]:
            done.result()
