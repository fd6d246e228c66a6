"""`vlaperf` command line: a thin layer over the Python API.

    vlaperf bench   --workload libero-pi0 --mode model|policy --levers reference|best|a,b,c
    vlaperf check   --workload tiny --levers all
    vlaperf matrix  --workload libero-pi0 --variants cumulative|grid|"a,b;c,d"
    vlaperf levers
    vlaperf breakdown / scaling / syncs / doctor / report    (docs/profiling.md)
    vlaperf serve / loadgen / rollout                        (docs/serving.md)
    vlaperf compare / convert                                (docs/compare.md)
Exit codes: 0 ok, 1 an equivalence check failed (doctor: an error-severity finding),
2 bad arguments or setup.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import textwrap
from typing import TYPE_CHECKING

from vlaperf import __version__

# torch is imported in the functions that build, run or measure a model, not here: `vlaperf report` and `vlaperf diff`
# read result files only, and their path (this module, vlaperf.profile.commands, the renderer) imports no torch.
if TYPE_CHECKING:  # the annotations' names only
    import torch


class CliError(Exception):
    """Bad input or setup: printed as one line, exit code 2."""


def refuse_repeated_variants(specs: list[str], names, flag: str, device) -> None:
    """CliError if two of `specs` are the same variant (`names(spec)`: its lever names, () for the reference) on
    `device`: timed once, it would be shown as two measurements. A spec `names` cannot parse is left to the
    command's own check."""
    seen: dict[tuple, str] = {}
    for spec in specs:
        try:
            key = tuple(names(spec))
        except Exception:  # noqa: BLE001 - an unknown lever: the command's own error names it
            continue
        if key in seen:
            same = "the same spec twice" if seen[key].strip() == spec.strip() else "the same variant"
            raise CliError(f"{flag}: {seen[key]!r} and {spec!r} are {same} on {device.type} "
                           f"({'+'.join(key) or 'reference'}): give each variant once")
        seen[key] = spec


def exact_number(x: int | float) -> str:
    """`x` as an error message shows it: an int whole, a float in the fewest significant digits (6 at least, as `:g`)
    that read back as the same float, so 2e13 is 2e+13 and 1000.0 is 1000 (not 20000000000000.0 and 1000.0), and
    1/1024 is 0.0009765625. Never rounded to another float: a value refused against a float bound is never shown
    equal to it, or on its other side (as `:g` alone would show 1/1024 - 1e-12 against 1/1024: both 0.000976562)."""
    if not isinstance(x, float):
        return str(x)
    for digits in range(6, 18):  # 17 significant digits read back as the same float, any finite one
        text = f"{x:.{digits}g}"
        if float(text) == x:
            return text
    return str(x)  # nan, which equals nothing


def number_arg(kind: type = int, minimum: float = 1, strict: bool = False, maximum: float | None = None,
               note: str = ""):
    """An argparse type: `kind` (int or float) at least `minimum` (above it if `strict`) and at
    most `maximum`, with an error that says what was expected and what came (the numbers by exact_number); `note`,
    said after the bounds, what they mean (a unit, or why that minimum)."""
    what = "an integer" if kind is int else "a number"
    bound = f"{'>' if strict else '>='} {exact_number(minimum)}" \
        + ("" if maximum is None else f" and <= {exact_number(maximum)}") + (f" ({note})" if note else "")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {exact_number(value)}")
        if kind is float and not math.isfinite(value):  # inf passes the bounds above; no option means it
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return parse


positive_int = number_arg(int, 1)
MAX_PROCESSES = 64  # bench / breakdown --processes: enough for a spread, few enough that a typo is not a day of runs
non_negative_int = number_arg(int, 0)
positive_float = number_arg(float, 0, strict=True)
non_negative_float = number_arg(float, 0)
idle_ms_arg = number_arg(float, 0, strict=True, maximum=10_000)  # bench --idle-ms: a control period's wait, not a nap
seed_int = number_arg(int, 0, maximum=2**63 - 1)  # torch's generators take a signed 64-bit seed
port_int = number_arg(int, 0, maximum=65535)
steps_int = number_arg(int, 1, maximum=1000)  # models.pi0.MAX_NUM_STEPS (and the world-action model's MAX_STEPS)


def rounds_warmup_help(each: str, default: int) -> str:
    """--warmup's help where calls are timed in interleaved rounds (matrix, compare, scaling): the count includes
    the first call, as bench's does, but cannot be 0 there, since a first call in a round would spoil its ratio."""
    return (f"untimed calls of each {each} before the rounds, the first of them (compile, capture) timed on its own; "
            f"at least 1, so that no round holds a first call (default: {default})")


def device_arg(text: str) -> str:
    """--device: cpu, cuda or cuda:N (whether CUDA and that GPU exist is `setup_device`'s question)."""
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")


def workload_arg(text: str) -> str:
    """--workload: a non-empty id (an empty one used to fall back to the default silently); which ids exist is
    `get_workload`'s to say, with the list."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a workload id, got an empty string")
    return text


def output_file(text: str) -> str:
    """A file a command writes (--json, --plot, --trace, -o): refused before the run, not after it (on a GPU,
    after a minute of compile), when it cannot be written: empty, an existing folder, a name ending in a separator
    (a folder), under a file, or in a folder this process cannot write to. A missing parent folder is created when
    the file is written."""
    from pathlib import Path

    from vlaperf.report.schema import unwritable

    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected a file path, got the folder {text!r}")
    # A trailing separator names a folder; Path drops it, so a folder that does not exist yet would be written as
    # a file of that name.
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"expected a file path, got {text!r} (a trailing separator names a folder)")
    why = unwritable(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {why}")
    return text


def png_file(text: str) -> str:
    """An output_file for a PNG plot: the name must say so (the bytes written are PNG whatever the name)."""
    text = output_file(text)
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a .png file name, got {text!r}")
    return text


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------ shared set-up


# The largest --batch: a typo of a few zeros must not take every byte of the machine's memory first
# (libero-pi0's activations grow ~70 MB a sample in bf16; the server caps a request's list at 64)
MAX_BATCH = 1024
batch_int = number_arg(int, 1, maximum=MAX_BATCH)


# The longest action chunk a workload may be given (pi0-family checkpoints are trained with 10 to 50)
MAX_ACTION_HORIZON = 256
horizon_int = number_arg(int, 1, maximum=MAX_ACTION_HORIZON)


def add_action_horizon(p: argparse.ArgumentParser, conventions: bool = False) -> None:
    p.add_argument("--action-horizon", type=horizon_int, default=None,
                   help="actions a chunk: the horizon the checkpoint was trained with, e.g. 50 for a LeRobot or "
                        "openpi ALOHA pi0.5 (default: the workload's" + ("; --conventions may set it)" if conventions
                                                                       else ")"))


def add_conventions(p: argparse.ArgumentParser) -> None:
    from vlaperf.conventions import CONVENTIONS

    p.add_argument("--conventions", choices=list(CONVENTIONS), default=None,
                   help="the checkpoint's training conventions around the model (docs/serving.md): delta actions, "
                        "ALOHA's space, pi0.5's state in the prompt, its action horizon (default: none, the model's "
                        "own units)")


def resolve_shape(args, base):
    """The workload and model config `args` ask for: --batch, --steps, --action-horizon, and the horizon
    --conventions were trained with (which --action-horizon must not contradict); the conventions must fit
    the workload's model and layout. CliError names the option."""
    from vlaperf.conventions import get_conventions
    from vlaperf.models.pi0 import get_config

    conventions = get_conventions(getattr(args, "conventions", None))
    horizon = getattr(args, "action_horizon", None)
    horizon_from = f"--action-horizon {horizon}"
    if conventions.action_horizon is not None:
        if horizon is not None and horizon != conventions.action_horizon:
            raise CliError(f"--action-horizon {horizon}: --conventions {conventions.name} were trained with "
                           f"{conventions.action_horizon} actions a chunk")
        if horizon is None and conventions.action_horizon != base.horizon and not getattr(args, "chunk_noted", False):
            # said, not silent: the chunk a robot gets is not the workload's (serve resolves the shape twice)
            print(f"vlaperf: {conventions.action_horizon} actions a chunk, as --conventions {conventions.name} were "
                  f"trained; workload {base.id} has {base.horizon}", file=sys.stderr)
            args.chunk_noted = True
        horizon, horizon_from = conventions.action_horizon, f"--conventions {conventions.name}"
    config = base.model_config()
    why = conventions.fits(config.pi05, base.layout)
    if why is not None:
        raise CliError(f"--conventions: {why} (workload {base.id})")
    trained = checkpoint_config(args, base, config.pi05)
    if trained is not None:  # LeRobot's config.json says the chunk the checkpoint was trained with
        if horizon is not None and horizon != trained["chunk_size"]:
            raise CliError(f"{horizon_from}: the checkpoint was trained with {trained['chunk_size']} actions a chunk "
                           f"(chunk_size in {trained['path']})")
        if trained["chunk_size"] != base.horizon and horizon is None and not getattr(args, "chunk_noted", False):
            print(f"vlaperf: {trained['chunk_size']} actions a chunk, as the checkpoint was trained ({trained['path']}); "
                  f"workload {base.id} has {base.horizon}", file=sys.stderr)
            args.chunk_noted = True  # once: `serve` resolves the shape twice (its checks first, then the build)
        horizon = trained["chunk_size"]
    if horizon is None and conventions.default_action_horizon is not None:  # LeRobot's, where nothing else says
        horizon, default = conventions.default_action_horizon, conventions.default_action_horizon
        if default != base.horizon and not getattr(args, "chunk_noted", False):
            print(f"vlaperf: {default} actions a chunk, LeRobot's default, as --conventions {conventions.name} take "
                  f"where the checkpoint's config.json does not say its own; workload {base.id} has {base.horizon}",
                  file=sys.stderr)
            args.chunk_noted = True
    if horizon is not None and horizon != base.horizon:
        config = get_config(base.preset, action_horizon=horizon)
    try:
        workload = base.with_overrides(batch=getattr(args, "batch", None), steps=getattr(args, "steps", None),
                                       horizon=horizon if horizon != base.horizon else None)
    except ValueError as e:
        raise CliError(str(e)) from None
    return workload, config


def checkpoint_config(args, base, pi05: bool) -> dict | None:
    """LeRobot's config.json beside --checkpoint (`checkpoints.lerobot_config`), checked against the workload's
    model family; None where there is none. CliError names --checkpoint."""
    path = getattr(args, "checkpoint", None)
    if not path:
        return None
    from vlaperf.checkpoints import CheckpointError, lerobot_config

    try:
        found = lerobot_config(path)
    except CheckpointError as e:
        raise CliError(f"--checkpoint: {e}") from None
    if found is not None and (found["type"] == "pi05") != pi05:
        family = "pi0.5" if found["type"] == "pi05" else "pi0"
        raise CliError(f"--checkpoint: a LeRobot {family} policy ({found['path']}); workload {base.id} is "
                       f"{'pi0.5' if pi05 else 'pi0'}: pick a {family} workload (vlaperf workloads)")
    return found


def wide_console(min_width: int = 120):
    """A rich console for tables: a terminal's own width (rich fits the table to it), piped output (a log,
    CI) at least `min_width` columns, where rich's 80-column default cut the columns to a few letters."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, min_width))


def levers_arg(text: str) -> str:
    """--levers: anything but an empty string, which (an unset shell variable) would run the reference silently,
    and no empty entry in a ';' list of variants (matrix, check, scaling), refused as an empty lever name in a
    comma list is (levers.parse). The text comes back stripped: the commands that compare it with 'none' or
    'reference' (bench, serve, the world-action paths) took ' none' for a lever named 'none'."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected 'reference', a preset or a comma list of levers, got an empty string "
                                         "(an unset shell variable?)")
    return variants_arg(text.strip())


def path_arg(text: str) -> str:
    """A file or folder to read (--checkpoint, --tokenizer, --norm-stats): not an empty string, which an unset shell
    variable gives and which was taken as "none given" (random weights served without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string (an unset shell variable?)")
    return text


def variants_arg(text: str) -> str:
    """A ';' list of variants with an empty entry among named ones ('graph;;best', 'best;') is refused, as an
    empty lever name in a comma list is; a list with no variant at all gets the command's own 'no variant' error."""
    items = [item.strip() for item in text.split(";")]
    if len(items) > 1 and any(items) and not all(items):
        raise argparse.ArgumentTypeError(f"empty variant in {text!r} (two ';' in a row, or one at an end); expected "
                                         "';'-separated variants such as 'graph;best'")
    return text


def add_common(p: argparse.ArgumentParser, levers_default: str = "reference", levers_help: str | None = None,
               workload_help: str | None = None) -> None:
    p.add_argument("--workload", type=workload_arg, default=None,
                   help=workload_help or "workload id, as `vlaperf workloads` lists them (default: libero-pi0 on a GPU, "
                                         "tiny on the CPU)")
    p.add_argument("--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--steps", type=steps_int, default=None, help="denoise steps, 1..1000 (default: the workload's)")
    p.add_argument("--batch", type=batch_int, default=None, help=f"batch size, 1..{MAX_BATCH} (default: the workload's)")
    add_action_horizon(p)
    p.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the random weights and inputs (default: 0)" if p.prog.split()[-1] != "check" else
                   "seed of the random weights; the checked inputs are fixed, --seeds of them (default: 0)")
    p.add_argument("--checkpoint", type=path_arg, default=None, help="openpi or LeRobot model.safetensors, or an openpi JAX checkpoint "
                   "folder (orbax params/; needs tensorstore), or a Hugging Face Hub repo: lerobot/pi0_libero, "
                   "hf://owner/name@revision (vlaperf[hub]) (default: random weights)")
    p.add_argument("--levers", type=levers_arg, default=levers_default,
                   help=levers_help or ("'reference', 'best', 'graph', 'exact' or a comma list (see `vlaperf levers`; "
                                        f"default: {levers_default})"))
    p.add_argument("--json", type=output_file, default=None, help="write the result file here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # world-action workloads only (wam-761, wam-tiny): settings that change the result
    p.add_argument("--sparsity", choices=("none", "drop_middle", "mae_middle"), default=None,
                   help="world-action workloads: frame sparsity (default: " + (
                       "all three" if p.prog.split()[-1] in ("check", "matrix") else "the workload's") + ")")
    p.add_argument("--video-steps", type=steps_int, default=None,
                   help="world-action workloads: the video's denoise steps, 1..--steps (< --steps: the video's early "
                        "stop; default: the workload's, scaled with --steps)")
    p.add_argument("--cfg-scale", type=non_negative_float, default=None,
                   help="world-action workloads: classifier-free guidance scale, 0..100 (0: off; > 0 doubles the batch; "
                        "default: the workload's)")
    add_compile_cache(p)


def add_processes(p: argparse.ArgumentParser, command: str = "bench") -> None:
    """--processes N (bench, breakdown): the same command in N fresh processes (vlaperf.profile.processes)."""
    p.add_argument("--processes", type=number_arg(int, 1, maximum=MAX_PROCESSES), default=1,
                   help=f"run the whole {command} in N fresh processes, one after another, 1..{MAX_PROCESSES}: a table "
                        "of their medians and the spread; --json gets the middle process's result with every "
                        "process's timers (the first process compiles with cold caches, later ones find them warm) "
                        "(default: 1)")


def add_compile_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile-cache", default=None, metavar="DIR", type=path_arg,
                   help="keep torch.compile's and Triton's caches in DIR (created if missing), e.g. a volume that outlives "
                        "a container: a later process skips the compiles (H200, best: first call 9-14 s cold, 3.6-4 s warm)")


def wam_args(args) -> bool:
    """True for a world-action workload; pi0 workloads refuse the world-action settings."""
    from vlaperf.workloads import is_wam_workload

    if is_wam_workload(getattr(args, "workload", None)):
        return True
    given = [f"--{n.replace('_', '-')}" for n in ("sparsity", "video_steps", "cfg_scale") if getattr(args, n, None) is not None]
    if given:
        raise CliError(f"{', '.join(given)}: only for the world-action workloads (wam-761, wam-tiny)")
    if getattr(args, "mode", None) == "forward":
        raise CliError("--mode forward: only for the world-action workloads (wam-761, wam-tiny) so far")
    return False


def apply_compile_cache(args) -> None:
    """--compile-cache DIR: torch.compile's and Triton's caches there, for this process."""
    if getattr(args, "compile_cache", None):
        from vlaperf.engine.compile import use_compile_cache

        try:
            use_compile_cache(args.compile_cache)
        except ValueError as e:
            raise CliError(str(e)) from None


def setup_device(args) -> torch.device:
    """What every model command does first: the compile caches (--compile-cache) and the device."""
    apply_compile_cache(args)
    return requested_device(args)


def requested_device(args) -> torch.device:
    """--device (default: cuda where there is one), refused where this machine has no such device."""
    import torch

    device = torch.device(args.device or default_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda requested but CUDA is not available (use --device cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise CliError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                       f"cuda:{torch.cuda.device_count() - 1}")
    return device


# Above this many parameters a model on the CPU is a long wait, and nothing is printed while it builds: libero-pi0 on a
# 2-core machine in float32 (3.5e9 parameters, 14 GB) took 86 s to build and 30 s for one reference call (2026-12-04).
LONG_ON_CPU_PARAMS = 100_000_000


def note_size_on_cpu(model_class, config, device: torch.device, dtype: torch.dtype | None, name: str) -> None:
    """Before a full-size model is built on the CPU, say on stderr what the wait will be: its parameter count
    (counted on the meta device, nothing allocated), its weights' size against the memory this machine has
    available, and that the tiny workloads are the CPU's. Nothing for a small model or a GPU."""
    import torch

    if device.type != "cpu":
        return
    with torch.device("meta"):
        params = sum(p.numel() for p in model_class(config).parameters())
    if params < LONG_ON_CPU_PARAMS:
        return
    dtype = dtype or torch.float32  # the builders' CPU default
    weights = params * dtype.itemsize
    available = available_memory_bytes()
    memory = "" if available is None else (
        f" ({available / 1e9:.0f} GB available: the build may be killed for memory)" if weights > available
        else f" of the {available / 1e9:.0f} GB available")
    print(f"vlaperf: {name} on the CPU: {params / 1e9:.1f}e9 parameters, {weights / 1e9:.1f} GB of "
          f"{str(dtype).replace('torch.', '')} weights{memory}. A model this size is slow on a CPU (libero-pi0's "
          "3.5e9 in float32 took 86 s to build and 30 s a call on 2 cores); --warmup and --iters set how many calls "
          "run. The tiny workloads are the CPU's.",
          file=sys.stderr, flush=True)


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def setup(args):
    import torch

    from vlaperf.models.pi0 import Pi0Model, build_model
    from vlaperf.workloads import WORKLOADS, get_workload

    if wam_args(args):  # also refuses the world-action settings beside a pi0 workload
        raise CliError(f"workload {args.workload!r} is a world-action model workload: `vlaperf bench`, `check`, `matrix`, "
                       "`breakdown`, `scaling`, `syncs`, `doctor` and `serve` run it; this command takes a pi0-family workload")
    device = setup_device(args)
    workload_id = args.workload or ("libero-pi0" if device.type == "cuda" else "tiny")
    try:
        base = get_workload(workload_id)
    except ValueError as e:
        raise CliError(str(e)) from None
    workload, config = resolve_shape(args, base)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    checkpoint = None
    if args.checkpoint:  # read and matched by name and shape first: a wrong file is an error before the build
        from vlaperf.checkpoints import CheckpointError, check_tensors, load_read_tensors, read_model_tensors

        with torch.device("meta"):  # the model's names and shapes, nothing allocated
            shapes = {k: v.shape for k, v in Pi0Model(config).state_dict().items()}
        try:
            checkpoint = read_model_tensors(args.checkpoint, shapes, config.pi05)
            check_tensors(checkpoint[0], shapes, config)
        except CheckpointError as e:  # (libero-pi0 on a 2-core CPU was built for 84 s before this said so)
            raise CliError(f"--checkpoint: {e}") from None
    note_size_on_cpu(Pi0Model, config, device, dtype, workload.id)
    model = build_model(config, device=device, dtype=dtype, seed=args.seed)
    if checkpoint is not None:
        try:
            load_read_tensors(model, *checkpoint)  # the values' checks (finite in the model's dtypes), then the copy
        except CheckpointError as e:
            raise CliError(f"--checkpoint: {e}") from None
    assert workload_id in WORKLOADS
    return base, workload, model, device


def make_engine(model, levers: str):
    from vlaperf.engine import Engine, LeverError
    from vlaperf.engine.compile import CompileUnavailable

    try:
        return Engine(model, levers)
    except (LeverError, CompileUnavailable) as e:
        raise CliError(str(e)) from None


def result_header(command: str, base, workload, model, env: dict, levers: list[str], label: str, mode: str | None) -> dict:
    from vlaperf.report.schema import SCHEMA

    return {
        "schema": SCHEMA,
        "command": command,
        "workload": {"id": workload.id, "overrides": workload.overrides_vs(base)},
        "variant": {"levers": levers, "label": label, "dtype": str(model.dtype).replace("torch.", ""),
                    "checkpoint": getattr(model, "checkpoint", None)},  # None: random weights
        "mode": mode,
        "env": env,
    }


# --------------------------------------------------------------------------- bench


def refuse_bench_args(args) -> bool:
    """The settings bench refuses, checked before it builds a model or starts --processes' children (each child would
    refuse them only after its own start). True for a world-action workload."""
    refuse_spin_without_idle(args)
    if args.release_reference and args.levers in ("reference", "none", ""):
        raise CliError("--release-reference needs an engine variant (the reference path runs on those weights)")
    if not wam_args(args):
        return False
    if getattr(args, "rtc", False):
        raise CliError(f"--rtc: real-time chunking is the pi0 family's; {args.workload} (the world-action model) "
                       "has no previous-chunk guidance")
    from vlaperf.profile import wam

    wam.refuse_policy_mode(args.mode)
    wam.refuse_sampler_options_in_forward(args, args.mode)
    return True


def cmd_bench(args) -> int:
    import torch

    from vlaperf.check import RTC_DELAY, check_equivalence, rtc_executed, rtc_guidance
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.models.pi0 import RtcConfig
    from vlaperf.policy import served_call
    from vlaperf.report.schema import write_result
    from vlaperf.roofline import H200_CEILINGS, measure_ceilings, roofline
    from vlaperf.timing import environment_record, interleaved, time_calls

    is_wam = refuse_bench_args(args)
    if args.processes > 1:  # the same command in fresh processes, one after another: the figure with its spread
        from vlaperf.profile.processes import in_processes

        return in_processes(args.argv, args.processes, args.json)
    if is_wam:
        from vlaperf.profile import wam

        return wam.cmd_bench(args)
    base, workload, model, device = setup(args)
    engine = None if args.levers in ("reference", "none", "") else make_engine(model, args.levers)
    sample = engine.sample_actions if engine else model.sample_actions
    label = engine.name if engine else "reference"
    steps = workload.steps
    noise = random_noise(workload, model.config, device, seed=args.seed)
    rtc = RtcConfig() if getattr(args, "rtc", False) else None
    # a previous chunk for the guided call: its values do not change the call's cost, only its result
    previous = random_noise(workload, model.config, device, seed=args.seed + 1) if rtc else None
    if args.mode == "model":
        obs = random_observation(workload, model.config, device, seed=args.seed)
        if rtc is None:
            fn = lambda: sample(obs, noise, steps)  # noqa: E731
        else:
            guidance = rtc_guidance(previous, rtc, steps)
            fn = lambda: sample(obs, noise, steps, guidance=guidance)  # noqa: E731
    else:
        fn = served_call(model, sample, workload, noise, seed=args.seed,
                         verify=engine.raise_on_kernel_fault if engine is not None else None, rtc=rtc,
                         previous=previous)
    # The first call carries compile / graph capture: time it before anything else runs it. A lever that fails only
    # when it runs (kernels that do not fit this GPU) raises LeverError here, which main turns into its message.
    first_call_s = _timed_once(fn, device)
    equivalence = None
    if engine is not None and not args.no_check:
        equivalence = check_equivalence(model, engine, workload, rtc=rtc)  # with --rtc, the guided call too
        if not equivalence["passed"]:
            print(f"vlaperf: variant {label} fails equivalence{' (guided calls included)' if rtc else ''} (rel_l2 "
                  f"{equivalence['rel_l2']:.3g} > {equivalence['tolerance']:.3g}); refusing to report its speed",
                  file=sys.stderr)
            return 1
    released = engine.release_reference_weights() if args.release_reference else None
    # the first call above is the first of --warmup's calls
    timing = time_calls(fn, device=device, warmup=args.warmup, iters=args.iters, progress=not args.no_progress,
                        label=label, first_call_s=first_call_s)
    vs_unguided = None
    if rtc is not None:  # what the guidance costs: the guided call against the plain one, interleaved in this process
        if args.mode == "model":
            plain = lambda: sample(obs, noise, steps)  # noqa: E731
        else:
            plain = served_call(model, sample, workload, noise, seed=args.seed,
                                verify=engine.raise_on_kernel_fault if engine is not None else None)
        vs_unguided = rtc_cost(interleaved({"unguided": plain, "guided": fn}, device=device,
                                           warmup=max(1, min(args.warmup, 10)), iters=args.iters,
                                           baseline="unguided", progress=not args.no_progress))
    idle = idle_cost(fn, device, args)
    plan = getattr(engine, "last_plan", None)
    images = len(plan.slots) if plan else workload.image_slots
    prompt = plan.prompt_len if plan else workload.prompt_slots
    ceilings = H200_CEILINGS
    if getattr(args, "ceilings", "h200") == "measure":  # after the timed calls, so it cannot disturb them
        ceilings = measure_ceilings(device, model.dtype)
    floor = roofline(model.config, workload, images, prompt, bytes_per_param=model.dtype.itemsize,
                     matmul_flops=ceilings["matmul_flops"], bandwidth=ceilings["bandwidth"])
    floor["ceilings"] = ceilings
    env = environment_record(device)
    result = result_header("bench", base, workload, model, env, engine.levers.names() if engine else [], label, args.mode)
    result.update({k: timing[k] for k in ("timers", "warmup_s", "warmup", "iters", "peak_memory_bytes")})
    result["first_call_s"] = first_call_s
    result["first_call_timing"] = ("reference: no check" if engine is None else
                                   "not checked (--no-check)" if args.no_check else "before equivalence check")
    result["samples"] = timing["samples"]
    result["equivalence"] = equivalence
    result["released_reference_bytes"] = released
    if rtc is not None:  # the guided call of real-time chunking was timed (check.rtc_guidance's previous chunk)
        result["rtc"] = {"execution_horizon": rtc.execution_horizon, "max_guidance_weight": rtc.max_guidance_weight,
                         "schedule": rtc.schedule, "executed": rtc_executed(workload.horizon),
                         "delay": RTC_DELAY, "vs_unguided": vs_unguided}
    if idle is not None:
        result["idle"] = idle
    if device.type == "cuda":
        result["memory_allocated_bytes"] = torch.cuda.memory_allocated(device)  # after the timed calls: what stays
    result["roofline"] = floor  # of the H200's ceilings unless measured here: readers compare GPU runs to it only
    if engine is not None and engine.levers.megakernel:  # the step kernel's tiling as fitted here (None: it did not run)
        from vlaperf.engine.kernels.expert_step import last_launch

        result["step_kernel"] = last_launch(device)
    print_bench(result)
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return 0


def _timed_once(fn, device) -> float:
    import time

    from vlaperf.timing import synchronize

    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def pair_cost(timing: dict, base: str, other: str) -> dict:
    """Two calls from `timing.interleaved` (baseline `base`): each one's wall-clock (and CUDA event) median as
    "<name>_median", "<other>_over_<base>" (the ratio of the medians) and the p10..p90 of the per-round ratios
    other / base (both calls of a round: drift cancels)."""
    from vlaperf.timing import _ratio_stats

    out = {}
    for timer in ("wall_ms", "cuda_event_ms"):
        if timing["ratios"][other][timer] is None:
            out[timer] = None
            continue
        # The per-round ratios taken this way round, not as 1 / p90 and 1 / p10 of base / other: a percentile
        # interpolated between two rounds is not the reciprocal of the other way's.
        cost = _ratio_stats(timing["variants"][other]["samples"][timer], timing["variants"][base]["samples"][timer])
        out[timer] = {f"{base}_median": timing["variants"][base]["timers"][timer]["median"],
                      f"{other}_median": timing["variants"][other]["timers"][timer]["median"],
                      f"{other}_over_{base}": cost["speedup"],
                      "per_round_p10": cost["ratio_p10"], "per_round_p90": cost["ratio_p90"]}
    out["iters"] = timing["iters"]
    return out


def add_idle_spin(p) -> None:
    p.add_argument("--idle-spin", action="store_true",
                   help="with --idle-ms: spin on the clock through the idle instead of sleeping, so the core stays "
                        "awake; against a sleeping idle it says whether the cost is the core's sleep or its caches'")


def idle_cost(fn, device, args) -> dict | None:
    """`bench --idle-ms`: the call after that idle (the host asleep, the device synchronized), as a control loop makes
    it, interleaved with the same call back to back (baseline); None without the option."""
    from vlaperf.timing import interleaved

    if getattr(args, "idle_ms", None) is None:
        return None
    timing = interleaved({"back_to_back": fn, "after_idle": fn}, device=device, warmup=max(1, min(args.warmup, 10)),
                         iters=args.iters, baseline="back_to_back", progress=not args.no_progress,
                         idle_ms={"after_idle": args.idle_ms}, idle_spin=getattr(args, "idle_spin", False))
    return {"idle_ms": args.idle_ms, "spin": getattr(args, "idle_spin", False),
            **pair_cost(timing, "back_to_back", "after_idle")}


def refuse_spin_without_idle(args) -> None:
    if getattr(args, "idle_spin", False) and getattr(args, "idle_ms", None) is None:
        raise CliError("--idle-spin: spins through the idle that --idle-ms gives; add --idle-ms MS")


def rtc_cost(timing: dict) -> dict:
    """`bench --rtc`'s guided call against the unguided one (baseline "unguided")."""
    return pair_cost(timing, "unguided", "guided")


def print_bench(result: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    from vlaperf.report.document import short_variant

    rtc = result.get("rtc")
    guided = (f", real-time chunking: {rtc['executed']} executed, delay {rtc['delay']}, {rtc['schedule']} schedule"
              if rtc else "")
    # the title a line of its own in short names (a table's title wraps at the table's ~80 columns: best's whole
    # label took three lines), the levers in full below the table
    label = result["variant"]["label"]
    title = Text(f"vlaperf bench  {result['workload']['id']}  {short_variant(label)}  ({result['mode']} mode, "
                 f"{result['variant']['dtype']}, {result['env'].get('gpu') or 'cpu'}{guided})", style="bold")
    t = Table()
    t.add_column("timer")
    for k in ("median", "mean", "p90", "p95", "p99", "min", "max"):
        t.add_column(k + " ms", justify="right")
    for name, s in result["timers"].items():
        if s:
            t.add_row(name, *(f"{s[k]:.3f}" for k in ("median", "mean", "p90", "p95", "p99", "min", "max")))
    console = wide_console()
    console.print(title)
    console.print(t)
    if short_variant(label) != label:
        console.print("levers: " + ", ".join(p for p in label.replace("+", ",").split(",") if p))
    ckpt = result["variant"].get("checkpoint")
    if ckpt:  # which weights were timed (the file says it; the console did not)
        hub = ckpt.get("hub")
        console.print(f"weights: {ckpt['path']} ({ckpt['layout']} layout"
                      + (f", Hub {hub['repo']} at {hub['revision'][:12]}" if hub else "") + ")", highlight=False)
    med = result["timers"]["wall_ms"]["median"]
    floor = result.get("roofline")
    n = result["iters"]
    line = f"first call {result['first_call_s']:.2f} s; {n} timed call{'' if n == 1 else 's'} after {result['warmup']} warm-up"
    measured = (floor or {}).get("ceilings", {}).get("source") == "measured on this device"
    if floor and (result["env"].get("gpu") or measured):
        which = (f"this device's ceilings: {floor['matmul_flops'] / 1e12:.3g} TFLOP/s, {floor['bandwidth'] / 1e12:.3g} TB/s, "
                 "measured" if measured else
                 "H200 ceilings" + ("" if "H200" in (result["env"].get("gpu") or "") else
                                    "; --ceilings measure gives this GPU's own"))
        line += f"; roofline floor {floor['floor_ms']:.2f} ms ({which}) -> {med / floor['floor_ms']:.2f}x the floor"
    if result.get("peak_memory_bytes"):
        line += f"; peak memory {result['peak_memory_bytes'] / 2**30:.2f} GiB"
    if result.get("released_reference_bytes"):
        line += f" with {result['released_reference_bytes'] / 1e9:.2f} GB of reference weights released (as served)"
    if result["env"].get("gpu_state"):
        from vlaperf.gpu_state import describe_gpu_state

        line += f"; GPU after the timed calls: {describe_gpu_state(result['env']['gpu_state'])}"
    console.print(line)
    from vlaperf.timing import spread_note

    wide = spread_note(result["timers"].get("wall_ms"), result["env"])
    if wide:
        console.print(wide, style="yellow")
    cost = (rtc or {}).get("vs_unguided")
    if cost and cost.get("wall_ms"):
        w = cost["wall_ms"]
        console.print(f"real-time chunking's cost, interleaved with the unguided call ({cost['iters']} rounds): guided "
                      f"{w['guided_median']:.3f} ms, unguided {w['unguided_median']:.3f} ms, "
                      f"{w['guided_over_unguided']:.3f}x (per round p10-p90 {w['per_round_p10']:.3f}-"
                      f"{w['per_round_p90']:.3f})")
    idle = result.get("idle")
    if idle and idle.get("wall_ms"):
        from vlaperf.report.render import idle_words

        w = idle["wall_ms"]
        console.print(f"after {idle_words(idle['idle_ms'], idle.get('spin', False))}, interleaved with back-to-back "
                      f"calls ({idle['iters']} rounds): "
                      f"{w['after_idle_median']:.3f} ms against {w['back_to_back_median']:.3f} ms, "
                      f"{w['after_idle_over_back_to_back']:.3f}x (per round p10-p90 {w['per_round_p10']:.3f}-"
                      f"{w['per_round_p90']:.3f})")
    eq = result.get("equivalence")
    if eq:  # checked before the timing (a variant that fails is never timed): said here, not only in the file
        video = f", video rel L2 {eq['video_rel_l2']:.1e}" if "video_rel_l2" in eq else ""
        guided = ", guided calls included" if eq.get("guided") else ""
        console.print(f"equivalence vs the reference ({eq.get('seeds', '?')} seeds{guided}): actions rel L2 {eq['rel_l2']:.1e}"
                      f"{video}, max abs {eq['max_abs']:.2e}, tolerance {eq['tolerance']:.0e}: "
                      + ("passed" if eq["passed"] else "FAILED"))
    if result["variant"]["label"] == "reference":  # what `vlaperf bench` with no arguments runs: say where to go next
        semantics = "" if result["workload"]["id"].startswith("wam") else " (openpi's semantics)"
        console.print(f"the reference path{semantics}; next: `--levers best` times the engine with every "
                      "lever, `vlaperf matrix --variants cumulative` what each lever buys", style="dim")


# --------------------------------------------------------------------------- check


def cmd_check(args) -> int:
    from rich.table import Table

    from vlaperf.check import check_equivalence
    from vlaperf.engine.levers import LEVERS, REQUIRES
    from vlaperf.report.schema import write_result
    from vlaperf.timing import environment_record

    if wam_args(args):
        from vlaperf.profile import wam

        return wam.cmd_check(args)
    base, workload, model, device = setup(args)
    if args.levers == "all":
        # Each lever alone (with what it needs beside it), then the best preset.
        specs = [",".join(REQUIRES.get(n, ()) + (n,)) for n in LEVERS if _applicable(n, device)] + ["best"]
    else:
        specs = [s for s in args.levers.split(";") if s.strip()]
    if not specs:
        raise CliError(f"--levers {args.levers!r}: no variant to check; expected 'all' or ';'-separated variants")
    # Every variant is checked for this device before the first one runs (minutes on a GPU): a
    # variant that cannot apply here is an error naming it, not a failure after the others' work.
    from vlaperf.engine import LeverError, Levers

    for spec in specs:
        try:
            levers = Levers.parse(spec, device, model.dtype)
        except LeverError as e:  # a typo, not this machine's fault
            raise CliError(f"--levers: variant {spec!r}: {e}") from None
        try:
            levers.check(device)
        except LeverError as e:
            raise CliError(f"--levers: variant {spec!r} cannot run here: {e}") from None
    refuse_repeated_variants(specs, lambda spec: Levers.parse(spec, device, model.dtype).names(), "--levers", device)
    rows = []
    for spec in specs:
        try:
            engine = make_engine(model, spec)
            rows.append(check_equivalence(model, engine, workload, seeds=range(args.seeds)))
        except (CliError, LeverError) as e:
            # What only shows when the variant runs (a kernel whose tiles do not fit this GPU or dtype) is this row's
            # error: the rows checked before it, minutes of work on a GPU, are kept and the ones after it still run
            rows.append(could_not_run(spec, model, device, args.seeds, e))
    from vlaperf.timing import device_label

    dtype = str(model.dtype).replace("torch.", "")
    table = Table(title=f"vlaperf check  {workload.id}  ({dtype}, {device_label(device)})")
    for col in ("variant", "max abs", "rel L2", "tolerance", "passed"):
        table.add_column(col, overflow="fold")  # a long variant name wraps, never cut
    from vlaperf.report.document import table_names

    for r, name in zip(rows, table_names([r["variant"] for r in rows], 60)):  # as the matrix names them
        if "error" in r:
            table.add_row(name, "", "", f"{r['tolerance']:.0e}", "could not run")
        else:
            table.add_row(name, f"{r['max_abs']:.3g}", f"{r['rel_l2']:.3g}", f"{r['tolerance']:.0e}",
                          "yes" if r["passed"] else "NO")
    wide_console().print(table)
    for r in rows:
        if "error" in r:
            print(f"{r['variant']} could not run: {r['error']}", file=sys.stderr)
    if not all(r.get("reference_finite", True) for r in rows):
        print("the reference's own actions hold NaN or inf: the weights or inputs are broken (a checkpoint whose "
              "values overflow the model's dtype?), so no variant can be checked against them", file=sys.stderr)
    if args.levers == "all":
        print(not_checked_alone(device))
    if args.json:
        result = result_header("check", base, workload, model, environment_record(device), [], "check", None)
        result["checks"] = rows
        write_result(result, args.json)
        print(f"wrote {args.json}")
    if any(not r["passed"] and "error" not in r for r in rows):
        return 1  # a variant that gives other actions than the reference: the finding check is for
    return 2 if any("error" in r for r in rows) else 0


def could_not_run(spec: str, model, device: torch.device, seeds: int, error: Exception) -> dict:
    """check's row for a variant that raised before it gave actions: no errors measured, not passed, and why."""
    from vlaperf.check import REL_L2_TOLERANCE
    from vlaperf.engine import Levers

    return {"variant": Levers.parse(spec, device, model.dtype).label(), "dtype": str(model.dtype).replace("torch.", ""),
            "seeds": seeds, "max_abs": None, "rel_l2": None, "tolerance": REL_L2_TOLERANCE[model.dtype],
            "passed": False, "error": str(error)}


def not_checked_alone(device: torch.device) -> str:
    """`check --levers all`'s line on the levers it did not check alone, and where they were checked. On a GPU where
    compile cannot run (no C compiler), best falls back to the graph preset and checks no compile either."""
    from vlaperf.engine import LEVERS, Levers
    from vlaperf.engine.compile import compile_blockers

    left = [n for n in LEVERS if not _applicable(n, device)]
    if device.type != "cuda":
        why = ("cuda_graph, triton_kernels and megakernel need a GPU; compile and compile_layers take minutes alone: "
               "check them by name, e.g. --levers for_loop,compile")
    elif Levers.parse("best", device).compile:
        why = "compile and compile_layers take minutes alone; best checks them"
    else:
        why = (f"compile and compile_layers take minutes alone, and best leaves them out here "
               f"({'; '.join(compile_blockers('inductor', 'cuda'))}): nothing checked compile")
    return f"not checked alone: {', '.join(left)} ({why})"


def _applicable(lever: str, device: torch.device) -> bool:
    if lever in ("cuda_graph", "triton_kernels", "megakernel"):
        return device.type == "cuda"
    return lever not in ("compile", "compile_layers")  # compile is checked explicitly (it needs a compiler and minutes)


# --------------------------------------------------------------------------- levers


def _print_lever_details(names: list[str]) -> int:
    """`vlaperf levers NAME...`: each lever's line, the rest of what it does, what it needs and which presets hold
    it, for the pi0 family and the world-action model (sdpa, fuse_projections, cuda_graph and compile are both's)."""
    import difflib

    from vlaperf.engine.levers import BEST_GPU, EXACT, GRAPH_GPU, LEVER_NOTES, LEVERS, REQUIRES, TUNED_FOR
    from vlaperf.engine.wam import WAM_LEVER_NOTES, WAM_LEVERS, WAM_PRESETS, WAM_REQUIRES

    pi0_presets = {"reference": (), "exact": EXACT, "graph": GRAPH_GPU, "best": BEST_GPU + tuple(TUNED_FOR)}
    every = [*LEVERS, *(n for n in WAM_LEVERS if n not in LEVERS)]
    names = [n.partition("=")[0] for n in names]  # compile=max-autotune: the compile lever
    for name in names:
        if name not in every and name not in pi0_presets and name != "serve":
            near = difflib.get_close_matches(name.lower(), [*every, *pi0_presets], n=1, cutoff=0.6)
            raise CliError(f"unknown lever {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                           + f"; expected any of: {', '.join(every)}, or a preset: {', '.join(pi0_presets)}")
    blocks = []
    for name in names:
        if name == "serve":  # no lever list: `vlaperf serve` picks one by its device
            blocks.append("serve (`vlaperf serve`'s default --levers, taken by no other command): graph on a GPU "
                          f"({', '.join(GRAPH_GPU)}), exact on the CPU ({', '.join(EXACT)}); the world-action "
                          "model's likewise")
            continue
        if name in pi0_presets:  # a preset: the levers it holds in either model family
            tuned = f"; + {', '.join(TUNED_FOR)} on Hopper GPUs for a bfloat16 model" if name == "best" else ""
            blocks.append(
                f"{name} (pi0-family preset): {', '.join(n for n in pi0_presets[name] if n not in TUNED_FOR) or 'none'}"
                + (f"{tuned}; on the CPU: {', '.join(EXACT)}" if name == "best" else "") + "\n"
                f"{name} (world-action model preset): {', '.join(WAM_PRESETS[name]) or 'none'}"
                + ("; on the CPU: exact" if name == "best" else ""))
            continue
        for family, levers, notes, requires, presets in (
                ("pi0 family", LEVERS, LEVER_NOTES, REQUIRES, pi0_presets),
                ("world-action model", WAM_LEVERS, WAM_LEVER_NOTES, WAM_REQUIRES, WAM_PRESETS)):
            if name not in levers:
                continue
            held = [p for p, ls in presets.items() if any(x.partition("=")[0] == name for x in ls)]
            lines = [f"{name} ({family}): {levers[name]}"]
            if name in notes:
                lines += textwrap.wrap(notes[name], 100, initial_indent="  ", subsequent_indent="  ")
            lines.append(f"  needs: {', '.join(requires[name]) if name in requires else 'nothing else'}; "
                         f"in presets: {', '.join(held) or 'none'}")
            if family == "pi0 family" and name in TUNED_FOR:
                lines[-1] += " (best: on Hopper GPUs, compute capability 9.x, for a bfloat16 model)"
            blocks.append("\n".join(lines))
    print("\n\n".join(blocks))
    return 0


def cmd_levers(args) -> int:
    from rich.table import Table

    from vlaperf.engine.levers import BEST_CPU, BEST_GPU, GRAPH_GPU, LEVERS, TUNED_DTYPES, TUNED_FOR

    if args.names:
        return _print_lever_details(args.names)
    table = Table(title="vlaperf levers  (`vlaperf levers NAME` for one lever's details)")
    table.add_column("lever")
    table.add_column("what it does")
    for name, desc in LEVERS.items():
        table.add_row(name, desc)
    console = wide_console()
    console.print(table)
    # what `best` adds where, from the tables Levers.parse reads (a float32 model's best has no kernels)
    tuned = f"{', '.join(TUNED_FOR)} on Hopper, compute capability 9.x, for a " \
            f"{' or '.join(str(d).replace('torch.', '') for d in TUNED_DTYPES)} model"
    presets = Table(title="pi0-family presets (`--levers NAME`)")
    presets.add_column("preset")
    presets.add_column("levers")  # ", " between them: rich wraps a long list at its spaces, not inside a name
    presets.add_row("best (GPU)", f"{', '.join(BEST_GPU)}; + {tuned}")
    presets.add_row("graph (GPU, no compile)", ", ".join(GRAPH_GPU))
    presets.add_row("exact (best on the CPU)", ", ".join(BEST_CPU))
    presets.add_row("reference", "none (openpi's semantics)")
    presets.add_row("serve (`vlaperf serve` only)", "its default: graph on a GPU, exact on the CPU")
    console.print(presets)
    from vlaperf.engine.wam import WAM_LEVERS, WAM_PRESETS

    table = Table(title="world-action model levers (workloads wam-761, wam-tiny)")
    table.add_column("lever")
    table.add_column("what it does")
    for name, desc in WAM_LEVERS.items():
        table.add_row(name, desc)
    console.print(table)
    presets = Table(title="world-action model presets")
    presets.add_column("preset")
    presets.add_column("levers")
    for k, v in WAM_PRESETS.items():
        presets.add_row(k + (" (CPU: exact)" if k == "best" else ""), ", ".join(v) or "none")
    console.print(presets)
    return 0


def cmd_workloads(args) -> int:
    """The workloads every figure names, and the conventions (`vlaperf serve --conventions`) each can serve."""
    from rich.table import Table

    from vlaperf.conventions import CONVENTIONS, conventions_for
    from vlaperf.workloads import WAM_WORKLOADS, WORKLOADS

    rows = []
    for w in WORKLOADS.values():
        lo, hi = min(w.prompt_valid), max(w.prompt_valid)
        rows.append({"id": w.id, "preset": w.preset, "batch": w.batch, "images": f"{sum(w.image_valid)} of {w.image_slots}",
                     "prompt": f"{lo if lo == hi else f'{lo}..{hi}'} of {w.prompt_slots}", "state": w.state_dim,
                     "actions": f"{w.horizon} x {w.robot_action_dim} ({w.action_dim})", "steps": w.steps,
                     "layout": w.layout})
    # per batch-1 workload, the conventions of its model and layout (serving with them sets the chunk they were
    # trained with); "none" fits every one
    serving = {w.id: ["none", *conventions_for(w.model_config().pi05, w.layout)] for w in WORKLOADS.values()
               if w.batch == 1 and w.preset != "tiny"}
    conventions = [{"name": c.name, "workloads": [wid for wid, names in serving.items() if c.name in names],
                    "description": c.description} for c in CONVENTIONS.values()]
    wam_rows = [{"id": w.id, "preset": w.preset, "batch": w.batch, "steps": w.steps, "video_steps": w.video_steps,
                 "sparsity": w.sparsity, "cfg_scale": w.cfg_scale} for w in WAM_WORKLOADS.values()]
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps({"pi0": rows, "conventions": conventions, "world_action": wam_rows},
                                              indent=1) + "\n")
        print(f"wrote {args.json}")
    console = wide_console()
    table = Table(title="vlaperf workloads (pi0 family)")
    for col in ("id", "preset", "batch", "images valid", "prompt tokens valid", "state", "actions (padded)", "steps",
                "layout"):
        table.add_column(col, no_wrap=col == "id")
    for r in rows:
        table.add_row(r["id"], r["preset"], str(r["batch"]), r["images"], r["prompt"], str(r["state"]), r["actions"],
                      str(r["steps"]), r["layout"])
    console.print(table)
    table = Table(title="world-action model workloads")
    for col in ("id", "preset", "batch", "steps", "video steps", "sparsity", "cfg scale"):
        table.add_column(col)
    for r in wam_rows:
        table.add_row(r["id"], r["preset"], str(r["batch"]), str(r["steps"]), str(r["video_steps"]), r["sparsity"],
                      str(r["cfg_scale"]))
    console.print(table)
    table = Table(title="conventions (vlaperf serve --conventions) and the batch-1 workloads of their model and layout "
                        "(the conventions set the chunk)")
    for col in ("conventions", "workloads", "what the served policy does"):
        table.add_column(col, no_wrap=col == "conventions")
    for c in conventions:
        table.add_row(c["name"], ", ".join(c["workloads"]) or "-", c["description"])
    console.print(table)
    console.print("--batch, --steps and --action-horizon override a workload; every result file records the overrides. "
                  "docs/serving.md says more of each conventions.")
    return 0


# --------------------------------------------------------------------------- matrix


def cmd_matrix(args) -> int:
    # --levers is the name bench and check use for what the matrix calls --variants: either one, never
    # ignored.
    if args.levers is not None and args.variants is not None and args.levers != args.variants:
        raise CliError(f"--levers {args.levers!r} and --variants {args.variants!r}: give one of them (they name the same "
                       "thing: the matrix's variants)")
    given = args.variants if args.variants is not None else args.levers
    if given is not None and not any(item.strip() for item in given.split(";")):
        # an empty list (an unset shell variable, say) would otherwise run the whole default matrix
        raise CliError(f"--variants {given!r}: no variant; expected 'cumulative', 'grid' or ';'-separated variants, "
                       "e.g. 'graph;best'")
    args.variants = given or "cumulative"
    ray_only = [flag for flag, value in (("--ray-address", getattr(args, "ray_address", None)),
                                         ("--ray-cpus-per-task", getattr(args, "ray_cpus_per_task", None)))
                if value is not None]
    if ray_only and not getattr(args, "ray", False):  # it would run here, in this process, without a word
        raise CliError(f"{', '.join(ray_only)}: configure the matrix's Ray tasks and need --ray")
    refuse_spin_without_idle(args)
    if getattr(args, "ray", False) and args.idle_ms is not None:
        raise CliError("--idle-ms with --ray: the Ray tasks time their variants back to back; run the matrix here, "
                       "without --ray, to time every call after the idle")
    if wam_args(args):
        from vlaperf.profile import wam

        return wam.cmd_matrix(args)
    if getattr(args, "ray", False):
        from vlaperf.profile.ray_matrix import run_matrix_ray

        return run_matrix_ray(args)
    from vlaperf.profile.matrix import run_matrix

    base, workload, model, device = setup(args)
    return run_matrix(args, base, workload, model, device)


# ----------------------------------------------------------------------------- main


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """`vlaperf` itself, its subcommands' parsers not yet added."""
    parser = argparse.ArgumentParser(
        prog="vlaperf", description="Fast, honestly measured inference for pi0-family policies.",
        epilog="`vlaperf <command> --help` lists a command's options. Exit codes: 0 ok (serve: also after a clean "
               "stop on SIGINT or SIGTERM); 1 a check failed (bench, check, matrix, serve, compare, lerobot-eval: a "
               "variant not equivalent to its reference, matrix after writing every row; doctor: a finding of "
               "severity error; "
               "loadgen, rollout: errors, lost replies or the time limit; diff: a slowdown above --max-slowdown); 2 bad "
               "arguments or setup; 130 interrupted; 143 stopped by SIGTERM (matrix: after writing the rows it had; "
               "bench and breakdown --processes: the running process stopped too; 128 + N where one of their "
               "processes was ended by signal N).")
    parser.add_argument("--version", action="version", version=f"vlaperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices  # name -> its parser, filled as they are added (main's unknown-option message)
    return parser, sub


def build_parser() -> argparse.ArgumentParser:
    parser, sub = _top_parser()

    p = sub.add_parser("bench", help="latency of one policy call (model or policy mode)")
    add_common(p)
    p.add_argument("--mode", choices=("model", "policy", "forward"), default="model",
                   help="model: the call on device tensors; policy: the served path (pi0 family); forward: one model "
                        "forward (world-action workloads) (default: model)")
    p.add_argument("--warmup", type=non_negative_int, default=30,
                   help="untimed calls before the timed ones, the first of them (compile, capture) timed on its own "
                        "as first_call_s, before the equivalence check; 0 is 1: that call is always made (default: 30)")
    p.add_argument("--iters", type=positive_int, default=100, help="timed calls (default: 100)")
    p.add_argument("--no-check", action="store_true", help="skip the equivalence check of a non-reference variant")
    p.add_argument("--release-reference", action="store_true",
                   help="after the check, free the reference weights the engine holds fused copies of, as `vlaperf serve` "
                        "does, so the peak memory is the served footprint")
    p.add_argument("--ceilings", choices=("h200", "measure"), default="h200",
                   help="the roofline floor's matmul rate and bandwidth: an H200's (780 TFLOP/s, 4.23 TB/s, "
                        "measured by the project; the default, the same yardstick on every GPU), or measured on this "
                        "device after the timed calls (a large matmul in the model's dtype and a large copy, ~1 s on "
                        "a GPU): this GPU's own floor")
    p.add_argument("--rtc", action="store_true",
                   help="time the guided call of real-time chunking (pi0 family; LeRobot's RTCConfig defaults, a "
                        "previous chunk with 3 actions executed and a delay of 2; docs/serving.md)")
    p.add_argument("--idle-ms", type=idle_ms_arg, default=None, metavar="MS",
                   help="also time the same call after MS milliseconds of idle (host asleep, device synchronized), "
                        "interleaved with back-to-back calls: what a control loop's wait between calls costs the next "
                        "one (caches and clocks gone cold); e.g. 85 for a 10 Hz loop around a 15 ms call")
    add_idle_spin(p)
    add_processes(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("check", help="equivalence of engine variants against the reference",
                       description="Equivalence of engine variants against the reference path: the same weights, "
                                   "inputs and noise. Exit 0: every variant passed; 1: one gave other actions than "
                                   "the reference; 2: one could not run here (its row says why, the others are kept).")
    add_common(p, levers_default="all",
               levers_help="'all' (default: each lever that applies on this device alone, with what it needs, then "
                           "'best', which covers compile and compile_layers), or ';'-separated variants, each a preset "
                           "or a comma list, e.g. 'for_loop,sdpa;best'")
    p.add_argument("--seeds", type=positive_int, default=2,
                   help="random inputs each variant is checked on, the same for every variant and --seed; the worst "
                        "one is shown (default: 2)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("matrix", help="optimization matrix: variants interleaved in one process")
    add_common(p, levers_default=None, levers_help="the same as --variants (the name bench and check use)")
    p.add_argument("--variants", type=variants_arg, default=None,
                   help="'cumulative' (the default), 'grid', or variants separated by ';', e.g. 'graph;best'")
    p.add_argument("--mode", choices=("model", "policy", "forward"), default=None,
                   help="model: each variant's call on device tensors (the default); policy: the served path around it, "
                        "as bench --mode policy times it (pi0 family); forward: one model forward (world-action "
                        "workloads)")
    # not rounds_warmup_help: a matrix row's first call (compile, capture) is made and timed when the row is prepared,
    # before its equivalence check, so these calls all come after it
    p.add_argument("--warmup", type=positive_int, default=10,
                   help="untimed calls of each variant before the rounds, after its first call (compile, capture), "
                        "which is timed on its own when its row is prepared, before its equivalence check; at least "
                        "1 (default: 10)")
    p.add_argument("--iters", type=positive_int, default=50, help="interleaved rounds, one timed call of each variant a "
                                                                  "round (default: 50)")
    p.add_argument("--idle-ms", type=idle_ms_arg, default=None, metavar="MS",
                   help="time every call after MS milliseconds of idle (host asleep, device synchronized), as a control "
                        "loop calls its policy, instead of back to back: which levers keep their gain under a robot's "
                        "cadence")
    add_idle_spin(p)
    from vlaperf.profile.ray_matrix import add_matrix_arguments

    add_matrix_arguments(p)  # --ray, --ray-address, --ray-cpus-per-task (docs/scale-out.md)
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("levers", help="list the speed levers, or one lever's details")
    p.add_argument("names", nargs="*", metavar="NAME", help="a lever to describe in full (what it does, what it "
                   "measured, what it needs, which presets hold it), or a preset (the levers it holds); none: the "
                   "table of all")
    p.set_defaults(func=cmd_levers)

    p = sub.add_parser("workloads", help="list the workloads and the conventions that serve each")
    p.add_argument("--json", type=output_file, default=None, help="also write the list here")
    p.set_defaults(func=cmd_workloads)

    from vlaperf.serve.commands import register as register_serve

    register_serve(sub)

    from vlaperf.profile.commands import register as register_profile

    register_profile(sub)

    from vlaperf.compare.commands import register as register_compare

    register_compare(sub)
    return parser


def file_command_parser(command: str) -> argparse.ArgumentParser:
    """`vlaperf` with `command` alone, one of the commands that only read result files (report, diff:
    vlaperf.profile.commands.FILE_COMMANDS): main's parser for `vlaperf <command> ...`. The other commands' parsers
    take choices from modules that import torch (the model presets, the compile modes, the RTC schedules), and these
    commands do not import it (a second or more; an analysis machine may have no torch, or none with CUDA)."""
    from vlaperf.profile.commands import FILE_COMMANDS

    parser, sub = _top_parser()
    FILE_COMMANDS[command](sub)
    return parser


def join_negative_values(argv: list[str]) -> list[str]:
    """`--steps -1,2` -> `--steps=-1,2`: argparse takes a value that starts with '-' for an option unless it is one
    plain negative number, so a list like "-1,2" got "expected one argument" instead of the option's own message
    naming the range. No vlaperf option looks like a number."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-\d[\d.,;]*", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


# a command that a SIGTERM stopped after it wrote what it had (`vlaperf matrix`) returns this
STOPPED_BY_SIGTERM = 128 + 15


def main(argv: list[str] | None = None) -> int:
    from vlaperf.profile.commands import FILE_COMMANDS  # which commands only read files (a torch-free import)

    typed = join_negative_values(sys.argv[1:] if argv is None else list(argv))
    parser = file_command_parser(typed[0]) if typed and typed[0] in FILE_COMMANDS else build_parser()
    args, unknown = parser.parse_known_args(typed)
    if unknown:
        refuse_unknown_options(parser.commands[args.command], unknown)
    args.argv = typed  # as typed: `bench --processes N` runs the same command again in fresh processes
    try:
        resolve_hub_paths(args)
        code = args.func(args)
        if code == STOPPED_BY_SIGTERM and argv is None:
            # The program itself (not a caller in Python) was told to stop and has written its file: leave now. A
            # normal exit would first wait for threads and pools still at work (a compile pool runs its queue to the
            # end), which a scheduler's or `timeout`'s SIGTERM should not have to wait for.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except CliError as e:
        print(f"vlaperf {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vlaperf {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.filename is None:  # not a file's error: a bug to see whole
            raise
        print(f"vlaperf {args.command}: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:
        # a lever that fails only when it runs (kernels that do not fit this GPU or dtype) inside a command that does
        # not catch it itself (check, matrix, scaling, ...): its message names the lever and the way out. The module is
        # loaded by every command that builds an engine (report and diff never load it, nor torch)
        levers = sys.modules.get("vlaperf.engine.levers")
        if levers is None or not isinstance(e, levers.LeverError):
            raise
        print(f"vlaperf {args.command}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if not is_out_of_memory(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"vlaperf {args.command}: error: out of memory ({first[:200]}); try a smaller --batch, "
              "--max-batch or workload", file=sys.stderr)
        return 2


def refuse_unknown_options(command_parser: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Arguments the command does not take: its own usage and error (exit 2), with the nearest of its options where
    one is near. argparse's own said `vlaperf: error: unrecognized arguments: --batch 2` for `serve --batch 2`,
    naming neither the command nor its `--max-batch`."""
    import difflib

    options = [s for action in command_parser._actions for s in action.option_strings if s.startswith("--")]
    hints = []
    for arg in unknown:
        name = arg.partition("=")[0]
        if name.startswith("--"):
            near = ["--" + o for o in difflib.get_close_matches(name[2:], [o[2:] for o in options], n=1, cutoff=0.75)]
            near = near or [o for o in options if len(name) > 3 and name[2:] in o]  # --batch -> --max-batch
            if near:
                hints.append(f"{name}: did you mean {near[0]}?")
    command_parser.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else ""))


def resolve_hub_paths(args) -> None:
    """--checkpoint, --norm-stats, --tokenizer and convert's IN given as a Hugging Face Hub repo (`lerobot/pi0_libero`,
    `hf://owner/name@revision/path`): fetched into the Hub's cache and replaced by the local path (vlaperf.hub), after
    the checks that need no download (check_before_download)."""
    from vlaperf.hub import PATH_OPTIONS, HubError, is_reference, resolve_args

    if not any(is_reference(getattr(args, attr, None)) for attr, _ in PATH_OPTIONS):
        return
    check_before_download(args)
    try:
        resolve_args(args)
    except HubError as e:
        raise CliError(str(e)) from None


# the commands whose --levers is one variant (the others take ';' lists, 'all', 'cumulative', ...: their own checks)
ONE_VARIANT_COMMANDS = ("bench", "breakdown", "syncs", "doctor", "serve")


def check_before_download(args) -> None:
    """What the command would refuse anyway, refused before a Hub repo is fetched: pi0's model.safetensors is 7 GB,
    which came down first and only then was a misspelt workload or lever named, or a GPU this machine lacks."""
    import torch

    from vlaperf.workloads import WAM_WORKLOADS, get_workload

    workload = getattr(args, "workload", None)
    if workload is not None and workload not in WAM_WORKLOADS:
        try:
            get_workload(workload)
        except ValueError as e:
            raise CliError(str(e)) from None
    if args.command == "convert":  # files in, files out: what it would refuse about OUT, and a JAX folder on the Hub
        from vlaperf.checkpoints import CheckpointError, output_file
        from vlaperf.compare.convert import refuse_existing

        if args.from_layout == "openpi-jax":
            raise CliError("IN: an openpi JAX checkpoint is a folder (params/ and assets/), which is not fetched from "
                           "the Hub: download it and give its path")
        try:
            refuse_existing(output_file(args.dst), args.force)
        except CheckpointError as e:
            raise CliError(str(e)) from None
        return
    if args.command in ("compare", "lerobot-eval"):  # LeRobot's absence is said before its weights are fetched
        from vlaperf.compare.lerobot import LeRobotUnavailable, import_lerobot

        try:
            import_lerobot(pi05=False)
        except LeRobotUnavailable as e:
            raise CliError(str(e)) from None
    if not hasattr(args, "device"):
        return
    device = requested_device(args)
    levers = getattr(args, "levers", None)
    # serve's default "serve" becomes graph or exact once its device is known
    if args.command in ONE_VARIANT_COMMANDS and isinstance(levers, str) and levers != "serve" \
            and workload not in WAM_WORKLOADS:
        from vlaperf.engine.levers import Levers, LeverError

        dtype = getattr(torch, args.dtype) if getattr(args, "dtype", None) else None
        try:
            Levers.parse(levers, device, dtype).check(device)
        except LeverError as e:
            raise CliError(str(e)) from None


def is_out_of_memory(e: BaseException) -> bool:
    """A failed allocation: torch.OutOfMemoryError on a GPU, the CPU allocator's RuntimeError on the host."""
    torch = sys.modules.get("torch")  # not imported (report, diff): no torch allocation failed
    return (torch is not None and isinstance(e, torch.OutOfMemoryError)) or "can't allocate memory" in str(e)


if __name__ == "__main__":
    # `python -m vlaperf.cli` runs this file as __main__, a second copy of the module: the
    # subcommands raise vlaperf.cli.CliError, which __main__.main would not catch.
    from vlaperf.cli import main as package_main

    sys.exit(package_main())
