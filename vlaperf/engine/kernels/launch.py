"""Launching the engine's Triton kernels, or only compiling them.

The first call of a compiled engine spends seconds compiling these kernels, one after another,
each at its first launch (first_call.py: 4.7 s of libero-pi0 best's 15.5 s on the H200), while
torch.compile has the main thread. `Engine` runs its uncompiled path once in a thread meanwhile,
inside `compile_only()`: every launch below becomes `kernel.warmup(...)`, which compiles for
exactly the arguments a launch would get (dtypes, alignment, the integers Triton specializes
on) and runs nothing. Triton's compiler does most of its work without holding the GIL (two
step-kernel compiles in two threads took 3.8 s against 3.4-4.0 s each alone), so the two
threads overlap: that first call took 9.4 s with the thread (docs/perf-notes.md, version 52).
"""

from __future__ import annotations

import contextlib
import threading

_state = threading.local()


@contextlib.contextmanager
def compile_only():
    """In this thread, until the block ends, kernels compile and do not run (their outputs stay
    whatever the buffers held)."""
    _state.compile_only = True
    try:
        yield
    finally:
        _state.compile_only = False


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), or only its compile inside `compile_only()`."""
    if getattr(_state, "compile_only", False):
        kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)
