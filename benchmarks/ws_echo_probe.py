"""How much of a served call's time outside the policy is the host's, not vlaperf's: a bare websockets echo whose
reply comes after a wait in a worker thread, as a policy call's does.

Two processes on one host, asyncio on both ends (as `vlaperf serve` and `vlaperf loadgen`): the client sends an
observation-sized message (msgpack, `--kb` KB) and waits for a small reply; the server hands the request to one
long-lived worker thread that sleeps `--work-ms` (the policy call's stand-in) and sets the reply's future through the event loop's
`call_soon_threadsafe`, as `vlaperf.serve` does. With `--work-ms 0` the calls come back to back (session 59's bare
echo); with a wait like a policy call's, both ends sit idle that long before they wake. Printed and written (--json):
the round trip's median and p90, and the median of each round trip less the server's measured wait (the time
outside the "policy", as `vlaperf loadgen`'s overhead is the round trip less the server's policy time).

    python benchmarks/ws_echo_probe.py --work-ms 0,15 --calls 300 --json echo.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import statistics
import threading
import time

import msgpack
import websockets


def serve(port: int, ready) -> None:
    jobs: queue.Queue = queue.Queue()

    def worker():  # one long-lived thread, as the server's policy thread
        while True:
            loop, future, wait_s = jobs.get()
            t0 = time.perf_counter()
            time.sleep(wait_s)  # (overshoots by tens of us: the reply says how long it was)
            slept_ms = (time.perf_counter() - t0) * 1000.0
            loop.call_soon_threadsafe(future.set_result, {"actions": b"\0" * 1400, "slept_ms": slept_ms})

    threading.Thread(target=worker, daemon=True).start()

    async def main():
        async def handler(ws):
            loop = asyncio.get_running_loop()
            async for message in ws:
                request = msgpack.unpackb(message)
                future = loop.create_future()
                jobs.put((loop, future, request["work_ms"] / 1000.0))
                await ws.send(msgpack.packb(await future))

        async with websockets.serve(handler, "127.0.0.1", port, max_size=None, compression=None):
            ready.set()
            await asyncio.Future()

    asyncio.run(main())


async def client(port: int, work_ms: float, calls: int, warmup: int, kb: int) -> tuple[list[float], list[float]]:
    """(round trips, round trips less the server's measured wait), ms."""
    payload = {"image": b"\1" * (kb * 1024), "work_ms": work_ms}
    times, outside = [], []
    async with websockets.connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
        for i in range(warmup + calls):
            t0 = time.perf_counter()
            await ws.send(msgpack.packb(payload))
            reply = msgpack.unpackb(await ws.recv())
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000.0)
                outside.append(times[-1] - reply["slept_ms"])
    return times, outside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-ms", default="0,15", help="comma list of the server's waits before each reply (ms)")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="the waits interleaved, this many rounds")
    ap.add_argument("--kb", type=int, default=300, help="the request's size (LIBERO's two 224x224 images: ~300 KB)")
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ready = mp.Event()
    server = mp.Process(target=serve, args=(args.port, ready), daemon=True)
    server.start()
    ready.wait(30)
    rows = []
    try:
        for r in range(args.rounds):
            for work_ms in (float(w) for w in args.work_ms.split(",")):
                t, outside = asyncio.run(client(args.port, work_ms, args.calls, args.warmup, args.kb))
                row = {"round": r, "work_ms": work_ms, "median_ms": statistics.median(t),
                       "p90_ms": statistics.quantiles(t, n=10)[-1], "outside_ms": statistics.median(outside)}
                rows.append(row)
                print(f"round {r} work {work_ms:5.1f} ms: round trip median {row['median_ms']:.3f} ms, p90 "
                      f"{row['p90_ms']:.3f}; outside the wait {row['outside_ms']:.3f} ms", flush=True)
    finally:
        server.terminate()
    if args.json:
        from vlaperf.timing import environment_record

        with open(args.json, "w") as f:
            json.dump({"probe": "ws_echo_probe", "args": vars(args), "rows": rows, "env": environment_record("cpu")},
                      f, indent=1)


if __name__ == "__main__":
    main()
