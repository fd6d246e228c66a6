"""Compile the engine's Triton kernels in worker processes: their compiles then run side by side,
which threads cannot do (the GIL: four compile threads each ran 1.4-1.9x slower, session 12).

A worker is a fresh interpreter (`python -m vlaperf.engine.kernels.compile_worker DEVICE`), not a
multiprocessing child, so a user's script is never imported again. It reads requests from stdin,
each a pickled (module, kernel name, launches) with every launch's arguments described as Triton
specializes on them (`describe_args`), rebuilds arguments that specialize the same way
(`rebuild_args`: same dtypes, same 16-byte alignment, the same integers) and calls
`kernel.warmup`. The compiled kernel lands in Triton's cache directory (the worker inherits the
environment, TRITON_CACHE_DIR included), where the engine's own compile of the same launch then
finds it. Replies go back on stdout; anything else the worker prints goes to stderr, which
`CompileWorkers` discards.

`CompileWorkers` starts the processes (they import torch while the engine is being built) and
hands them the recorded launches of a first call, one kernel per request, the slowest first.
Anything that goes wrong only costs time: the engine compiles what is missing itself.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time

import torch


def describe_args(args) -> list:
    """Arguments as Triton specializes on them, picklable: a tensor as ("tensor", dtype name,
    16-byte aligned), anything else (integers, floats, None, bools) as itself."""
    return [("tensor", str(a.dtype).split(".")[-1], a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a
            for a in args]


def rebuild_args(described: list, device: torch.device | str) -> list:
    """Arguments that specialize as `described` did: small tensors of those dtypes, aligned or one
    element off, on `device`."""
    out = []
    for a in described:
        if isinstance(a, tuple) and len(a) == 3 and a[0] == "tensor":
            t = torch.empty(64, dtype=getattr(torch, a[1]), device=device)
            out.append(t if a[2] else t[1:])
        else:
            out.append(a)
    return out


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("compile worker closed its pipe")
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def compile_request(module: str, name: str, launches: list, device: torch.device | str) -> float:
    """One request as a worker serves it: every launch of one kernel, compiled; returns seconds."""
    kernel = getattr(importlib.import_module(module), name)
    start = time.perf_counter()
    for grid, described, kwargs in launches:
        kernel.warmup(*rebuild_args(described, device), grid=grid, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the replies
    requests = sys.stdin.buffer
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))
        torch.cuda.init()
    _send(replies, ("ready", 0.0))
    while True:
        try:
            module, name, launches = _receive(requests)
        except EOFError:
            return
        try:
            _send(replies, ("ok", compile_request(module, name, launches, device)))
        except Exception as e:
            _send(replies, ("error", f"{name}: {type(e).__name__}: {e}"))


class CompileWorkers:
    """A few compile worker processes for one device, started now (each imports torch and makes a
    CUDA context: a few seconds, meanwhile the engine is built). `compile` gives each recorded
    kernel to one worker and waits; `close` ends them, and with them their GPU memory."""

    def __init__(self, count: int, device: torch.device | str, command: list[str] | None = None):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = str(device)
        cmd = command or [sys.executable, "-m", "vlaperf.engine.kernels.compile_worker", self.device]
        # stderr to /dev/null: Triton's warnings would repeat in the user's terminal once per worker;
        # failures come back as replies, or as a closed pipe (then the engine compiles by itself)
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                      for _ in range(count)]

    def compile(self, launches: list, first: tuple[str, ...] = (), timeout: float = 60.0) -> dict[str, float]:
        """Compile recorded launches (kernel, grid, args, kwargs) in the workers, one kernel per
        request, those named in `first` handed out first; returns each kernel's seconds in its
        worker. Raises if a worker fails, or after `timeout` (the whole took ~5 s on the H200's
        host: a worker that hangs must not hold the first call for long), killing the workers."""
        by_kernel: dict = {}
        for kernel, grid, args, kwargs in launches:
            by_kernel.setdefault(kernel, []).append((grid, describe_args(args), kwargs))
        order = sorted(by_kernel, key=lambda k: k.__name__ not in first)
        queue, lock, results, errors = list(order), threading.Lock(), {}, []

        def serve(proc) -> None:
            try:
                if _receive(proc.stdout)[0] != "ready":
                    raise RuntimeError("compile worker did not start")
                while True:
                    with lock:
                        if not queue or errors:
                            return
                        kernel = queue.pop(0)
                    _send(proc.stdin, (kernel.fn.__module__, kernel.__name__, by_kernel[kernel]))
                    status, value = _receive(proc.stdout)
                    if status != "ok":
                        raise RuntimeError(value)
                    results[kernel.__name__] = results.get(kernel.__name__, 0.0) + value
            except Exception as e:
                errors.append(e)

        feeders = [threading.Thread(target=serve, args=(p,), daemon=True) for p in self.procs]
        for t in feeders:
            t.start()
        deadline = time.monotonic() + timeout
        for t in feeders:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in feeders):
            self.close(kill=True)
            raise TimeoutError(f"compile workers took longer than {timeout:.0f} s")
        if errors:
            raise errors[0]
        return results

    def close(self, kill: bool = False) -> None:
        """End the workers: at the end of their input, or at once with `kill`."""
        for p in self.procs:
            try:
                p.kill() if kill else p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


if __name__ == "__main__":
    main()
