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
import math
from pathlib import Path

SCHEMA = "vlaperf.result/1"
# Keys of a timing summary, in the order they are reported (vlaperf.timing writes them). Kept here, torch-free,
# so that reading and rendering result files (`vlaperf report`, its worker processes) never imports torch.
SUMMARY_KEYS = ("count", "mean", "median", "p90", "p95", "p99", "min", "max", "std")
REQUIRED = ("schema", "command", "workload", "env")
ENV_KEYS = ("gpu", "driver", "cuda", "torch", "triton", "python", "vlaperf", "git_commit", "env_vars", "c_compiler")
# env fields that the readers (report, diff, performance.md) print or slice as text, and those they read keys of:
# a damaged value fails here, naming it, not as an AttributeError in `diff` (whose exit 1 means a slowdown). (The
# timestamp is read as str(...) wherever it is read: a number there orders no files, and breaks nothing.)
ENV_TEXT = ("gpu", "driver", "cuda", "torch", "triton", "python", "vlaperf", "git_commit", "c_compiler", "hostname",
            "device")
ENV_OBJECTS = ("env_vars", "gpu_state")


class SchemaError(ValueError):
    pass


def json_kind(x) -> str:
    """A JSON value's kind as the messages name it: object, array, string, number, boolean or null."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(x), type(x).__name__)


def validate_summary(summary, where: str) -> list[str]:
    if not isinstance(summary, dict):
        return [f"{where}: expected a summary object, got {json_kind(summary)}"]
    errors = [f"{where}: missing {k!r}" for k in SUMMARY_KEYS if k not in summary]
    # the report does arithmetic on every field (median / floor, histograms), so a string here
    # would fail there, far from the file that carries it
    errors += [f"{where}.{k}: expected a number, got {json_kind(summary[k])}" for k in SUMMARY_KEYS
               if k in summary and json_kind(summary[k]) != "number"]
    # times and counts: a NaN, an infinity or a negative value is a damaged file (it rendered as "nanx")
    errors += [f"{where}.{k}: expected a finite number >= 0, got {summary[k]!r}" for k in SUMMARY_KEYS
               if k in summary and json_kind(summary[k]) == "number" and not 0 <= summary[k] < math.inf]
    return errors


def validate_result(result) -> dict:
    """Raise SchemaError naming every problem; return the result unchanged if valid.

    Checks the keys every command writes and their types (a damaged file must fail here, with
    a SchemaError that names the field, not later with an AttributeError in whatever reads it);
    the per-command extras are the readers' to check (vlaperf.report.render does)."""
    if not isinstance(result, dict):
        raise SchemaError(f"invalid vlaperf result: expected a JSON object, got {json_kind(result)}")
    errors = [f"missing key {k!r}" for k in REQUIRED if k not in result]
    if result.get("schema") != SCHEMA:
        errors.append(f"schema must be {SCHEMA!r}, got {result.get('schema')!r}")
    if "command" in result and not isinstance(result["command"], str):
        errors.append(f"command: expected a string, got {json_kind(result['command'])}")
    wl = result.get("workload")
    if not isinstance(wl, dict) or "id" not in wl or "overrides" not in wl:
        errors.append("workload: expected {'id': ..., 'overrides': {...}}")
    elif not isinstance(wl["overrides"], dict):
        errors.append(f"workload.overrides: expected an object, got {json_kind(wl['overrides'])}")
    # doctor without a workload writes "variant": null and "mode": null
    if result.get("variant") is not None and not isinstance(result["variant"], dict):
        errors.append(f"variant: expected an object or null, got {json_kind(result['variant'])}")
    if result.get("mode") is not None and not isinstance(result["mode"], str):
        errors.append(f"mode: expected a string or null, got {json_kind(result['mode'])}")
    env = result.get("env", {})
    if isinstance(env, dict):
        errors += [f"env: missing {k!r}" for k in ENV_KEYS if k not in env]
        errors += [f"env.{k}: expected a string or null, got {json_kind(env[k])}" for k in ENV_TEXT
                   if env.get(k) is not None and not isinstance(env[k], str)]
        errors += [f"env.{k}: expected an object or null, got {json_kind(env[k])}" for k in ENV_OBJECTS
                   if env.get(k) is not None and not isinstance(env[k], dict)]
    else:
        errors.append(f"env: expected an object, got {json_kind(env)}")
    first = result.get("first_call_s")
    if first is not None and (json_kind(first) != "number" or not 0 <= first < math.inf):
        errors.append(f"first_call_s: expected a finite number of seconds >= 0 or null, got {first!r}")
    timers = result.get("timers")
    if timers is not None:
        if isinstance(timers, dict):
            errors += validate_summary(timers.get("wall_ms"), "timers.wall_ms")
            for name, summary in timers.items():  # cuda_event_ms is null on the CPU
                if name != "wall_ms" and summary is not None:
                    errors += validate_summary(summary, f"timers.{name}")
        else:
            errors.append(f"timers: expected an object or null, got {json_kind(timers)}")
    if errors:
        raise SchemaError("invalid vlaperf result: " + "; ".join(errors))
    return result


def unwritable(path: str | Path) -> str | None:
    """Why a file cannot be written at `path` (None: it can), asked before a run rather than after it: an
    existing folder, under a file, or in a folder this process cannot write to. Folders missing on the way
    are made at the write, in the nearest one that exists."""
    import tempfile

    path = Path(path).absolute()
    if path.is_dir():
        return f"{str(path)!r} is a folder"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{str(folder)!r} is a file, not a folder"
    try:  # a real write: os.access says yes to root on read-only and pseudo file systems (/proc)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot write in {str(folder)!r} ({e.strerror or e})"
    return None


def strict_json(x):
    """`x` with every NaN and infinity as null: Python's json writes them as bare NaN / Infinity, which is not
    JSON (JavaScript's JSON.parse and most other readers refuse the file; jq turns them into null silently).
    Where a figure is non-finite the result says so in its own words (check's `finite`, `reference_finite`)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    return x


def write_result(result: dict, path: str | Path) -> Path:
    validate_result(result)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(strict_json(result), indent=2, default=str, allow_nan=False) + "\n")
    return p


def read_result(path: str | Path) -> dict:
    """The validated result in `path`; SchemaError for a file that is not UTF-8 text or not a valid result,
    json.JSONDecodeError for text that is not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SchemaError(f"not a UTF-8 text file (byte {e.start}: {e.reason}), so not a vlaperf result file") from None
    data = json.loads(text)
    foreign = not_a_result(data)
    if foreign:
        raise SchemaError(foreign)
    return validate_result(data)


def not_a_result(data) -> str | None:
    """Why `data` (parsed JSON) is no vlaperf result at all, rather than a damaged one: an object without the
    "schema" key (a trace, a config, `vlaperf workloads --json`), said in one line instead of one per missing key."""
    if isinstance(data, dict) and "schema" not in data:
        return f'not a vlaperf result file (no "schema" key; a result file has "schema": "{SCHEMA}")'
    return None


class MissingField(KeyError):
    """A key a reader indexed that the result lacks, named by its dotted path from the result's top
    ("rollout.policy_call_ms.median"), where a plain KeyError names only its last part ('median')."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"missing field {self.path!r}"


class FieldDict(dict):
    """A result's object that knows where it sits, so that indexing a key it lacks raises MissingField
    with the whole path (dict calls __missing__ only for `d[key]`; `.get` and `in` are unchanged)."""

    def __init__(self, items, path: str):
        super().__init__(items)
        self.path = path

    def __missing__(self, key):
        raise MissingField(f"{self.path}.{key}" if self.path else str(key))


def located(x, path: str = ""):
    """`x` (parsed JSON) with every object a FieldDict that knows its path; lists and the rest as they are
    (lists copied). Equal to `x` in every way a reader sees (a dict subclass: isinstance, json, ==) but
    for the message a missing key gives: what `vlaperf report` hands its renderers, so that a damaged or
    hand-edited file is skipped naming the field, not with Python's bare KeyError."""
    if isinstance(x, dict):
        return FieldDict({k: located(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}, path)
    if isinstance(x, list):
        return [located(v, f"{path}[{i}]") for i, v in enumerate(x)]
    return x
