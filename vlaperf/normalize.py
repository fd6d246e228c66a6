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
"lerobot" follows: eps (1e-8 unless the checkpoint says otherwise) added to std when normalizing only;
the quantile span q99 - q01 used as it is (eps only where it is 0), in both directions. A checkpoint
folder's `policy_preprocessor.json` names the normalizer's file, its eps and its modes per feature type
(`norm_map`), which then replace the model's defaults, and whether the checkpoint was trained on actions
relative to the state (its `relative_actions_processor`: `RelativeActions`, which `Policy` undoes after
unnormalizing, as LeRobot's postprocessor does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

EPS = 1e-6
LEROBOT_EPS = 1e-8
KEYS = ("state", "actions")
LEROBOT_KEYS = {"state": "observation.state", "actions": "action"}  # LeRobot's feature names
LEROBOT_TYPES = {"state": "STATE", "actions": "ACTION"}  # their feature types in a norm_map
# The modes, by LeRobot's names: what each key's statistics do (IDENTITY: nothing)
MODES = ("MEAN_STD", "QUANTILES", "IDENTITY")


# LeRobot's pipeline step that holds the statistics (policy_preprocessor.json's "steps"), and where they are read
NORMALIZER_STEP = "normalizer_processor"


def statistics_file_name(step: dict) -> str | None:
    """The file a normalizer step's statistics are read from, beside the pipeline's JSON: its state_file's name
    (None where it names none). The Hub fetches the same file (vlaperf.hub)."""
    state_file = step.get("state_file")
    return Path(state_file).name if isinstance(state_file, str) else None


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
class RelativeActions:
    """LeRobot's relative actions (`use_relative_actions`): the model was trained on action - state on the
    dimensions of `mask`, so the raw state is added back after unnormalizing. A dimension is kept absolute
    where its name (`action_names`) contains one of `exclude_joints`, case-insensitively (by default
    "gripper"); without names every dimension is relative, as in LeRobot."""

    exclude_joints: tuple[str, ...] = ()
    action_names: tuple[str, ...] | None = None

    def mask(self, action_dim: int) -> tuple[bool, ...]:
        excluded = [t.lower() for t in self.exclude_joints if t]
        if not excluded or self.action_names is None:
            return (True,) * action_dim
        mask = [not any(t in name.lower() for t in excluded) for name in self.action_names[:action_dim]]
        return tuple(mask + [True] * (action_dim - len(mask)))


@dataclass(frozen=True)
class NormStats:
    state: ArrayStats | None
    actions: ArrayStats | None
    quantile: bool  # the model's default: q01 / q99 to [-1, 1] (pi0.5); else the z-score (pi0)
    source: str = ""  # where they came from, for the server's metadata
    convention: str = "openpi"  # whose arithmetic: "openpi" or "lerobot" (module docstring)
    # Per key, where a LeRobot checkpoint's norm_map says (MODES); None: the model's default above
    state_mode: str | None = None
    actions_mode: str | None = None
    lerobot_eps: float = LEROBOT_EPS
    relative_actions: RelativeActions | None = None  # a LeRobot pipeline's relative actions (None: absolute)

    def mode(self, key: str) -> str:
        given = self.state_mode if key == "state" else self.actions_mode
        return given or ("QUANTILES" if self.quantile else "MEAN_STD")

    @classmethod
    def load(cls, path: str | Path, quantile: bool) -> "NormStats":
        """openpi's norm_stats.json, or LeRobot's normalizer safetensors file: a file, or a folder holding
        norm_stats.json, LeRobot's `policy_preprocessor.json` (which names the normalizer's file, modes and
        eps; also given as the file), or one `*_normalizer_processor.safetensors`. `quantile`: the model's
        normalization, True for pi0.5 as openpi and LeRobot configure it, False for pi0."""
        if not str(path).strip():  # Path("") is the current folder, whose statistics would be read silently
            raise ValueError("norm stats path: empty (an unset variable?); expected a norm_stats.json file, LeRobot's "
                             "normalizer file, or a folder holding one")
        path = Path(path)
        if path.is_dir():
            if (path / "norm_stats.json").exists():
                path = path / "norm_stats.json"
            elif (path / "policy_preprocessor.json").exists():
                return cls._load_lerobot_pipeline(path / "policy_preprocessor.json", quantile)
            else:
                # "*_normalizer_processor" alone: the postprocessor's "*_unnormalizer_processor" file holds the
                # same statistics under another name
                found = sorted(p for p in path.glob("*_normalizer_processor.safetensors")
                               if not p.name.endswith("_unnormalizer_processor.safetensors"))
                path = found[0] if len(found) == 1 else path / "norm_stats.json"
        if path.suffix == ".safetensors":
            return cls._load_lerobot(path, quantile)
        doc = _read_json(path, "the normalization statistics")
        if isinstance(doc, dict) and "steps" in doc and "norm_stats" not in doc:
            # LeRobot's policy_preprocessor.json given as the file (it names the statistics' file): read as its folder
            return cls._load_lerobot_pipeline(path, quantile)
        table = doc.get("norm_stats") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise NormStatsError(f"{path}: expected openpi's layout, an object with 'norm_stats': "
                                 "{'state': {...}, 'actions': {...}}")
        stats = {key: _array_stats(path, key, table[key], quantile) if key in table else None for key in KEYS}
        if stats["state"] is None and stats["actions"] is None:
            raise NormStatsError(f"{path}: 'norm_stats' has neither 'state' nor 'actions' (keys: {sorted(table)})")
        return cls(stats["state"], stats["actions"], quantile, str(path))

    @classmethod
    def _load_lerobot_pipeline(cls, doc_path: Path, quantile: bool) -> "NormStats":
        """A LeRobot checkpoint folder: its preprocessor's normalizer step (the statistics' file, eps, the
        mode of each feature type) and its relative-actions step, where enabled."""
        doc = _read_json(doc_path, "LeRobot's pipeline")
        steps = doc.get("steps") if isinstance(doc, dict) else None
        if not isinstance(steps, list) or not all(isinstance(st, dict) for st in steps):
            raise NormStatsError(f"{doc_path}: expected LeRobot's pipeline layout, an object with a 'steps' list")
        relative = _relative_actions(doc_path, steps)
        norm = [st for st in steps if st.get("registry_name") == NORMALIZER_STEP]
        if len(norm) != 1:
            raise NormStatsError(f"{doc_path}: expected one 'normalizer_processor' step with a 'state_file', found "
                                 f"{len(norm)}")
        if not isinstance(norm[0].get("state_file"), str):
            # a normalizer with no statistics (as a base model's pipeline may have): nothing to normalize with
            raise NormStatsError(f"{doc_path}: its 'normalizer_processor' step has no 'state_file': this folder "
                                 "holds no statistics (a base model's?); give --norm-stats the statistics of the data "
                                 "the policy was fine-tuned on")
        config = norm[0].get("config", {})
        norm_map = config.get("norm_map", {}) if isinstance(config, dict) else None
        if not isinstance(norm_map, dict):
            raise NormStatsError(f"{doc_path}: the normalizer step's config.norm_map: expected an object of feature "
                                 f"type -> mode, got {norm_map!r}")
        modes = {}
        for key, ftype in LEROBOT_TYPES.items():
            # LeRobot leaves a feature type that its map does not name as it is: IDENTITY
            mode = norm_map.get(ftype) or "IDENTITY"
            if mode not in MODES:
                raise NormStatsError(f"{doc_path}: norm_map.{ftype} is {mode!r}; vlaperf applies {', '.join(MODES)}")
            modes[key] = mode
        eps = config.get("eps", LEROBOT_EPS)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise NormStatsError(f"{doc_path}: eps: expected a number in [0, 1), got {eps!r}")
        stats_file = doc_path.parent / statistics_file_name(norm[0])
        loaded = cls._load_lerobot(stats_file, quantile, modes)
        return replace(loaded, state_mode=modes["state"], actions_mode=modes["actions"], lerobot_eps=float(eps),
                       source=f"{stats_file} ({doc_path.name})", relative_actions=relative)

    @classmethod
    def _load_lerobot(cls, path: Path, quantile: bool, modes: dict | None = None) -> "NormStats":
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
        modes = modes or {}
        stats = {}
        for key in KEYS:
            mode = modes.get(key) or ("QUANTILES" if quantile else "MEAN_STD")
            stats[key] = (_array_stats(path, key, table[key], mode == "QUANTILES", LEROBOT_KEYS[key])
                          if key in table and mode != "IDENTITY" else None)
            if key not in table and mode != "IDENTITY" and modes.get(key):
                raise NormStatsError(f"{path}: no '{LEROBOT_KEYS[key]}.*' statistics, which its {mode} needs")
        return cls(stats["state"], stats["actions"], quantile, str(path), "lerobot")

    def check_dims(self, state_dim: int) -> None:
        """The state's statistics must cover the robot's state (openpi cuts longer ones to it)."""
        if self.state is not None and self.state.dim < state_dim:
            name = LEROBOT_KEYS["state"] if self.convention == "lerobot" else "state"  # the file's own name for it
            raise NormStatsError(f"{self.source}: '{name}' has {self.state.dim} dimensions, the workload's state "
                                 f"{state_dim}")

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """(..., D) robot state -> the model's units, float32."""
        if self.state is None:
            return state
        return self.normalize_state64(state).astype(np.float32)

    def normalize_state64(self, state: np.ndarray) -> np.ndarray:
        """As normalize_state, in float64 (openpi discretises pi0.5's prompt state from these values)."""
        x = np.asarray(state, dtype=np.float64)
        if self.state is None:
            return x
        s, d = self.state, state.shape[-1]
        if self.mode("state") == "QUANTILES":
            return (x - s.q01[:d]) / self._span(s, d) * 2.0 - 1.0
        return (x - s.mean[:d]) / (s.std[:d] + (self.lerobot_eps if self.convention == "lerobot" else EPS))

    def _span(self, s: ArrayStats, d: int) -> np.ndarray:
        span = s.q99[:d] - s.q01[:d]
        return np.where(span == 0, self.lerobot_eps, span) if self.convention == "lerobot" else span + EPS

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """(..., A) model actions -> the robot's units, float32; dimensions past the statistics unchanged."""
        if self.actions is None:
            return actions
        return self.unnormalize_actions64(actions).astype(np.float32)

    def unnormalize_actions64(self, actions: np.ndarray) -> np.ndarray:
        """As unnormalize_actions, in float64."""
        out = np.array(actions, dtype=np.float64)
        if self.actions is None:
            return out
        s, d = self.actions, min(self.actions.dim, out.shape[-1])
        if self.mode("actions") == "QUANTILES":
            out[..., :d] = (out[..., :d] + 1.0) / 2.0 * self._span(s, d) + s.q01[:d]
        else:
            out[..., :d] = out[..., :d] * self._action_scale(s, d) + s.mean[:d]
        return out

    def normalize_actions64(self, actions: np.ndarray) -> np.ndarray:
        """The inverse of unnormalize_actions64: (..., A) actions in the robot's units -> the model's, float64
        (real-time chunking re-expresses a previous chunk's delta actions relative to a new state with it)."""
        out = np.array(actions, dtype=np.float64)
        if self.actions is None:
            return out
        s, d = self.actions, min(self.actions.dim, out.shape[-1])
        if self.mode("actions") == "QUANTILES":
            out[..., :d] = (out[..., :d] - s.q01[:d]) / self._span(s, d) * 2.0 - 1.0
        else:
            # a zero std (a constant action dim in LeRobot's statistics) maps every value to the mean: any
            # normalized value is as good as another there, so 0
            scale = self._action_scale(s, d)
            out[..., :d] = np.divide(out[..., :d] - s.mean[:d], scale, out=np.zeros_like(out[..., :d]),
                                     where=scale != 0)
        return out

    def _action_scale(self, s: ArrayStats, d: int) -> np.ndarray:
        return s.std[:d] + (0.0 if self.convention == "lerobot" else EPS)

    def describe(self) -> str:
        names = {"QUANTILES": "quantile (q01/q99 to [-1, 1])", "MEAN_STD": "z-score (mean/std)"}
        keys = [k for k in KEYS if getattr(self, k) is not None]
        kinds = {self.mode(k) for k in keys}
        if not kinds:
            what = "no normalization (IDENTITY for state and actions)"
        elif len(kinds) == 1:
            what = f"{names[kinds.pop()]} of {', '.join(keys)}"
        else:
            what = "; ".join(f"{names[self.mode(k)]} of {k}" for k in keys)
        relative = ""
        if self.relative_actions is not None:
            kept = ", ".join(self.relative_actions.exclude_joints) if self.relative_actions.action_names else ""
            relative = "; actions relative to the state, added back" + (f" except {kept}" if kept else "")
        return f"{what} from {self.source} ({self.convention}'s arithmetic){relative}"


def _relative_actions(doc_path: Path, steps: list[dict]) -> RelativeActions | None:
    """The pipeline's enabled `relative_actions_processor` step (None: none, or disabled)."""
    found = [st for st in steps if st.get("registry_name") == "relative_actions_processor"]
    if not found:
        return None
    if len(found) > 1:
        raise NormStatsError(f"{doc_path}: expected at most one 'relative_actions_processor' step, found {len(found)}")
    config = found[0].get("config", {})
    if not isinstance(config, dict) or not isinstance(config.get("enabled", False), bool):
        raise NormStatsError(f"{doc_path}: relative_actions_processor's config: expected an object with a true/false "
                             f"'enabled', got {config!r}")
    if not config.get("enabled", False):
        return None

    def names(field: str, default):
        value = config.get(field, default)
        if value is None and default is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise NormStatsError(f"{doc_path}: relative_actions_processor's config.{field}: expected a list of "
                                 f"strings, got {value!r}")
        return tuple(value)

    return RelativeActions(names("exclude_joints", []), names("action_names", None))


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise NormStatsError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NormStatsError(f"{path}: not JSON ({e})") from None


def _array_stats(path: Path, key: str, entry, quantile: bool, field: str | None = None) -> ArrayStats:
    """`field`: the statistics' name in the file, for the messages ("norm_stats.<key>" in openpi's JSON; LeRobot's
    safetensors keys are "<feature>.<stat>", e.g. "observation.state.q01", which is what its messages name)."""
    field = field or f"norm_stats.{key}"
    if not isinstance(entry, dict):
        raise NormStatsError(f"{path}: {field}: expected an object with mean, std (and q01, q99)")
    needed = ("mean", "std", "q01", "q99") if quantile else ("mean", "std")
    for name in needed:
        if name not in entry:
            why = " (quantile normalization, pi0.5's)" if name in ("q01", "q99") else ""
            raise NormStatsError(f"{path}: {field}.{name}: missing{why}")
    arrays = {}
    for name in ("mean", "std", "q01", "q99"):
        if name not in entry:
            continue
        # numpy turns "0.1" and true into numbers: statistics quoted or boolean (as the pipeline's eps, refused) are
        # not what openpi or LeRobot write, so they are refused rather than read as whatever numpy makes of them
        given = entry[name]
        wrong = [(i, v) for i, v in enumerate(given) if isinstance(v, (str, bool))] if isinstance(given, list) else []
        try:
            a = np.asarray(given, dtype=np.float64)
        except (TypeError, ValueError):
            a = None
        if a is None or wrong:
            if name not in needed:
                continue  # a statistic the mode never reads does not make the file unusable
            got = f", got {wrong[0][1]!r} at index {wrong[0][0]}" if wrong else ""
            raise NormStatsError(f"{path}: {field}.{name}: expected a list of numbers{got}")
        if a.ndim != 1 or a.shape[0] == 0 or not np.isfinite(a).all():
            if name not in needed:
                continue
            bad = "non-finite values" if a.ndim == 1 and a.shape[0] else f"shape {a.shape}"
            raise NormStatsError(f"{path}: {field}.{name}: expected a non-empty list of finite numbers, "
                                 f"got {bad}")
        arrays[name] = a
    dims = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(dims.values())) != 1:
        raise NormStatsError(f"{path}: {field}: its lists differ in length ({dims})")
    if (arrays["std"] < 0).any():
        raise NormStatsError(f"{path}: {field}.std: negative values")
    if "q01" in needed and (arrays["q99"] < arrays["q01"]).any():  # swapped: the quantile map would mirror the dims
        dims = np.flatnonzero(arrays["q99"] < arrays["q01"]).tolist()
        raise NormStatsError(f"{path}: {field}.q99: below q01 in dimension(s) {dims[:8]}"
                             f"{f' and {len(dims) - 8} more' if len(dims) > 8 else ''}")
    return ArrayStats(arrays["mean"], arrays["std"], arrays.get("q01"), arrays.get("q99"))
