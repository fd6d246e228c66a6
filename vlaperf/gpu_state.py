"""The GPU's state in a result's environment record (`env.gpu_state`): nvidia-smi's fields, parsed and described.

vlaperf.timing reads the state from nvidia-smi when it takes the record; the report, the CLI's summary line and the
doctor describe it. This module imports no torch, so that `vlaperf report` (pure post-processing of result files)
shows the file table's GPU-state column without importing it.
"""

from __future__ import annotations

from typing import Any


# nvidia-smi fields of the GPU's state when the record is taken: the clocks it runs at, its
# power cap and draw, temperature, and why it is holding clocks back (CLOCK_EVENT_REASONS).
# Two runs of the same code on different lent machines have differed by up to 20% at batch 4
# and 8 (docs/perf-notes.md); this is what can tell them apart.
GPU_STATE_FIELDS = {"uuid": "uuid", "pstate": "pstate", "sm_clock_mhz": "clocks.sm",
                    "max_sm_clock_mhz": "clocks.max.sm", "mem_clock_mhz": "clocks.mem", "power_draw_w": "power.draw",
                    "power_limit_w": "enforced.power.limit", "temperature_c": "temperature.gpu",
                    "clock_event_reasons": "clocks_event_reasons.active"}


# nvidia-smi's clock-event (throttle) reason bits
CLOCK_EVENT_REASONS = {0x1: "idle", 0x2: "application clocks setting", 0x4: "software power cap",
                       0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
                       0x40: "hardware thermal slowdown", 0x80: "hardware power brake", 0x100: "display clock setting"}


def clock_event_names(reasons: str | None) -> list[str]:
    """The named reasons in nvidia-smi's hex bitmask ('0x...'), idle left out; [] if none or unreadable."""
    try:
        bits = int(reasons or "0", 16)
    except ValueError:
        return []
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if bits & bit and bit != 0x1]


def describe_gpu_state(st: dict[str, Any] | None) -> str:
    """One line for a `gpu_state` record: 'SM 1800/1980 MHz, 600/700 W, 64 C, held by software
    power cap'; '-' without one (files from before session 7, CPU runs)."""
    if not st:
        return "-"
    num = lambda v, unit: "?" if v is None else f"{v:.0f}{unit}"  # noqa: E731
    held = clock_event_names(st.get("clock_event_reasons"))
    return (f"SM {num(st.get('sm_clock_mhz'), '')}/{num(st.get('max_sm_clock_mhz'), ' MHz')}, "
            f"{num(st.get('power_draw_w'), '')}/{num(st.get('power_limit_w'), ' W')}, "
            f"{num(st.get('temperature_c'), ' C')}"
            + (f", held by {' + '.join(held)}" if held else ""))


def parse_gpu_state(line: str) -> dict[str, Any]:
    """One `nvidia-smi --query-gpu=<GPU_STATE_FIELDS> --format=csv,noheader,nounits` line ->
    {name: value}: numbers as int / float, '[N/A]' and the like as None."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(GPU_STATE_FIELDS):
        raise ValueError(f"nvidia-smi gave {len(values)} values for {len(GPU_STATE_FIELDS)} fields: {line!r}")
    out: dict[str, Any] = {}
    for name, value in zip(GPU_STATE_FIELDS, values):
        if value.startswith("[") or value in ("", "N/A"):
            out[name] = None
        elif name in ("uuid", "pstate", "clock_event_reasons"):
            out[name] = value
        else:
            try:
                out[name] = int(value) if value.isdigit() else float(value)
            except ValueError:
                out[name] = None
    return out
