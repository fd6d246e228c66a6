"""CLI subcommands `serve`, `loadgen` and `rollout`; `register(subparsers)` adds them.

    vlaperf serve    --workload libero-pi0 --levers serve --port 8000 [--api-key KEY]
    vlaperf serve    --replicas 2 [--ray-address auto]      (Ray Serve replicas; docs/scale-out.md)
    vlaperf loadgen  --url ws://127.0.0.1:8000 --clients 1,4,8 --requests 20 --json out.json
    vlaperf rollout  --url ws://127.0.0.1:8000 --episodes 3 --control-hz 10 --replan-every 5

Exit codes as the other commands: 0 ok, 1 a check failed (equivalence before serving,
errors or lost replies under load), 2 bad arguments or setup.
Nothing here imports websockets until a command runs, so `vlaperf --help` works without the
`serve` extra.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vlaperf.cli import MAX_BATCH, add_action_horizon, add_compile_cache, add_conventions, batch_int, device_arg, number_arg
from vlaperf.cli import levers_arg, output_file, path_arg, port_int, seed_int, steps_int, wide_console, workload_arg
from vlaperf.cli import non_negative_float as _non_negative_float
from vlaperf.cli import positive_float as _positive_float
from vlaperf.cli import positive_int as _positive_int
from vlaperf.models.pi0 import RTC_SCHEDULES

API_KEY_ENV = "VLAPERF_API_KEY"


def _check_port_free(host: str, port: int) -> None:
    """A port another process holds, or a host that does not resolve to this machine, is refused now, not after
    the model's build, check and warm-up. (A process could still take the port in between; the server's own
    bind then reports it, later.)"""
    import socket

    from vlaperf.cli import CliError

    try:  # port 0 too: an address that does not resolve, or is not this machine's, is refused as early
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise CliError(f"--host {host!r}: cannot resolve it ({e.strerror or e})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no clash
        try:
            probe.bind(addr)
        except OSError as e:
            raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


# a camera image's side as the server takes it (vlaperf.inputs: 4..4096 pixels)
_image_side = number_arg(int, 4, maximum=4096)
# loadgen's bounds, checked as the options are parsed so that an error names the option, not run_loadgen's
# parameter: vlaperf.serve.loadgen's MAX_CLIENTS, MAX_REQUESTS, MAX_TIMEOUT_S and MAX_WARMUP (not imported: that
# module imports websockets, and `vlaperf --help` works without it; a test keeps the two sets equal)
LOADGEN_MAX_CLIENTS, LOADGEN_MAX_REQUESTS, LOADGEN_MAX_TIMEOUT_S, LOADGEN_MAX_WARMUP = 256, 10_000, 3600.0, 100
_requests_int = number_arg(int, 1, maximum=LOADGEN_MAX_REQUESTS)
_warmup_int = number_arg(int, 0, maximum=LOADGEN_MAX_WARMUP)
_phase_timeout_s = number_arg(float, 0, strict=True, maximum=LOADGEN_MAX_TIMEOUT_S)
# rollout's, as loadgen's: vlaperf.serve.rollout's MAX_EPISODES, MAX_STEPS, MAX_CONTROL_HZ and MAX_TIMEOUT_S
ROLLOUT_MAX_EPISODES, ROLLOUT_MAX_STEPS, ROLLOUT_MAX_CONTROL_HZ, ROLLOUT_MAX_TIMEOUT_S = 1000, 100_000, 1000.0, 86400.0
_episodes_int = number_arg(int, 1, maximum=ROLLOUT_MAX_EPISODES)
_episode_steps_int = number_arg(int, 1, maximum=ROLLOUT_MAX_STEPS)
_control_hz = number_arg(float, 0, strict=True, maximum=ROLLOUT_MAX_CONTROL_HZ)
_rollout_timeout_s = number_arg(float, 0, strict=True, maximum=ROLLOUT_MAX_TIMEOUT_S)
ROLLOUT_MAX_BACK_TO_BACK = 10_000  # vlaperf.serve.rollout's MAX_BACK_TO_BACK
_back_to_back_int = number_arg(int, 0, maximum=ROLLOUT_MAX_BACK_TO_BACK)
ROLLOUT_MAX_CLIENT_KEEP_WARM_MS = 1000.0  # vlaperf.serve.rollout's MAX_CLIENT_KEEP_WARM_MS
_client_keep_warm_ms = number_arg(float, 0, strict=True, maximum=ROLLOUT_MAX_CLIENT_KEEP_WARM_MS)
# serve's message limit in MiB, as the parser checks it: vlaperf.serve.protocol's MIN_MESSAGE_BYTES and
# MAX_MESSAGE_BYTES (not imported: protocol imports msgpack; a test keeps them equal). Below 1 KiB the server refused
# the value only after the model's build, naming its max_message_bytes ("got 104" for --max-message-mb 0.0001).
SERVE_MIN_MESSAGE_MB, SERVE_MAX_MESSAGE_MB = 1 / 1024, 4096
# --max-message-mb: 1 KiB to 4 GiB, in MiB (cmd_serve passes int(value * 2**20) bytes on)
_message_mb = number_arg(float, SERVE_MIN_MESSAGE_MB, maximum=SERVE_MAX_MESSAGE_MB, note="MiB: 1 KiB to 4 GiB")
# --max-queue: at least one list request of PolicyServer's max_list_items (64) observations
_queue_size = number_arg(int, 64, note="one list request holds up to 64 observations")


def _int_list(text: str) -> list[int]:
    try:  # an empty entry ('1,,4', '4,') is refused as scaling's --steps refuses it
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,4,8; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _client_list(text: str) -> list[int]:
    values = _int_list(text)
    if any(v > LOADGEN_MAX_CLIENTS for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated client counts in 1..{LOADGEN_MAX_CLIENTS}, got {text!r}")
    return values


def _add_client_options(p) -> None:
    """What loadgen and rollout share as clients of a running server: where it is, its key, what to send, the file."""
    p.add_argument("--url", default="ws://127.0.0.1:8000", help="the server's websocket URL, on loopback only "
                   "(127.0.0.0/8, ::1, localhost; default: ws://127.0.0.1:8000)")
    p.add_argument("--api-key", default=None,
                   help=f"the server's key, sent as 'Authorization: Api-Key <key>' (default: ${API_KEY_ENV} if set)")
    p.add_argument("--workload", type=workload_arg, default=None, help="the workload whose observations are sent, which "
                   "must be the served one (default: the one the server reports)")
    p.add_argument("--image-size", type=_image_side, default=224, help="side of the camera images sent, 4..4096 (default: 224)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the synthetic observations sent, recorded in the "
                   "result (default: 0)")
    p.add_argument("--json", type=output_file, default=None, help="write the result file here")


def register(subparsers) -> None:
    """Add `serve`, `loadgen` and `rollout` to vlaperf's subparsers."""
    p = subparsers.add_parser("serve", help="serve a policy over websockets (openpi-client compatible)")
    p.add_argument("--workload", type=workload_arg, default=None,
                   help="workload id, as `vlaperf workloads` lists them (default: libero-pi0 on a GPU, tiny on the CPU)")
    p.add_argument("--levers", type=levers_arg, default="serve",
                   help="'serve' (default: 'graph' on a GPU, 'exact' on the CPU: no compile, so every batch size "
                        "and prompt bucket warms up in seconds), 'best', 'reference' or a comma list (`vlaperf levers`)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only; another "
                   "address needs --api-key or --allow-unauthenticated)")
    p.add_argument("--port", type=port_int, default=8000, help="port, 0 for any free one (default: 8000)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Api-Key <key>' (default: ${API_KEY_ENV} if set, else no auth)")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="allow a non-loopback --host without an API key (trusted networks only)")
    p.add_argument("--max-batch", type=batch_int, default=8,
                   help=f"most observations stacked into one policy call, 1..{MAX_BATCH} (default: 8)")
    p.add_argument("--max-wait-ms", type=_non_negative_float, default=5.0,
                   help="longest a request waits for others to batch with (0 = never wait; default: 5)")
    p.add_argument("--max-message-mb", type=_message_mb, default=16.0,
                   help="largest accepted message (MiB, 1/1024 to 4096; default: 16)")
    p.add_argument("--max-connections", type=_positive_int, default=256,
                   help="open connections at once; one more gets HTTP 503 at its handshake (default: 256)")
    p.add_argument("--idle-timeout-s", type=_positive_float, default=None,
                   help="close a connection that sends no request for this long, so clients that connect and go quiet "
                        "cannot hold every --max-connections place (default: never; openpi's client does not "
                        "reconnect, so set it above a robot's longest pause)")
    p.add_argument("--max-queue", type=_queue_size, default=256,
                   help="observations that may wait for the model at once, from all clients; a request past it gets "
                        "an Overloaded error frame (default: 256, at least the 64 of one list request)")
    p.add_argument("--keep-warm-ms", type=number_arg(float, 0, strict=True, maximum=1000), default=None,
                   help="while no request waits, rerun the last request's host stages (transform, upload, preprocess; "
                        "no model call) every this many ms, for up to 10 s after it: a robot's next call after an "
                        "idle then finds them warm (docs/serving.md; default: off)")
    p.add_argument("--no-keep-warm-quiet", action="store_true",
                   help="with --keep-warm-ms: run on the period even where a steady client's next request is due "
                        "(by default the runs stand aside there, so that the request does not wait for one)")
    p.add_argument("--warmup-batches", default="1,max",
                   help="batch sizes to warm up before listening: comma list, 'max' = --max-batch, 'all' = 1..max, "
                        "'none' = listen at once (each size's first request then pays its compile or capture) "
                        "(default: 1,max)")
    p.add_argument("--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--steps", type=steps_int, default=None, help="denoise steps, 1..1000 (default: the workload's)")
    add_action_horizon(p, conventions=True)
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random weights (default: 0)")
    p.add_argument("--checkpoint", type=path_arg, default=None, help="openpi or LeRobot model.safetensors, or an openpi JAX checkpoint "
                   "folder (orbax params/; needs tensorstore), or a Hugging Face Hub repo: lerobot/pi0_libero, "
                   "hf://owner/name@revision (vlaperf[hub]) (default: random weights)")
    p.add_argument("--tokenizer", type=path_arg, default=None,
                   help="PaliGemma's sentencepiece model (paligemma_tokenizer.model; needs sentencepiece) for a real "
                        "checkpoint, or a Hub repo holding tokenizer.model (hf://owner/name/path for another file) "
                        "(default: a deterministic stand-in whose ids mean nothing to a trained model)")
    p.add_argument("--norm-stats", type=path_arg, default=None,
                   help="the checkpoint's statistics: openpi's norm_stats.json or LeRobot's normalizer safetensors (or "
                        "a folder holding one, or a LeRobot checkpoint's Hub repo): the state is normalized, the "
                        "actions unnormalized, z-score for pi0 and quantiles for pi0.5 (default: none, the model's own "
                        "units)")
    add_conventions(p)
    p.add_argument("--no-check", action="store_true", help="skip the equivalence check of the engine before serving")
    p.add_argument("--sparsity", choices=("none", "drop_middle", "mae_middle"), default=None,
                   help="world-action workloads: frame sparsity of the served model (default: the workload's)")
    p.add_argument("--video-steps", type=_positive_int, default=None, help="world-action workloads: the video's denoise steps, 1..--steps "
                   "(default: the workload's, scaled with --steps)")
    p.add_argument("--cfg-scale", type=_non_negative_float, default=None, help="world-action workloads: classifier-free "
                   "guidance scale, 0..100 (0: off; > 0 doubles the batch; default: the workload's)")
    p.add_argument("--keep-reference", action="store_true",
                   help="keep the reference model's weights that the engine holds fused copies of (by default they are "
                        "freed after the check: 3.2 GB for pi0 in bf16, 3.4 GB with megakernel)")
    g = p.add_argument_group("real-time chunking (pi0 family; docs/serving.md)")
    g.add_argument("--rtc", action="store_true",
                   help="guide each chunk toward what is left of the connection's previous one, for observations that "
                        "send 'rtc/executed' and 'rtc/delay' (LeRobot's RTC, in the engine's graph)")
    g.add_argument("--rtc-execution-horizon", type=_positive_int, default=None,
                   help="with --rtc: chunk positions past it are not held to the previous chunk (default: 10)")
    g.add_argument("--rtc-max-guidance-weight", type=number_arg(float, 0, strict=True, maximum=1e6), default=None,
                   help="with --rtc: the largest per-step guidance weight (default: 10)")
    g.add_argument("--rtc-schedule", choices=RTC_SCHEDULES, default=None,
                   help="with --rtc: how the hold fades from the delay to the execution horizon (default: linear)")
    _add_replica_arguments(p)
    add_compile_cache(p)
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser("loadgen", help="closed-loop load test of a running policy server (loopback)")
    _add_client_options(p)
    p.add_argument("--clients", type=_client_list, default=[1, 4, 8],
                   help=f"concurrent clients per phase, 1..{LOADGEN_MAX_CLIENTS} each (default: 1,4,8)")
    p.add_argument("--requests", type=_requests_int, default=20, help=f"timed requests per client, 1..{LOADGEN_MAX_REQUESTS} (default: 20)")
    p.add_argument("--warmup", type=_warmup_int, default=1,
                   help=f"untimed requests per client first, 0..{LOADGEN_MAX_WARMUP} (default: 1)")
    p.add_argument("--timeout-s", type=_phase_timeout_s, default=120.0,
                   help=f"time limit per phase, seconds, at most {LOADGEN_MAX_TIMEOUT_S:g} (default: 120)")
    p.set_defaults(func=cmd_loadgen)

    p = subparsers.add_parser("rollout", help="control-loop timing against a running server (synthetic observations)")
    _add_client_options(p)
    p.add_argument("--episodes", type=_episodes_int, default=3,
                   help=f"episodes, 1..{ROLLOUT_MAX_EPISODES} (default: 3)")
    p.add_argument("--steps-per-episode", type=_episode_steps_int, default=50,
                   help=f"control steps an episode, 1..{ROLLOUT_MAX_STEPS} (default: 50)")
    p.add_argument("--control-hz", type=_control_hz, default=10.0,
                   help=f"the control loop's rate, steps a second, at most {ROLLOUT_MAX_CONTROL_HZ:g} (default: 10)")
    p.add_argument("--replan-every", type=_positive_int, default=None,
                   help="actions of each chunk executed before the next call, at most the served action horizon "
                        "(default: 5, or that horizon if shorter)")
    p.add_argument("--timeout-s", type=_rollout_timeout_s, default=600.0,
                   help=f"time limit of the whole run, seconds, at most {ROLLOUT_MAX_TIMEOUT_S:g} (default: 600)")
    p.add_argument("--async", dest="async_execution", action="store_true",
                   help="execute the chunk while the next one is computed, waiting only where it runs out (default: "
                        "wait for each chunk, as openpi's synchronous runtime)")
    p.add_argument("--rtc", action="store_true",
                   help="--async, asking a `vlaperf serve --rtc` server for real-time chunking: each request says how "
                        "much of the running chunk was executed and the delay expected, and the chunks join smoothly")
    p.add_argument("--back-to-back", type=_back_to_back_int, default=10, metavar="N",
                   help="after each episode, N calls in a closed loop (after one untimed call), the baseline that "
                        "says what the control loop's idle between calls costs each call; 0 for none, at most "
                        f"{ROLLOUT_MAX_BACK_TO_BACK} (default: 10)")
    p.add_argument("--client-keep-warm-ms", type=_client_keep_warm_ms, default=None, metavar="MS",
                   help="the client pings the server every MS ms while no call is in flight, keeping the request's "
                        "way to the server warm through the loop's idle (vlaperf's Client(keep_warm_ms=); "
                        f"at most {ROLLOUT_MAX_CLIENT_KEEP_WARM_MS:g}; default: off)")
    p.set_defaults(func=cmd_rollout)


def _add_replica_arguments(p) -> None:
    """`serve --replicas N` and its options: scale-out on Ray Serve (vlaperf.serve.ray_backend)."""
    g = p.add_argument_group("scale-out on Ray Serve (pip install 'vlaperf[ray]'; docs/scale-out.md)")
    g.add_argument("--replicas", type=_positive_int, default=None,
                   help="run N engine replicas as a Ray Serve deployment (one GPU each; N CPU processes on the CPU) "
                        "behind this one websocket front end (default: no Ray, the model runs in this process)")
    g.add_argument("--ray-address", default=None,
                   help="Ray cluster to use: 'auto' (the one `ray start` runs on this node), 'HOST:6379' or "
                        "'ray://HOST:10001' (default: $RAY_ADDRESS if set, else a private local Ray on 127.0.0.1)")
    g.add_argument("--replica-timeout-s", type=_positive_float, default=None,
                   help=f"longest one batch may take on a replica before its requests get an error frame (default: "
                        f"{REPLICA_DEFAULTS['replica_timeout_s']:g})")
    g.add_argument("--replica-cpus", type=_positive_float, default=None,
                   help=f"CPUs reserved per replica (default: {REPLICA_DEFAULTS['replica_cpus']:g})")
    g.add_argument("--ray-app-name", default=None,
                   help=f"Ray Serve application name, one per front end (default: {REPLICA_DEFAULTS['ray_app_name']})")


# The replica options' values when --replicas is given without them. Their parser defaults are None, so that one
# given without --replicas (which would do nothing: the model then runs in this process) is an error, not ignored.
REPLICA_DEFAULTS = {"ray_address": None, "replica_timeout_s": 60.0, "replica_cpus": 1.0, "ray_app_name": "vlaperf"}


def _replica_options(args) -> None:
    """CliError for a replica option given without --replicas; else fill in the defaults of those not given."""
    from vlaperf.cli import CliError

    given = [f"--{k.replace('_', '-')}" for k in REPLICA_DEFAULTS if getattr(args, k, None) is not None]
    if not getattr(args, "replicas", None):
        if given:
            raise CliError(f"{', '.join(given)}: configure Ray Serve replicas and need --replicas N; without it the "
                           "model runs in this process")
        return
    for k, default in REPLICA_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, default)


def _need_serve_deps() -> None:
    from vlaperf.cli import CliError

    try:
        import msgpack  # noqa: F401
        import websockets  # noqa: F401
    except ImportError as e:
        raise CliError(f"the serve commands need websockets and msgpack ({e}); pip install 'vlaperf[serve]'") from None


def _clients(n: int) -> str:
    return f"{n} client" + ("" if n == 1 else "s")


def _api_key(args) -> str | None:
    """--api-key, else $VLAPERF_API_KEY, else None (no auth). An empty one is an error: `--api-key "$KEY"` with KEY
    unset must not serve without a key while the script believes it set one."""
    from vlaperf.cli import CliError

    if args.api_key is not None:
        if not args.api_key:
            raise CliError("--api-key: empty (an unset shell variable?); give a key, or leave --api-key out for no "
                           "key (loopback only)")
        return args.api_key
    env = os.environ.get(API_KEY_ENV)
    if env is not None and not env:
        raise CliError(f"${API_KEY_ENV} is set but empty; give it a key, or unset it for no key (loopback only)")
    return env or None


def _warmup_sizes(spec: str, max_batch: int) -> list[int]:
    from vlaperf.cli import CliError

    spec = spec.strip()
    if spec == "all":
        return list(range(1, max_batch + 1))
    if spec == "none":  # listen at once: the first request of each batch size pays its compile or capture
        return []
    sizes = []
    for item in (s.strip() for s in spec.split(",")):
        if item == "max":
            sizes.append(max_batch)
        elif item.isdigit() and 1 <= int(item) <= max_batch:
            sizes.append(int(item))
        elif item.isdigit() and int(item) > max_batch:  # was clamped to max_batch without a word
            raise CliError(f"--warmup-batches: {item} is above --max-batch {max_batch} (no batch that large is ever run)")
        else:
            raise CliError(f"--warmup-batches: expected 'all', 'none' or a comma list of integers 1..{max_batch} / "
                           f"'max', got {spec!r}")
    return sorted(set(sizes))


# --------------------------------------------------------------------------- serve


def cmd_serve(args) -> int:
    import logging

    from vlaperf.cli import CliError

    _need_serve_deps()
    from vlaperf.serve.server import PolicyServer, is_loopback

    args.batch = None  # the server batches requests itself
    _replica_options(args)
    api_key = _api_key(args)
    if not is_loopback(args.host) and api_key is None and not args.allow_unauthenticated:
        raise CliError(f"refusing to serve on {args.host!r} without an API key: pass --api-key (or set ${API_KEY_ENV}), "
                       "or --allow-unauthenticated on a trusted network")
    warmup = _warmup_sizes(args.warmup_batches, args.max_batch)
    _check_port_free(args.host, args.port)  # before a model is built and warmed up (a minute with best)
    console = wide_console()
    from vlaperf.workloads import is_wam_workload

    args.rtc_config = _rtc_config(args)
    if args.rtc_config is not None and (getattr(args, "replicas", None) or is_wam_workload(args.workload or "")):
        raise CliError("--rtc: real-time chunking is served by the pi0 family in this process; "
                       + ("drop --replicas" if getattr(args, "replicas", None) else
                          f"{args.workload} (the world-action model) has no previous-chunk guidance"))
    if args.no_keep_warm_quiet and args.keep_warm_ms is None:
        raise CliError("--no-keep-warm-quiet: says how --keep-warm-ms runs; give --keep-warm-ms MS too")
    if args.keep_warm_ms is not None and getattr(args, "replicas", None):
        raise CliError("--keep-warm-ms: a policy served in this process reruns its host stages while idle; drop "
                       "--replicas (the model runs in the replicas)")
    if getattr(args, "replicas", None):  # the model runs in Ray Serve replicas, not in this process
        if is_wam_workload(args.workload or ""):
            raise CliError(f"--replicas: Ray Serve replicas serve the pi0 family; {args.workload} (the world-action "
                           "model) is served in this process: drop --replicas")
        from vlaperf.serve.ray_backend import serve_replicas

        # before Ray starts: both default workloads (libero-pi0 on GPUs, tiny) are pi0's, LIBERO's layout, state 8
        checked = _precheck_pi0(args, args.workload or "libero-pi0")
        return serve_replicas(args, api_key, warmup, console, checked)
    if is_wam_workload(args.workload):
        if args.tokenizer or args.norm_stats or args.conventions or args.action_horizon:
            raise CliError(f"--tokenizer / --norm-stats / --conventions / --action-horizon: the pi0 family's; "
                           f"{args.workload} (the world-action model) takes latents and a text encoder "
                           "(docs/world-action.md)")
        policy = _wam_policy(args, console)
        if policy is None:
            return 1
    else:
        policy = _pi0_policy(args, console)
        if policy is None:
            return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        server = PolicyServer(policy, host=args.host, port=args.port, api_key=api_key, max_batch=args.max_batch,
                              max_wait_ms=args.max_wait_ms, max_message_bytes=int(args.max_message_mb * 2**20),
                              max_queued=args.max_queue, max_connections=args.max_connections,
                              idle_timeout_s=args.idle_timeout_s, warmup_batch_sizes=warmup,
                              allow_unauthenticated_remote=args.allow_unauthenticated,
                              keep_warm_ms=args.keep_warm_ms, keep_warm_quiet=not args.no_keep_warm_quiet,
                              on_ready=lambda s: print_serve(s, console))
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        server.serve_forever()
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e}") from None
    except KeyboardInterrupt:  # a Ctrl-C during warm-up, before the signal handlers exist
        return 130
    return 0



def _rtc_config(args):
    """--rtc's settings as an RtcConfig (None without --rtc); CliError for an --rtc-* option without --rtc."""
    from vlaperf.cli import CliError
    from vlaperf.models.pi0 import RtcConfig

    given = {name: getattr(args, f"rtc_{name}", None) for name in ("execution_horizon", "max_guidance_weight", "schedule")}
    given = {k: v for k, v in given.items() if v is not None}
    if not getattr(args, "rtc", False):
        if given:
            raise CliError(f"--rtc-{next(iter(given)).replace('_', '-')}: a setting of real-time chunking; add --rtc")
        return None
    return RtcConfig(**given)


def _release_reference(engine, args, console) -> None:
    """After the check: free the model's weights the engine holds fused copies of (pi0 family and
    world-action engines alike), unless --keep-reference."""
    if engine is not None and not getattr(args, "keep_reference", False):
        freed = engine.release_reference_weights()
        if freed:
            console.print(f"freed {freed / 1e6:.1f} MB of reference weights the engine holds fused copies of "
                          "(--keep-reference keeps them)")


def _pi0_policy(args, console):
    """The served pi0-family policy (None: its variant failed the equivalence check)."""
    import torch

    from vlaperf.cli import default_device, make_engine, setup
    from vlaperf.policy import Policy

    on_gpu = torch.device(args.device or default_device()).type == "cuda"
    tokenizer, norm_stats = _precheck_pi0(args, args.workload or ("libero-pi0" if on_gpu else "tiny"))
    base, workload, model, device = setup(args)
    if args.levers == "serve":
        args.levers = "graph" if model.action_in_proj.weight.device.type == "cuda" else "exact"
    engine = None if args.levers in ("reference", "none", "") else make_engine(model, args.levers)
    if engine is not None and not args.no_check:
        from vlaperf.check import check_equivalence

        rtc = getattr(args, "rtc_config", None)
        eq = check_equivalence(model, engine, workload, rtc=rtc)  # with --rtc, the guided call checked too
        if not eq["passed"]:
            print(f"vlaperf serve: variant {engine.name} fails equivalence{' (guided calls included)' if rtc else ''} "
                  f"(rel_l2 {eq['rel_l2']:.3g} > {eq['tolerance']:.3g}); refusing to serve it", file=sys.stderr)
            return None
    _release_reference(engine, args, console)
    sample = engine.sample_actions if engine is not None else model.sample_actions
    policy = Policy(model, sample, workload, tokenizer=tokenizer, num_steps=workload.steps,
                    verify=engine.raise_on_kernel_fault if engine is not None else None, norm_stats=norm_stats,
                    conventions=args.conventions, rtc=getattr(args, "rtc_config", None))
    return policy


def _precheck_pi0(args, workload_id: str):
    """The served workload's shape (--action-horizon, --conventions) and the checkpoint's tokenizer and
    statistics, checked before a model is built or Ray started: (tokenizer, norm_stats); CliError names the
    option."""
    from vlaperf.cli import CliError, resolve_shape
    from vlaperf.workloads import get_workload

    try:
        base = get_workload(workload_id)
    except ValueError as e:
        raise CliError(str(e)) from None
    workload, config = resolve_shape(args, base)
    return checkpoint_io(args.tokenizer, args.norm_stats, args.checkpoint, config, args.conventions, workload)


def checkpoint_io(tokenizer_file, norm_stats_path, checkpoint, config, conventions=None, workload=None):
    """--tokenizer and --norm-stats (`policy.load_checkpoint_io`), errors as CliError naming the option; the
    statistics checked against `workload` (their state dims, a LeRobot pipeline's relative actions against the
    conventions); a warning where a real checkpoint is served without them or without --conventions (its
    actions would be in the model's normalized units, its prompts tokenized by a stand-in, its delta actions
    left relative)."""
    from vlaperf.cli import CliError
    from vlaperf.conventions import get_conventions
    from vlaperf.normalize import NormStatsError
    from vlaperf.policy import load_checkpoint_io, served_conventions

    try:
        tokenizer, norm_stats = load_checkpoint_io(tokenizer_file, norm_stats_path, config, conventions)
        if norm_stats is not None and workload is not None:
            norm_stats.check_dims(workload.state_dim)
            try:
                served_conventions(get_conventions(conventions), norm_stats, workload)
            except ValueError as e:
                raise NormStatsError(str(e)) from None
    except NormStatsError as e:
        raise CliError(f"--norm-stats: {e}") from None
    except (ImportError, ValueError) as e:
        raise CliError(f"--tokenizer: {e}") from None
    if checkpoint is not None:  # a missing or unreadable one is an error of its own, not three warnings before it
        from vlaperf.checkpoints import CheckpointError, check_readable

        try:
            check_readable(checkpoint)
        except CheckpointError as e:
            raise CliError(f"--checkpoint: {e}") from None
    warn_unconverted_checkpoint(checkpoint, tokenizer, norm_stats, conventions,
                                workload.layout if workload is not None else None, config.pi05,
                                workload.horizon if workload is not None else None)
    return tokenizer, norm_stats


def _fitting_conventions_words(names: list[str], horizon: int | None, trained: int | None = None) -> str:
    """The conventions `names`, each with its chunk where that is not the `horizon` served now: conventions set the
    chunk they were trained with (LeRobot's: the checkpoint's `trained` chunk, else their default), so adding one
    serves its chunk instead. tiny's 10 actions were met with openpi:pi0_libero and lerobot:pi0 alone, both 50."""
    from vlaperf.conventions import CONVENTIONS

    same = [c for c in names if horizon is None or CONVENTIONS[c].chunk(trained) in (None, horizon)]
    others: dict[int, list[str]] = {}
    for c in names:
        if c not in same:
            others.setdefault(CONVENTIONS[c].chunk(trained), []).append(c)
    words = [", ".join(same)] if same else []
    words += [f"{', '.join(cs)}, {'each ' if len(cs) > 1 else ''}with {h} actions a chunk, not the {horizon} "
              "served now" for h, cs in others.items()]
    return "; ".join(words)


def warn_unconverted_checkpoint(checkpoint, tokenizer, norm_stats, conventions="unset", layout: str | None = None,
                                pi05: bool = False, horizon: int | None = None) -> None:
    """A trained checkpoint served without its tokenizer, statistics or conventions gives a robot meaningless
    actions. `layout` (the workload's) and `pi05`: the conventions that would fit are named; `horizon` (the chunk
    served now): those trained with another chunk say theirs."""
    if checkpoint is None:
        return
    from vlaperf.checkpoints import CheckpointError, lerobot_config
    from vlaperf.hub import origin

    folder = Path(checkpoint) if Path(checkpoint).is_dir() else Path(checkpoint).parent
    try:
        trained = lerobot_config(checkpoint)  # LeRobot's config.json beside the weights
    except CheckpointError:
        trained = None
    if conventions is None:
        from vlaperf.conventions import CONVENTIONS, conventions_for

        fitting = conventions_for(pi05, layout) if layout is not None else []
        chunk = trained["chunk_size"] if trained is not None else None
        lerobots = [c for c in fitting if c.startswith("lerobot") and trained is not None]  # any chunk: the file's
        if lerobots:
            hint = f"this is a LeRobot checkpoint: {', '.join(lerobots)}"
        else:
            hint = (f"this workload's model and layout take {_fitting_conventions_words(fitting, horizon, chunk)}"
                    if fitting else "e.g. --conventions openpi:pi0_libero")
        print("vlaperf serve: warning: serving a checkpoint without --conventions: the actions are the model's "
              "own; a checkpoint trained on delta actions (openpi pi0_libero, ALOHA) or with another chunk needs its "
              f"conventions: {hint} (docs/serving.md, vlaperf workloads)", file=sys.stderr)
    if tokenizer is None:
        print("vlaperf serve: warning: serving a checkpoint without --tokenizer: its prompts go through a stand-in "
              "tokenizer whose ids mean nothing to the model (pass PaliGemma's paligemma_tokenizer.model)", file=sys.stderr)
    if norm_stats is None:
        found = sorted(Path(checkpoint).glob("assets/**/norm_stats.json")) if Path(checkpoint).is_dir() else []
        hub = origin(checkpoint)
        where = (f"this checkpoint folder has {', '.join(str(p) for p in found)}" if found
                 else f"a LeRobot repo keeps them beside its weights: --norm-stats {hub['repo']}" if hub
                 else f"this LeRobot checkpoint folder has them: --norm-stats {folder}"
                 if (folder / "policy_preprocessor.json").is_file()
                 else "pass openpi's assets/<robot>/norm_stats.json")
        print("vlaperf serve: warning: serving a checkpoint without --norm-stats: the state is not normalized and the "
              f"actions stay in the model's normalized units ({where})", file=sys.stderr)


def _wam_policy(args, console):
    """The served world-action policy (None: its variant failed the equivalence check). After the
    check, the reference's weights that the engine holds stacked copies of are freed, as for pi0."""
    from vlaperf.check import check_wam_equivalence
    from vlaperf.policy import WamPolicy
    from vlaperf.profile import wam

    base, workload, model, device = wam.setup(args)
    if args.levers == "serve":
        args.levers = "graph" if device.type == "cuda" else "exact"
    engine = None if args.levers in ("reference", "none", "") else wam.make_engine(model, args.levers)
    if engine is not None and not args.no_check:
        eq = check_wam_equivalence(model, engine, workload)
        if not eq["passed"]:
            print(f"vlaperf serve: variant {engine.name} fails equivalence (actions rel_l2 {eq['rel_l2']:.3g}, video "
                  f"{eq['video_rel_l2']:.3g} > {eq['tolerance']:.3g}); refusing to serve it", file=sys.stderr)
            return None
    _release_reference(engine, args, console)
    return WamPolicy(model, engine.generate if engine is not None else model.generate, workload)


def print_serve(server, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    from vlaperf.serve.server import KEEP_WARM_FOR_S

    m = server.metadata
    t = Table(title=f"vlaperf serve  {m.get('workload')}  {m.get('levers_label')}  ({m.get('dtype')}, {m.get('device')})")
    t.add_column("setting")
    t.add_column("value")
    rows = [
        ("url", server.url),
        ("health", f"http://{server.url.split('://', 1)[1]}/healthz"),
        ("metrics", f"http://{server.url.split('://', 1)[1]}/metrics (Prometheus text"
                    + (", Api-Key header)" if server.api_key else ")")),
        ("auth", "Api-Key header required" if server.api_key else "none (loopback only unless --allow-unauthenticated)"),
        ("action chunk", f"{m.get('action_horizon')} x {m.get('robot_action_dim')} float32"),
        ("denoise steps", str(m.get("num_steps"))),
        ("inputs", f"tokenizer {m.get('tokenizer', '-')}; normalization {m.get('normalization') or 'none (model units)'}"
         if "sampler" not in m else f"latents, state, prompt (text encoder {m.get('text_encoder', '-')})"),
        *([("conventions", str(m["conventions"]))] if "conventions" in m else []),
        *([("real-time chunking", f"observations with {' and '.join(m['rtc']['keys'])}: execution horizon "
                                  f"{m['rtc']['execution_horizon']}, max guidance weight "
                                  f"{m['rtc']['max_guidance_weight']:g}, {m['rtc']['schedule']} schedule")]
          if m.get("rtc") else []),
        *([("checkpoint", f"{m['checkpoint']['name']} ({m['checkpoint']['layout']})"
                          + (f" from {m['checkpoint']['hub']['repo']}@{m['checkpoint']['hub']['revision'][:12]}"
                             if m["checkpoint"].get("hub") else ""))] if m.get("checkpoint") else []),
        *([("sampler", ", ".join(f"{k} {v}" for k, v in m["sampler"].items()))] if "sampler" in m else []),
        ("levers", ",".join(m.get("levers") or []) or "reference"),
        ("batching", f"up to {server.max_batch} per call, wait <= {server.max_wait_ms:g} ms"),
        *([("keep-warm", f"the last request's host stages rerun every {server.keep_warm_ms:g} ms while idle, for up "
                         f"to {KEEP_WARM_FOR_S:g} s"
                         + ("; not where a steady client's next request is due" if server.keep_warm_quiet else ""))]
          if server.keep_warm_ms is not None else []),
        ("limits", f"messages up to {server.max_message_bytes / 2**20:g} MiB, {server.max_queued} observations queued, "
                   f"{server.max_connections} connections"
                   + (f", closed after {server.idle_timeout_s:g} s without a request" if server.idle_timeout_s else "")),
        ("warm-up", f"batch sizes {list(server.warmup_batch_sizes)} in {m.get('warmup_s', 0):.2f} s"
         if m.get("backend") != "ray-serve" else f"in each of {m.get('replicas')} Ray Serve replicas: batch sizes "
         f"{m.get('replica_warmup_batch_sizes')} in {m.get('warmup_s', 0):.2f} s (slowest)"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    (console or Console()).print(t)
    (console or Console()).print("serving; Ctrl-C or SIGTERM stops after in-flight requests finish")


# --------------------------------------------------------------------------- loadgen


def _ms(summary: dict | None, key: str) -> str:
    return "-" if not summary else f"{summary[key]:.2f}"


def _rate(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def cmd_loadgen(args) -> int:
    from vlaperf.cli import CliError

    _need_serve_deps()
    from vlaperf.report.schema import write_result
    from vlaperf.serve.loadgen import LoadgenError, run_loadgen

    try:
        result = run_loadgen(args.url, clients=args.clients, requests=args.requests, timeout_s=args.timeout_s,
                             api_key=_api_key(args), workload=args.workload, warmup=args.warmup, image_size=args.image_size,
                             seed=args.seed)
    except LoadgenError as e:
        raise CliError(str(e)) from None
    print_loadgen(result)
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    return 0 if result["loadgen"]["passed"] else 1


def print_loadgen(result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    lg, server = result["loadgen"], result["server"]
    console = wide_console()
    t = Table(title=f"vlaperf loadgen  {result['workload']['id']}  (times in ms)")
    for col in ("clients", "ok/expected", "errors", "req/s", "chunks/s", "rtt p50", "rtt p90", "rtt p99", "infer p50",
                "queue p50", "overhead p50", "batch"):
        t.add_column(col, justify="right", min_width=len(col) if col == "ok/expected" else None)
    for ph in lg["phases"]:
        t.add_row(str(ph["clients"]), f"{ph['ok']}/{ph['expected']}" + (" timeout" if ph["timed_out"] else ""),
                  str(ph["errors"]), _rate(ph["requests_per_s"]), _rate(ph["action_chunks_per_s"]),
                  _ms(ph["round_trip_ms"], "median"), _ms(ph["round_trip_ms"], "p90"), _ms(ph["round_trip_ms"], "p99"),
                  _ms(ph["server_infer_ms"], "median"), _ms(ph["queue_ms"], "median"), _ms(ph["overhead_ms"], "median"),
                  "-" if not ph["batch_size"] else f"{ph['batch_size']['mean']:.2f}")
    console.print(t)
    console.print(f"server: {server.get('levers_label')}, {server.get('dtype')} on {server.get('device')}, "
                  f"max batch {server.get('max_batch')}, max wait {server.get('max_wait_ms')} ms; "
                  "overhead = round trip - queue - infer (network, (de)serialization, event loop); "
                  "batch = the batch each request was served in, mean over requests (a call of 4 counts 4 times: "
                  "not the server's observations per call)")
    for ph in lg["phases"]:  # the overhead's pieces the server measures (servers from session 51 on)
        if ph.get("handoff_ms") and ph.get("client_side_ms"):
            own = ph.get("pack_ms") and ph.get("unpack_ms")
            ways = (f" (to the server {_ms(ph['uplink_ms'], 'median')}"
                    + (f", packing {_ms(ph['pack_ms'], 'median')}" if own else "")
                    + f"; back {_ms(ph['downlink_ms'], 'median')}"
                    + (f", unpacking {_ms(ph['unpack_ms'], 'median')}" if own else "") + ")"
                    if ph.get("uplink_ms") and ph.get("downlink_ms") else "")
            console.print(f"{_clients(ph['clients'])}: of the overhead, the event loop's wake-up for the result "
                          f"{_ms(ph['handoff_ms'], 'median')} ms and outside the server (client, network, sending) "
                          f"{_ms(ph['client_side_ms'], 'median')} ms{ways} (p50)")
    pc = Table(title="per client round trip (ms)")
    for col in ("clients", "client", "ok", "errors", "p50", "p90", "p99", "max"):
        pc.add_column(col, justify="right")
    wide = []
    for ph in lg["phases"]:
        if len(ph["per_client"]) > 16:
            wide.append(str(ph["clients"]))
            continue
        for c in ph["per_client"]:
            s = c["round_trip_ms"]
            pc.add_row(str(ph["clients"]), str(c["client"]), str(c["ok"]), str(c["errors"]), _ms(s, "median"),
                       _ms(s, "p90"), _ms(s, "p99"), _ms(s, "max"))
    if pc.row_count:
        console.print(pc)
    if wide:
        console.print(f"per-client numbers of the {', '.join(wide)}-client phase(s) are in the JSON result (--json)")
    for ph in lg["phases"]:
        if ph["misrouted"]:
            console.print(f"[red]{ph['misrouted']} replies routed to the wrong request[/red] ({_clients(ph['clients'])})")
        for line in ph["error_samples"]:  # the server's words, escaped: '[/x]' in them raised MarkupError
            console.print(f"[red]error[/red] ({_clients(ph['clients'])}): {escape(line)}")
    for ph in lg["phases"]:
        if ph["timed_out"]:
            console.print(f"[red]stopped at the time limit[/red] ({_clients(ph['clients'])}): {ph['ok']} of "
                          f"{ph['expected']} requests answered, {ph['lost']} in flight unanswered, "
                          f"{ph.get('unsent', 0)} never sent (--timeout-s)")
    # a reply lost in a closed loop holds its client until the time limit: then it is one of those in flight
    lost_or_wrong = any(ph["errors"] or ph["misrouted"] or (ph["lost"] and not ph["timed_out"]) for ph in lg["phases"])
    console.print("all replies well-formed and routed correctly" if lg["passed"]
                  else "[red]FAILED: errors, lost or misrouted replies[/red]" if lost_or_wrong
                  else "[red]FAILED: the time limit stopped it[/red]")


# --------------------------------------------------------------------------- rollout


def cmd_rollout(args) -> int:
    from vlaperf.cli import CliError

    _need_serve_deps()
    from vlaperf.report.schema import write_result
    from vlaperf.serve.loadgen import LoadgenError
    from vlaperf.serve.rollout import run_rollout

    try:
        result = run_rollout(args.url, episodes=args.episodes, steps_per_episode=args.steps_per_episode,
                             control_hz=args.control_hz, replan_every=args.replan_every, api_key=_api_key(args),
                             workload=args.workload, timeout_s=args.timeout_s, image_size=args.image_size,
                             seed=args.seed, execution="async" if args.async_execution or args.rtc else "sync",
                             rtc=args.rtc, back_to_back=args.back_to_back,
                             client_keep_warm_ms=args.client_keep_warm_ms)
    except LoadgenError as e:
        raise CliError(str(e)) from None
    print_rollout(result)
    if args.json:
        write_result(result, args.json)
        print(f"wrote {args.json}")
    ro = result["rollout"]
    return 0 if ro["errors"] == 0 and not ro["timed_out"] and not ro["connection_lost"] else 1


def print_rollout(result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    ro, server = result["rollout"], result["server"]
    console = wide_console()
    how = {"sync": "", "async": ", async"}.get(ro.get("execution", "sync"), "") + (", RTC" if ro.get("rtc") else "")
    t = Table(title=f"vlaperf rollout  {result['workload']['id']}  ({ro['control_hz']:g} Hz, chunk of "
                    f"{ro['action_horizon']}, replan every {ro['replan_every']}{how})")
    for col in ("episode", "steps", "calls", "wall s", "ideal s", "waiting s", "waiting", "overruns",
                "call p50 ms", "call max ms"):
        t.add_column(col, justify="right")
    for r in ro["per_episode"]:
        t.add_row(str(r["episode"]), str(r["steps"]), str(r["policy_calls"]), f"{r['wall_s']:.2f}", f"{r['ideal_wall_s']:.2f}",
                  f"{r['policy_wait_s']:.3f}", "-" if r["policy_wait_share"] is None else f"{r['policy_wait_share']:.1%}",
                  str(r["overrun_steps"]), _ms(r["policy_call_ms"], "median"), _ms(r["policy_call_ms"], "max"))
    console.print(t)
    share = ro["policy_wait_share"]
    from vlaperf.report.render import cadence_words, keep_warm_setting_words, keep_warm_wait_words

    console.print(f"server: {server.get('levers_label')}, {server.get('dtype')} on {server.get('device')}"
                  + keep_warm_setting_words(ro, server))
    console.print(f"total {ro['wall_s']:.2f} s, {'-' if share is None else f'{share:.1%}'} of it waiting for the policy; "
                  f"{ro['overrun_steps']} overrun steps; {ro['errors']} errors"
                  + ("; [red]stopped at the time limit[/red]" if ro["timed_out"] else ""))
    if ro.get("execution") == "async":
        jump = ro.get("switch_jump")
        console.print(f"async: {ro['switches']} chunk switches ({ro['guided_switches']} guided), {ro['stall_steps']} "
                      f"steps stalled on a chunk that ran out, {ro['late_switches']} replies later than the delay sent; "
                      "switch jump (the next action, new chunk against old) "
                      + (f"median {jump['median']:.3g}, max {jump['max']:.3g}" if jump else "-"))
    for line in (cadence_words(ro), keep_warm_wait_words(ro)):
        if line:
            console.print(line)
    if ro.get("connection_lost"):
        console.print(f"[red]stopped: {escape(ro['connection_lost'])}[/red] (the episodes above ran up to there)")
    what = "latents and state" if server.get("layout") == "wam" else "images and state"
    console.print(f"observations are SYNTHETIC (random {what}, no simulator): only the timing is real")
