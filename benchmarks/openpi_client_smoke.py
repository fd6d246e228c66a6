"""openpi's own client against a running `vlaperf serve`, with observations built as openpi's DROID example
builds them (camera frames resized with openpi_client's resize_with_pad, the joints and the gripper as float64
arrays): the metadata, the actions' shape and the round trip. Exits 1 if the actions are not (horizon, 8) finite
float32.

    vlaperf serve --workload droid-pi05 --conventions openpi:pi05_droid --port 8765 &
    python benchmarks/openpi_client_smoke.py --port 8765 --requests 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from openpi_client import image_tools
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def droid_observation(rng: np.random.Generator) -> dict:
    frame = lambda: rng.integers(0, 256, (180, 320, 3), dtype=np.uint8)  # noqa: E731  (a ZED frame, downscaled)
    return {
        "observation/exterior_image_1_left": image_tools.resize_with_pad(frame(), 224, 224),
        "observation/wrist_image_left": image_tools.resize_with_pad(frame(), 224, 224),
        "observation/joint_position": rng.uniform(-1, 1, 7),
        "observation/gripper_position": rng.uniform(0, 1, 1),
        "prompt": "put the marker in the cup",
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--requests", type=int, default=50)
    args = p.parse_args()
    if args.requests < 1:
        p.error("--requests: expected at least 1")
    client = WebsocketClientPolicy(args.host, args.port)
    meta = client.get_server_metadata()
    print({k: meta.get(k) for k in ("workload", "conventions", "action_horizon", "robot_action_dim", "levers")})
    horizon = meta["action_horizon"]
    rng = np.random.default_rng(0)
    times, bad = [], 0
    for _ in range(args.requests):
        obs = droid_observation(rng)
        t0 = time.perf_counter()
        actions = client.infer(obs)["actions"]
        times.append((time.perf_counter() - t0) * 1e3)
        ok = actions.shape == (horizon, 8) and actions.dtype == np.float32 and np.isfinite(actions).all()
        bad += not ok
    print(f"{args.requests} requests, actions {actions.shape} {actions.dtype}, {bad} malformed; round trip median "
          f"{statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f} (the first included)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
