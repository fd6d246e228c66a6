"""The policy path's host <-> device pieces, one by one, on this machine (served_path_probe.py found
its upload at 0.59 ms and its copy of the actions to the host at 0.24 ms on the H200's host).

    python benchmarks/upload_probe.py --json $OUT/upload_probe.json

Each piece is timed on the host clock, median of `--rounds`, with the GPU idle before it:
- upload: `ObservationTransform.upload` whole (synced), then its parts: filling the pinned staging
  buffer on the host, the `.to(device, non_blocking=True)` call's return, the wait for the copy;
  against the same bytes copied into a preallocated device buffer, and from pageable memory;
- preprocess: the eager uint8 -> [-1, 1] float kernels (synced);
- to host: the actions' robot dims sliced on the device then copied (`[..., :7].cpu()`, as the
  policy does), against the whole contiguous tensor copied then sliced on the host, and against a
  non-blocking copy into a pinned buffer and an event's wait;
- the whole upload again right after ~13 ms of the GPU busy (the host waiting in a sync), the host
  asleep, or the host busy: which of them makes it slower in a policy call's sequence; and after
  the GPU's 13 ms with a 4-byte transfer issued first (either way): whether a tiny transfer ahead
  takes the after-pause cost off the upload; then the upload's pieces (and a fixed Python loop) back to back and
  after a pause: whether the host's own work or the transfer is what slows down; last the whole upload with its
  staging buffer in 2 MB pages against torch's pinned buffer, alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from engine_ab import sleep_cycles_per_ms  # benchmarks/ (the script's folder is on sys.path)
from engine_ab import timed as one_call_ms  # one synced call, ms

from vlaperf.inputs import ObservationTransform, make_example
from vlaperf.models.pi0 import get_config
from vlaperf.report.schema import SCHEMA
from vlaperf.timing import environment_record, require_cuda
from vlaperf.workloads import get_workload


def timed(fn, rounds: int) -> float:
    """Median ms of `rounds` synced calls (engine_ab.timed: the GPU idle before each)."""
    return statistics.median(one_call_ms(fn) for _ in range(rounds))


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def hugepage_pinned(nbytes: int) -> dict:
    """A host buffer of `nbytes` (rounded up to 2 MB) in transparent huge pages, registered with CUDA as pinned;
    with what the kernel gave (the THP setting, the process's huge-page bytes after touching it)."""
    import mmap

    page = 2 << 20
    size = -(-nbytes // page) * page
    record: dict = {"bytes": size}
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            record["thp_enabled"] = f.read().strip()
    except OSError as e:
        record["thp_enabled"] = f"unreadable: {e}"
    try:
        m = mmap.mmap(-1, size + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = np.frombuffer(m, dtype=np.uint8)
        off = (-raw.ctypes.data) % page
        m.madvise(mmap.MADV_HUGEPAGE, off, size)
        arr = raw[off : off + size]
        arr[:] = 1  # touched: the kernel backs the range now
        with open("/proc/self/smaps_rollup") as f:
            record["anon_huge_kb"] = next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages")), None)
        t = torch.from_numpy(arr)
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), size, 0)
        record["register_status"] = int(getattr(err, "value", err))
        record["is_pinned"] = bool(t.is_pinned())
        hugepage_pinned.keep = m  # the mapping must outlive the tensor
        return {"record": record, "tensor": t if record["register_status"] == 0 else None}
    except Exception as e:  # a probe: report, do not stop
        record["error"] = f"{type(e).__name__}: {e}"
        return {"record": record, "tensor": None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    w = get_workload(args.workload)
    cfg = get_config(w.preset)
    dev = torch.device("cuda")
    tr = ObservationTransform(w, cfg, None, dev)
    hb = tr.host_arrays(make_example(w))
    for _ in range(5):
        tr.preprocess(tr.upload(hb))
    torch.cuda.synchronize()
    nbytes = tr.upload(hb).state.untyped_storage().nbytes()  # the bytes one upload copies
    host = tr._host_buffer[:nbytes]
    flat = host.numpy()
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    images = np.stack([np.stack(s) for s in hb.pixels])
    out: dict[str, float] = {}

    def upload_synced():
        tr.upload(hb)
        torch.cuda.synchronize()

    out["upload_whole_synced"] = timed(upload_synced, args.rounds)
    out["fill_staging_host"] = timed(lambda: flat[: images.size].__setitem__(..., images.reshape(-1)), args.rounds)
    out["to_device_call_return"] = timed(lambda: host.to(dev, non_blocking=True), args.rounds)
    out["to_device_synced"] = timed(lambda: (host.to(dev, non_blocking=True), torch.cuda.synchronize()), args.rounds)
    out["copy_into_prealloc_synced"] = timed(lambda: (dev_buf.copy_(host, non_blocking=True), torch.cuda.synchronize()),
                                             args.rounds)
    out["copy_from_pageable_synced"] = timed(lambda: (dev_buf.copy_(pageable), torch.cuda.synchronize()), args.rounds)
    out["event_create_record"] = timed(lambda: torch.cuda.Event().record(), args.rounds)
    out["sync_idle_gpu"] = timed(torch.cuda.synchronize, args.rounds)
    db = tr.upload(hb)
    out["preprocess_synced"] = timed(lambda: (tr.preprocess(db), torch.cuda.synchronize()), args.rounds)
    actions = torch.randn(1, cfg.action_horizon, cfg.action_dim, device=dev)
    pinned = torch.empty(actions.shape, dtype=actions.dtype, pin_memory=True)
    A = w.robot_action_dim
    out["to_host_slice_then_copy"] = timed(lambda: actions[..., :A].cpu().numpy().astype(np.float32), args.rounds)
    out["to_host_copy_then_slice"] = timed(lambda: actions.cpu().numpy()[..., :A].astype(np.float32), args.rounds)

    def pinned_event():
        pinned.copy_(actions, non_blocking=True)
        e = torch.cuda.Event()
        e.record()
        e.synchronize()
        return pinned.numpy()[..., :A].astype(np.float32)

    out["to_host_pinned_event"] = timed(pinned_event, args.rounds)
    # The upload again, each time right after ~13 ms of something else (untimed): what makes it take 0.6-0.7 ms in a
    # policy call's sequence (served_path_probe.py) against ~0.25 ms back to back? The GPU busy (a sleep kernel the
    # host waits for, as for a model call), the host asleep, or the host busy in Python.
    cycles = sleep_cycles_per_ms()
    befores = {"after_gpu_busy_13ms": lambda: (torch.cuda._sleep(int(13 * cycles)), torch.cuda.synchronize()),
               "after_host_sleep_13ms": lambda: time.sleep(0.013),
               "after_host_busy_13ms": lambda: busy_wait(0.013)}
    # Candidates for the policy to take it off the upload: a 4-byte transfer each way issued right after the pause (not
    # waited for), as the policy could issue one while the host validates and tokenizes the request
    tiny_host, tiny_dev = torch.zeros(1, pin_memory=True), torch.zeros(1, device=dev)
    befores["after_gpu_busy_13ms_then_tiny_h2d"] = lambda: (befores["after_gpu_busy_13ms"](),
                                                             tiny_dev.copy_(tiny_host, non_blocking=True))
    befores["after_gpu_busy_13ms_then_tiny_d2h"] = lambda: (befores["after_gpu_busy_13ms"](),
                                                             tiny_host.copy_(tiny_dev, non_blocking=True))
    for name, before in befores.items():
        samples = []
        for _ in range(args.rounds // 2):
            before()
            samples.append(one_call_ms(upload_synced))
        out[f"upload_whole_synced_{name}"] = statistics.median(samples)
    # Which part of the upload pays after the pause: the host's own work (a fixed Python loop, the staging fill, which
    # touch no device), the transfer of the staging buffer, or the first CUDA call (a sync on an idle GPU)
    pieces = {"python_loop": lambda: sum(range(3000)), "fill_staging_host": lambda: flat[: images.size].__setitem__(
        ..., images.reshape(-1)), "to_device_synced": lambda: (host.to(dev, non_blocking=True), torch.cuda.synchronize()),
        "sync_idle_gpu": torch.cuda.synchronize}
    for piece, fn in pieces.items():
        out[f"{piece}_back_to_back"] = timed(fn, args.rounds // 2)
        for name in ("after_gpu_busy_13ms", "after_host_sleep_13ms"):
            samples = []
            for _ in range(args.rounds // 2):
                befores[name]()
                samples.append(one_call_ms(fn))
            out[f"{piece}_{name}"] = statistics.median(samples)
    # The staging buffer in 2 MB pages (transparent huge pages, registered with CUDA) against torch's pinned one,
    # alternating round by round: if the after-pause cost is the host's and the DMA's page-table walks over the
    # buffer's 4 KB pages, fewer, larger pages cut it
    hp = hugepage_pinned(tr._host_buffer.numel())
    if hp["tensor"] is not None:
        buffers = {"torch_pinned": tr._host_buffer, "hugepage_pinned": hp["tensor"]}
        for name in ("back_to_back", "after_gpu_busy_13ms", "after_host_sleep_13ms"):
            samples = {k: [] for k in buffers}
            for _ in range(args.rounds // 2):
                for kind, buf in buffers.items():
                    tr._host_buffer = buf
                    if name != "back_to_back":
                        befores[name]()
                    samples[kind].append(one_call_ms(upload_synced))
            for kind, v in samples.items():
                out[f"upload_whole_synced_{kind}_{name}"] = statistics.median(v)
        tr._host_buffer = buffers["torch_pinned"]
    result = {"schema": SCHEMA, "command": "upload-probe", "workload": {"id": w.id, "overrides": {}},
              "variant": {"levers": [], "label": "policy transfers", "dtype": "-"}, "env": environment_record("cuda"),
              "rounds": args.rounds, "staging_bytes": nbytes, "median_ms": out,
              "hugepage_staging": hp["record"]}
    print(json.dumps(out, indent=1), json.dumps(hp["record"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
