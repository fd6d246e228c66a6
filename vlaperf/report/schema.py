"""The result file every vlaperf command writes (documented in docs/results.md).

    {"schema": "vlaperf.result/1", "command": "bench", "workload": {"id", "overrides"},
     "variant": {"levers": [...], "label", "dtype"}, "mode": "model" | "policy",
     "timers": {"cuda_event_ms": summary | null, "wall_ms": summary},
     "first_call_s", "warmup_s", "warmup", "iters", "peak_memory_bytes",
     "equivalence": {...} | null, "roofline": {...} | null, "env": {...}, ...command extras}
A summary has count, mean, median, p90, p95, p99, min, max, std (milliseconds).
"""

from __future__ import annotations

import json
from pathlib import Path

from vlaperf.timing import SUMMARY_KEYS

SCHEMA = "vlaperf.result/1"
REQUIRED = ("schema", "command", "workload", "env")
ENV_KEYS = ("gpu", "driver", "cuda", "torch", "triton", "python", "vlaperf", "git_commit", "env_vars", "c_compiler")


class SchemaError(ValueError):
    pass


def validate_summary(summary, where: str) -> list[str]:
    if not isinstance(summary, dict):
        return [f"{where}: expected a summary object"]
    return [f"{where}: missing {k!r}" for k in SUMMARY_KEYS if k not in summary]


def validate_result(result: dict) -> dict:
    """Raise SchemaError naming every problem; return the result unchanged if valid."""
    errors = [f"missing key {k!r}" for k in REQUIRED if k not in result]
    if result.get("schema") != SCHEMA:
        errors.append(f"schema must be {SCHEMA!r}, got {result.get('schema')!r}")
    wl = result.get("workload")
    if not isinstance(wl, dict) or "id" not in wl or "overrides" not in wl:
        errors.append("workload: expected {'id': ..., 'overrides': {...}}")
    env = result.get("env", {})
    errors += [f"env: missing {k!r}" for k in ENV_KEYS if k not in env]
    timers = result.get("timers")
    if timers is not None:
        errors += validate_summary(timers.get("wall_ms"), "timers.wall_ms")
        if timers.get("cuda_event_ms") is not None:
            errors += validate_summary(timers["cuda_event_ms"], "timers.cuda_event_ms")
    if errors:
        raise SchemaError("invalid vlaperf result: " + "; ".join(errors))
    return result


def write_result(result: dict, path: str | Path) -> Path:
    validate_result(result)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return p


def read_result(path: str | Path) -> dict:
    return validate_result(json.loads(Path(path).read_text()))
