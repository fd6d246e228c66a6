"""openpi's normalization statistics: the state normalized before the model sees it, the actions
unnormalized after it (a checkpoint's `assets/<asset_id>/norm_stats.json`).

A trained pi0-family model works in normalized units: without its statistics the served actions are
in that space, not the robot's. openpi's file holds, per key ("state", "actions"), the mean, std and
the 1st / 99th percentiles (q01, q99) of the training data, of the robot's own dimensions:

    {"norm_stats": {"state": {"mean": [...], "std": [...], "q01": [...], "q99": [...]}, "actions": {...}}}

pi0 uses the z-score, (x - mean) / (std + eps); pi0.5 (and FAST) the quantiles, mapped to [-1, 1]:
(x - q01) / (q99 - q01 + eps) * 2 - 1, which is also the range pi0.5 discretises its state from.
Statistics longer than the array are cut to it; for the actions, dimensions beyond the statistics
pass through unchanged, as openpi's Unnormalize does. eps is openpi's 1e-6.

LeRobot keeps the same statistics in its processor files: the preprocessor's normalizer step saves a
safetensors file of flat keys "<feature>.<stat>" ("observation.state.mean", "action.q99", ...). Its
modes are pi0's MEAN_STD and pi0.5's QUANTILES as above, with its own arithmetic, which `convention`
"lerobot" follows: eps 1e-8 added to std when normalizing only; the quantile span q99 - q01 used as it
is (eps only where it is 0), in both directions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EPS = 1e-6
LEROBOT_EPS = 1e-8
KEYS = ("state", "actions")
LEROBOT_KEYS = {"state": "observation.state", "actions": "action"}  # LeRobot's feature names


class NormStatsError(ValueError):
    """A statistics file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class ArrayStats:
    """One key's statistics, float64, one value per dimension."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return self.mean.shape[0]


@dataclass(frozen=True)
class NormStats:
    state: ArrayStats | None
    actions: ArrayStats | None
    quantile: bool  # q01 / q99 to [-1, 1] (pi0.5); else the z-score (pi0)
    source: str = ""  # where they came from, for the server's metadata
    convention: str = "openpi"  # whose arithmetic: "openpi" or "lerobot" (module docstring)

    @classmethod
    def load(cls, path: str | Path, quantile: bool) -> "NormStats":
        """openpi's norm_stats.json, or LeRobot's normalizer safetensors file (a file, or a folder holding
        norm_stats.json or one `*normalizer_processor.safetensors`). `quantile`: the model's normalization,
        True for pi0.5 as openpi and LeRobot configure it, False for pi0."""
        path = Path(path)
        if path.is_dir():
            found = sorted(path.glob("*normalizer_processor.safetensors"))
            if not (path / "norm_stats.json").exists() and len(found) == 1:
                path = found[0]
            else:
                path = path / "norm_stats.json"
        if path.suffix == ".safetensors":
            return cls._load_lerobot(path, quantile)
        try:
            doc = json.loads(path.read_text())
        except OSError as e:
            raise NormStatsError(f"{path}: cannot read the normalization statistics ({e.strerror or e})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise NormStatsError(f"{path}: not JSON ({e})") from None
        table = doc.get("norm_stats") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise NormStatsError(f"{path}: expected openpi's layout, an object with 'norm_stats': "
                                 "{'state': {...}, 'actions': {...}}")
        stats = {key: _array_stats(path, key, table[key], quantile) if key in table else None for key in KEYS}
        if stats["state"] is None and stats["actions"] is None:
            raise NormStatsError(f"{path}: 'norm_stats' has neither 'state' nor 'actions' (keys: {sorted(table)})")
        return cls(stats["state"], stats["actions"], quantile, str(path))

    @classmethod
    def _load_lerobot(cls, path: Path, quantile: bool) -> "NormStats":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            flat = load_file(str(path))
        except (OSError, SafetensorError) as e:
            raise NormStatsError(f"{path}: not a readable safetensors file ({e})") from None
        table: dict[str, dict] = {}
        for key, name in LEROBOT_KEYS.items():
            entry = {k.removeprefix(name + "."): v.tolist() for k, v in flat.items() if k.startswith(name + ".")}
            if entry:
                table[key] = entry
        if not table:
            raise NormStatsError(f"{path}: no 'observation.state.*' or 'action.*' statistics (LeRobot's normalizer "
                                 f"keys); found {sorted(flat)[:8]}")
        stats = {key: _array_stats(path, key, table[key], quantile) if key in table else None for key in KEYS}
        return cls(stats["state"], stats["actions"], quantile, str(path), "lerobot")

    def check_dims(self, state_dim: int) -> None:
        """The state's statistics must cover the robot's state (openpi cuts longer ones to it)."""
        if self.state is not None and self.state.dim < state_dim:
            raise NormStatsError(f"{self.source}: 'state' has {self.state.dim} dimensions, the workload's state "
                                 f"{state_dim}")

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """(..., D) robot state -> the model's units, float32."""
        if self.state is None:
            return state
        s, d = self.state, state.shape[-1]
        x = state.astype(np.float64)
        if self.quantile:
            out = (x - s.q01[:d]) / self._span(s, d) * 2.0 - 1.0
        else:
            out = (x - s.mean[:d]) / (s.std[:d] + (LEROBOT_EPS if self.convention == "lerobot" else EPS))
        return out.astype(np.float32)

    def _span(self, s: ArrayStats, d: int) -> np.ndarray:
        span = s.q99[:d] - s.q01[:d]
        return np.where(span == 0, LEROBOT_EPS, span) if self.convention == "lerobot" else span + EPS

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """(..., A) model actions -> the robot's units, float32; dimensions past the statistics unchanged."""
        if self.actions is None:
            return actions
        s, d = self.actions, min(self.actions.dim, actions.shape[-1])
        out = actions.astype(np.float64)
        head = out[..., :d]
        if self.quantile:
            out[..., :d] = (head + 1.0) / 2.0 * self._span(s, d) + s.q01[:d]
        else:
            out[..., :d] = head * (s.std[:d] + (0.0 if self.convention == "lerobot" else EPS)) + s.mean[:d]
        return out.astype(np.float32)

    def describe(self) -> str:
        kind = "quantile (q01/q99 to [-1, 1])" if self.quantile else "z-score (mean/std)"
        keys = ", ".join(k for k in KEYS if getattr(self, k) is not None)
        return f"{kind} of {keys} from {self.source} ({self.convention}'s arithmetic)"


def _array_stats(path: Path, key: str, entry, quantile: bool) -> ArrayStats:
    if not isinstance(entry, dict):
        raise NormStatsError(f"{path}: norm_stats.{key}: expected an object with mean, std (and q01, q99)")
    needed = ("mean", "std", "q01", "q99") if quantile else ("mean", "std")
    for name in needed:
        if name not in entry:
            why = " (quantile normalization, pi0.5's)" if name in ("q01", "q99") else ""
            raise NormStatsError(f"{path}: norm_stats.{key}.{name}: missing{why}")
    arrays = {}
    for name in ("mean", "std", "q01", "q99"):
        if name not in entry:
            continue
        try:
            a = np.asarray(entry[name], dtype=np.float64)
        except (TypeError, ValueError):
            raise NormStatsError(f"{path}: norm_stats.{key}.{name}: expected a list of numbers") from None
        if a.ndim != 1 or a.shape[0] == 0 or not np.isfinite(a).all():
            raise NormStatsError(f"{path}: norm_stats.{key}.{name}: expected a non-empty list of finite numbers, "
                                 f"got shape {a.shape}")
        arrays[name] = a
    dims = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(dims.values())) != 1:
        raise NormStatsError(f"{path}: norm_stats.{key}: its lists differ in length ({dims})")
    if (arrays["std"] < 0).any():
        raise NormStatsError(f"{path}: norm_stats.{key}.std: negative values")
    return ArrayStats(arrays["mean"], arrays["std"], arrays.get("q01"), arrays.get("q99"))
