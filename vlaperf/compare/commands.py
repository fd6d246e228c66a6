"""CLI subcommands `compare`, `convert` and `lerobot-eval`; `register(subparsers)` adds them.

    vlaperf compare --workload libero-pi0 --against lerobot [--device cuda] [--dtype bfloat16]
                    [--warmup 10] [--iters 50] [--accelerate [--rtc]] [--json out.json]
    vlaperf convert --from lerobot --to openpi --preset pi0 IN OUT
    vlaperf lerobot-eval [--levers best] -- <lerobot-eval's own arguments>

Exit codes as the other commands: 0 ok; 1 vlaperf's actions are not equivalent to the
peer's (timing is then not reported), or, with --accelerate, LeRobot's policy with vlaperf installed is not
equivalent to LeRobot's own or the accelerator's check refused to answer (the --json file is written in each
case, the failure recorded in it); 2 bad arguments or setup, LeRobot missing included.
Nothing here imports LeRobot until `compare` runs.
"""

from __future__ import annotations

import argparse
import sys

import torch

from vlaperf.cli import (CliError, add_compile_cache, device_arg, output_file, path_arg, positive_int, seed_int,
                         setup_device, steps_int, wide_console)

COMPARE_WORKLOADS = ("libero-pi0", "libero-pi05", "aloha-pi0", "libero-pi0-b4", "libero-pi0-b8", "libero-shallow6", "tiny")


def register(subparsers) -> None:
    """Add `compare` and `convert` to vlaperf's subparsers."""
    from vlaperf.compare.convert import LAYOUTS, SOURCES
    from vlaperf.engine.levers import COMPILE_MODES
    from vlaperf.models.pi0 import PRESETS

    p = subparsers.add_parser("compare", help="same weights and inputs in vlaperf and LeRobot: equivalence and speed")
    p.add_argument("--workload", default=None, choices=COMPARE_WORKLOADS,
                   help="default: libero-pi0 on a GPU, tiny on the CPU; tiny and libero-shallow6 build a reduced LeRobot model")
    p.add_argument("--against", choices=("lerobot",), default="lerobot",
                   help="the peer, the only one so far (openpi: use vlaperf.compare.openpi from Python with your "
                        "openpi model) (default: lerobot)")
    p.add_argument("--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--steps", type=steps_int, default=None, help="denoise steps, 1..1000 (default: the workload's)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random weights and inputs (default: 0)")
    p.add_argument("--checkpoint", type=path_arg, default=None,
                   help="compare on these weights, loaded into both models: openpi or LeRobot model.safetensors, an "
                        "openpi JAX checkpoint folder or a Hugging Face Hub repo (lerobot/pi0_libero), of the "
                        "workload's model at full size (default: random weights)")
    p.add_argument("--levers", default="best", help="vlaperf variant timed besides the reference ('best', a comma list, or 'reference'; "
                   "default: best)")
    p.add_argument("--reduced", action="store_true",
                   help="build LeRobot (and vlaperf) at a reduced size (see vlaperf.compare.lerobot.Reduced); CPU-friendly")
    p.add_argument("--lerobot-compile", default="max-autotune", choices=(*COMPILE_MODES, "none"),
                   help="also time LeRobot compiled as its compile_model=True does, with this compile_mode (default: "
                        "LeRobot's own default, max-autotune); 'none' to skip")
    p.add_argument("--no-timing", action="store_true", help="equivalence only")
    p.add_argument("--accelerate", action="store_true",
                   help="also time LeRobot's own predict_action_chunk (its image pre-processing included), as shipped "
                        "and with vlaperf's --levers engine installed in the policy by accelerate_lerobot")
    p.add_argument("--rtc", action="store_true",
                   help="with --accelerate: the same two again with LeRobot's real-time chunking on and a previous "
                        "chunk's leftover given (LeRobot's RTCConfig defaults)")
    # not rounds_warmup_help: each path's first call (compile, capture) is made before the timing, by the comparison
    # or a predict row's set-up, and is the row's first call s; these calls all come after it
    p.add_argument("--warmup", type=positive_int, default=10,
                   help="untimed calls of each timed path before the rounds, after the path's first call in the "
                        "process (compile, capture: the comparison's call, LeRobot's compile, or a predict row's "
                        "set-up call), which is the row's first call s; at least 1, so that no round holds a first "
                        "call (default: 10)")
    p.add_argument("--iters", type=positive_int, default=50,
                   help="interleaved rounds, one timed call of each path a round (default: 50)")
    p.add_argument("--json", type=output_file, default=None, help="write the result file here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compile_cache(p)  # LeRobot's max-autotune compile and best's compile both land there
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser("lerobot-eval", help="LeRobot's own lerobot-eval, its pi0 / pi0.5 policy sampling with "
                              "vlaperf's engine (accelerate_lerobot)")
    p.add_argument("--levers", default="best", help="vlaperf's engine variant ('best', 'graph', 'exact' or a comma "
                   "list; default: best)")
    p.add_argument("--no-check", action="store_true",
                   help="do not check each new input shape's first call against LeRobot's own sample_actions")
    p.add_argument("lerobot_args", nargs=argparse.REMAINDER,
                   help="after `--`: lerobot-eval's own arguments, e.g. -- --policy.path=lerobot/pi0_libero "
                        "--env.type=libero --env.task=libero_10 --eval.n_episodes=10 --eval.batch_size=1")
    p.set_defaults(func=cmd_lerobot_eval)

    p = subparsers.add_parser("convert", help="convert a model.safetensors between openpi's and LeRobot's layouts, or "
                                             "an openpi JAX checkpoint to either (strict)")
    p.add_argument("--from", dest="from_layout", required=True, choices=SOURCES,
                   help="layout of IN (openpi-jax: openpi's orbax checkpoint folder, or its params/; needs tensorstore)")
    p.add_argument("--to", dest="to_layout", required=True, choices=LAYOUTS, help="layout to write")
    p.add_argument("--preset", required=True, choices=tuple(PRESETS), help="model preset the file must match exactly")
    p.add_argument("src", metavar="IN", help="model.safetensors, a folder holding one, or a Hub repo holding one "
                                             "(lerobot/pi0_libero, hf://owner/name@revision) (openpi-jax: the checkpoint "
                                             "folder holding params/)")
    p.add_argument("dst", metavar="OUT", help="a .safetensors path, or a folder (gets model.safetensors)")
    p.add_argument("--force", action="store_true", help="replace OUT's file if it exists (never the input)")
    p.set_defaults(func=cmd_convert)


# ------------------------------------------------------------------------ convert


def cmd_convert(args) -> int:
    from vlaperf.checkpoints import CheckpointError
    from vlaperf.compare.convert import convert_checkpoint

    try:
        report = convert_checkpoint(args.src, args.dst, args.from_layout, args.to_layout, args.preset,
                                    overwrite=args.force)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    print(f"converted {report['src']} ({report['from']}, {report['tensors_in']} tensors) -> {report['dst']} "
          f"({report['to']}, {report['tensors_out']} tensors, {'/'.join(report['dtypes'])}, preset {report['preset']})")
    for old, new in report["renamed"]:
        print(f"  renamed {old} -> {new}")
    for name in report.get("filled", []):
        print(f"  {name}: not in openpi's JAX model (inference never reads it): written as zeros")
    if report["lm_head_differed"]:
        print(f"  note: the file held both the token embedding and the LM head with different values; the embedding "
              f"({report['embedding_from']}) was kept, as LeRobot's loader does (inference never reads the LM head)")
    return 0


# ------------------------------------------------------------------------ compare


def cmd_compare(args) -> int:
    from vlaperf.checkpoints import CheckpointError, check_readable
    from vlaperf.compare.lerobot import LeRobotUnavailable, compare_lerobot, import_lerobot, time_lerobot
    from vlaperf.models.pi0 import default_dtype
    from vlaperf.workloads import get_workload

    if args.rtc and not args.accelerate:
        raise CliError("--rtc times LeRobot's real-time chunking in its predict_action_chunk: it needs --accelerate")
    if args.accelerate and (args.no_timing or args.levers in ("reference", "none", "")):
        raise CliError("--accelerate times LeRobot's policy with vlaperf's engine installed: it needs the timing (not "
                       "--no-timing) and an engine (--levers other than reference)")
    device = setup_device(args)
    if args.levers not in ("reference", "none", ""):
        # a typo, or a lever this device cannot run, refused now: the engine that would refuse it is built only after
        # LeRobot's model and vlaperf's (tens of seconds at full size)
        from vlaperf.engine import LeverError, Levers

        try:
            Levers.parse(args.levers, device).check(device)
        except LeverError as e:
            raise CliError(f"--levers {args.levers!r}: {e}") from None
    workload_id = args.workload or ("libero-pi0" if device.type == "cuda" else "tiny")
    base = get_workload(workload_id)
    workload = base.with_overrides(steps=args.steps)
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype(device)
    reduced = args.reduced or workload.preset not in ("pi0", "pi05")
    if device.type == "cpu" and not reduced:
        print(f"vlaperf compare: note: {workload.id} at full size on the CPU holds two 3.5B-parameter models (~32 GB in "
              "float32) and takes minutes per call; --reduced builds a small one", file=sys.stderr)
    if args.checkpoint:  # a wrong path is named before LeRobot is imported and two models are built
        try:
            check_readable(args.checkpoint)
        except CheckpointError as e:
            raise CliError(f"--checkpoint: {e}") from None
    try:
        import_lerobot(pi05=workload.preset == "pi05")
    except LeRobotUnavailable as e:
        raise CliError(str(e)) from None
    try:
        run = compare_lerobot(workload, device=device, dtype=dtype, seed=args.seed, reduced=reduced, levers=args.levers,
                              checkpoint=args.checkpoint)
    except CheckpointError as e:
        hint = (f"\n({workload.id} is compared at a reduced size, which no released checkpoint has: a full-size "
                "workload without --reduced takes one)") if reduced else ""
        raise CliError(f"--checkpoint: {e}{hint}") from None
    except ValueError as e:  # bad levers, a size LeRobot cannot build
        raise CliError(str(e)) from None
    compared = {k: v for k, v in run.result.items() if k != "actions"}
    timing = None
    if run.result["passed"] and not args.no_timing:
        mode = None if args.lerobot_compile == "none" else args.lerobot_compile
        # the accelerator's own check refusing to answer is not raised: time_lerobot times the other rows and records
        # the refusal in timing["accelerated"]["refused"], so that --json's file says what was measured and why the
        # accelerated row is missing; the exit status below is 1 as for any other failure
        try:
            timing = time_lerobot(run, warmup=args.warmup, iters=args.iters, lerobot_compile=mode,
                                  progress=not args.no_progress, accelerated=args.accelerate, rtc=args.rtc)
        except ValueError as e:  # a workload whose empty cameras LeRobot's predict_action_chunk cannot place
            raise CliError(f"--accelerate: {e}") from None
    print_compare(compared, timing, workload.id)
    if args.json:
        _write_json(args.json, base, workload, run, compared, timing, device)
        print(f"wrote {args.json}")
    accelerated = (timing or {}).get("accelerated") or {}
    failed = False  # each accelerated failure is said: a plain row's distance and the guided row's refusal can both be
    for flag, m in (("--accelerate", accelerated.get("vs_lerobot_predict")),
                    ("--rtc", (accelerated.get("rtc") or {}).get("vs_lerobot_predict_rtc"))):
        if m and not m["passed"]:
            print(f"vlaperf compare: {flag}: LeRobot's predict_action_chunk with vlaperf installed is not equivalent "
                  f"to LeRobot's own: rel_l2 {m['rel_l2']:.3g} > {m['tolerance']:.3g}", file=sys.stderr)
            failed = True
    if accelerated.get("refused"):  # the accelerator's own check refused to answer (NotEquivalent)
        print(f"vlaperf compare: --accelerate: {accelerated['refused']['message']}", file=sys.stderr)
        failed = True
    if failed:
        return 1
    if not run.result["passed"]:
        worst = max(compared["equivalence"].items(), key=lambda kv: kv[1]["rel_l2"] if kv[1]["rel_l2"] == kv[1]["rel_l2"] else float("inf"))
        print(f"vlaperf compare: vlaperf ({worst[0]}) is not equivalent to LeRobot: rel_l2 {worst[1]['rel_l2']:.3g} > "
              f"{worst[1]['tolerance']:.3g}; timing not reported", file=sys.stderr)
        return 1
    return 0


def cmd_lerobot_eval(args) -> int:
    from vlaperf.compare.accelerate import NotEquivalent, run_lerobot_eval
    from vlaperf.compare.lerobot import LeRobotUnavailable
    from vlaperf.engine.compile import CompileUnavailable

    extra = args.lerobot_args[1:] if args.lerobot_args[:1] == ["--"] else args.lerobot_args
    if not extra:
        raise CliError("give lerobot-eval's own arguments after `--`, e.g. vlaperf lerobot-eval -- "
                       "--policy.path=lerobot/pi0_libero --env.type=libero --env.task=libero_10")
    try:
        made = run_lerobot_eval(extra, args.levers, check=not args.no_check)
    except NotEquivalent as e:
        print(f"vlaperf lerobot-eval: {e}", file=sys.stderr)
        return 1
    except (LeRobotUnavailable, CompileUnavailable, ValueError) as e:  # ValueError: bad levers (LeverError), a policy
        raise CliError(str(e)) from None  # vlaperf does not accelerate, or one it cannot build
    for fast in made:
        checks = "; ".join(f"batch {c['batch']}, cameras {c['images_valid']}, prompt {c['prompt_len']}: rel L2 "
                           f"{c['rel_l2']:.3g} ({'passed' if c['passed'] else 'FAILED'})" for c in fast.checks)
        print(f"vlaperf lerobot-eval: {type(fast.policy).__name__} sampled with vlaperf ({fast.levers}); its checks "
              f"against LeRobot: {checks or 'none (--no-check, or no call)'}")
    return 0


def _write_json(path, base, workload, run, compared, timing, device) -> None:
    from vlaperf.cli import result_header
    from vlaperf.report.schema import write_result
    from vlaperf.timing import environment_record

    levers = run.engine.levers.names() if run.engine is not None else []
    label = run.engine.name if run.engine is not None else "reference"
    result = result_header("compare", base, workload, run.model, environment_record(device), levers, label, "model")
    result["compare"] = compared
    result["timing"] = timing
    write_result(result, path)


def print_compare(compared: dict, timing: dict | None, workload_id: str) -> None:
    from rich.table import Table

    console = wide_console()
    t = Table(title=f"vlaperf compare  {workload_id}  vs LeRobot {compared.get('lerobot_version') or '(version unknown)'}  "
              f"({compared['model']}, {compared['dtype']}, {compared['device']}, {compared['steps']} steps)")
    for col in ("vlaperf variant", "max abs", "rel L2", "worst dim (rel L2)", "tolerance", "passed"):
        t.add_column(col)
    for name, m in compared["equivalence"].items():
        worst = m["worst_dim"]
        worst_txt = f"{worst} ({m['per_dim']['rel_l2'][worst]:.3g})" if worst is not None else "-"
        t.add_row(name, f"{m['max_abs']:.3g}", f"{m['rel_l2']:.3g}", worst_txt, f"{m['tolerance']:.0e}", "yes" if m["passed"] else "NO")
    console.print(t)
    console.print("as shipped: " + "; ".join(compared["as_shipped"]))
    if timing is None:
        return
    t = Table(title="latency, interleaved in one process (speedup > 1 = faster than LeRobot eager)")
    for col in ("variant", "wall median ms", "event median ms", "speedup (wall)", "speedup (event)", "first call s"):
        t.add_column(col)
    for name, s in timing["summary"].items():
        ev = s["cuda_event_ms_median"]
        sp_ev = s["speedup_vs_lerobot_event"]
        t.add_row(name, f"{s['wall_ms_median']:.2f}", f"{ev:.2f}" if ev is not None else "-",
                  f"{s['speedup_vs_lerobot_wall']:.2f}x" + ("" if s["significant"] or name == "lerobot" else " (n.s.)"),
                  f"{sp_ev:.2f}x" if sp_ev is not None else "-", f"{s['first_call_s']:.2f}")
    console.print(t)
    if timing.get("settled"):  # files before session 49 timed every row as it came in the round
        console.print(f"settled (each timed call right after an untimed call of its own, not after an eager row): "
                      f"{', '.join(timing['settled'])}")
    acc = timing.get("accelerated")
    if acc:
        from vlaperf.report.render import describe_refusal, describe_rtc

        m, core = acc.get("vs_lerobot_predict"), acc["vs_lerobot_core"]
        checks = "; ".join(f"rel L2 {c['rel_l2']:.3g} ({'passed' if c['passed'] else 'FAILED'})" for c in acc["checks"])
        if m is None:  # the accelerator refused the plain accelerated row: nothing of it to compare or time
            said = f"its check against LeRobot: {checks}"
        else:
            said = (f"rel L2 {m['rel_l2']:.3g} from LeRobot's own (tolerance {m['tolerance']:.0e}); its check against "
                    f"LeRobot: {checks}; first call {acc['first_call_s']['vlaperf_in_lerobot_predict']:.2f} s, check "
                    f"included")
        console.print(f"LeRobot's predict_action_chunk with vlaperf ({acc['levers']}) installed: {said}. LeRobot's "
                      f"predict against its core on the same observation: rel L2 {core['rel_l2']:.3g}")
        if acc.get("rtc"):
            console.print(f"With {describe_rtc(acc['rtc'])}")
        if acc.get("refused"):
            console.print(describe_refusal(acc["refused"]))
    from vlaperf.report.render import describe_lerobot_compile

    compiled_note = describe_lerobot_compile(timing["lerobot_compile"])
    if compiled_note:
        console.print(compiled_note)


__all__ = ["register", "cmd_compare", "cmd_convert", "cmd_lerobot_eval"]
