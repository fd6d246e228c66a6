"""Scale-out serving on Ray Serve: `vlaperf serve --replicas N` (extra `vlaperf[ray]`).

    one PolicyServer (websocket front end: protocol, auth, /healthz, error frames, batching)
        |  N inference threads, one batch each: DeploymentHandle.infer.remote(list_of_examples)
        v
    Ray Serve deployment "VlaperfPolicy", N replicas (one GPU each, or CPUs in tests);
    each replica owns its model + engine + Policy, built and warmed up by its own thread

Why this split:

- The front end is the unchanged PolicyServer. Its policy is a `RayPolicy`: it validates
  observations locally (the workload's ObservationTransform on the CPU, no model), and its
  `infer(list)` sends the batch to a replica and waits for the reply. `concurrency` = N tells
  the server to run N inference threads (the one hook in server.py), so N batches are in
  flight at once, one per replica.
- Batching stays in the front end: one replica call per batch, formed by the server's batcher
  exactly as for one GPU (max_batch, max_wait_ms). Ray Serve's @serve.batch is not used: it
  would batch again inside each replica, behind a queue the front end cannot see.
- Routing is Ray Serve's: each call goes through the deployment handle's router, which sends
  it to a replica with a free slot (max_ongoing_requests=1 per replica: one batch per GPU at a
  time; with all N busy a call waits in the router until one frees up).
- Replica death: Ray Serve health-checks each replica (`check_health`: fails on a sticky CUDA
  error or a call stuck past `hang_timeout_s`) and replaces a dead or unhealthy one. A call
  that was on a replica when it died raises ActorDiedError at once; a call without a reply
  within `request_timeout_s` is cancelled. Either way `RayPolicy.infer` raises
  `BackendUnavailable` and every request of that batch gets an `InternalError` error frame
  whose message starts with `ReplicaDied:` / `ReplicaTimeout:` / `ReplicaUnavailable:`:
  never a hang, and never retried behind the client's back. Later requests go to the live
  replicas, and to the replacement once Ray has started it.
- Replicas are identical: each builds the model from the same seed (same weights), the same
  engine, runs the same equivalence check, warms up every batch size x prompt bucket, then
  seeds torch's RNG with the same seed, so identical inputs and noise give identical actions
  on every replica (fresh noise per call is drawn from each replica's own generator).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from vlaperf.serve.server import BackendUnavailable

log = logging.getLogger("vlaperf.serve.ray")

DEPLOYMENT_NAME = "VlaperfPolicy"
DEFAULT_APP_NAME = "vlaperf"
# A private local Ray (no --ray-address) stays on 127.0.0.1: this Ray setting (read when ray is
# first imported) turns off multi-node clustering, and with it the use of the host's routable IP.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# vlaperf always calls ray.init itself. Without this, a Serve background thread still running
# after ray.shutdown() would start a fresh local Ray (Ray's auto-connect) on its next call.
AUTO_CONNECT_ENV = "RAY_ENABLE_AUTO_CONNECT"


class RayUnavailable(RuntimeError):
    """Ray (with Serve) is not installed, or no cluster could be reached."""


# What RayPolicy.infer raises when a batch fails for a reason other than its observations. The
# server answers each request of the batch with an InternalError frame reading "NAME: message".


class ReplicaDied(BackendUnavailable):
    """The replica running the batch died (its actor, worker process or node)."""


class ReplicaTimeout(BackendUnavailable):
    """No reply within request_timeout_s; the call was cancelled."""


class ReplicaUnavailable(BackendUnavailable):
    """Ray Serve could not run the call (no replica, back pressure, ...)."""


def require_ray():
    """(ray, ray.serve) or RayUnavailable saying how to install them."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise RayUnavailable(f"scale-out needs Ray Serve ({e}); pip install 'vlaperf[ray]'") from None
    return ray, serve


def ray_init(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
             runtime_env: dict | None = None, local_loopback: bool = True) -> bool:
    """Connect to Ray; returns True when this call started a private local instance (the
    caller then shuts it down), False when Ray was already initialised or `address` named a
    running cluster ("auto", "ray://host:10001", "host:6379").

    A local instance (address None and no RAY_ADDRESS) with `local_loopback` binds to
    127.0.0.1 only; that works only when ray has not been imported yet in this process."""
    address = address or os.environ.get("RAY_ADDRESS") or None  # what ray.init() would use
    if "ray" not in sys.modules:  # both are read when ray is imported
        os.environ.setdefault(AUTO_CONNECT_ENV, "0")
        if address is None and local_loopback:
            os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    ray, _ = require_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    try:
        if address is None:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
            return True
        ray.init(address=address, **kwargs)
    except Exception as e:
        raise RayUnavailable(f"cannot start or reach Ray (address {address!r}): {type(e).__name__}: {e}") from None
    return False


# ----------------------------------------------------------------------------- replicas


def build_policy_from_spec(spec: dict):
    """A vlaperf Policy built as `vlaperf serve` builds it (cli.setup, make_engine, the
    equivalence check), from a plain dict of the serve options: workload, levers, device,
    dtype, steps, action_horizon, seed, checkpoint, tokenizer, norm_stats, conventions, no_check, keep_reference,
    compile_cache (the files' paths must be readable, the cache's writable, where the replica runs). Runs inside a
    replica."""
    from vlaperf.cli import make_engine, setup
    from vlaperf.policy import Policy, load_checkpoint_io

    args = argparse.Namespace(workload=spec.get("workload"), device=spec.get("device"), dtype=spec.get("dtype"),
                              steps=spec.get("steps"), batch=None, seed=int(spec.get("seed", 0)),
                              checkpoint=spec.get("checkpoint"), action_horizon=spec.get("action_horizon"),
                              conventions=spec.get("conventions"), compile_cache=spec.get("compile_cache"))
    _, workload, model, _ = setup(args)
    levers = spec.get("levers") or "serve"
    if levers == "serve":
        levers = "graph" if model.action_in_proj.weight.device.type == "cuda" else "exact"
    engine = None if levers in ("reference", "none", "") else make_engine(model, levers)
    if engine is not None and not spec.get("no_check"):
        from vlaperf.check import check_equivalence

        eq = check_equivalence(model, engine, workload)
        if not eq["passed"]:
            raise RuntimeError(f"variant {engine.name} fails equivalence (rel_l2 {eq['rel_l2']:.3g} > "
                               f"{eq['tolerance']:.3g}); refusing to serve it")
    if engine is not None and not spec.get("keep_reference"):
        engine.release_reference_weights()  # as `vlaperf serve` does: the replica serves the engine only
    sample = engine.sample_actions if engine is not None else model.sample_actions
    tokenizer, norm_stats = load_checkpoint_io(spec.get("tokenizer"), spec.get("norm_stats"), model.config,
                                               spec.get("conventions"))
    return Policy(model, sample, workload, tokenizer=tokenizer, num_steps=workload.steps,
                  verify=engine.raise_on_kernel_fault if engine is not None else None, norm_stats=norm_stats,
                  conventions=spec.get("conventions"))


def describe_policy(policy) -> dict:
    """What a replica reports about its policy (the fields of the server's metadata)."""
    out: dict[str, Any] = {}
    workload = getattr(policy, "workload", None)
    if workload is not None:
        out["workload"] = workload.id
    model = getattr(policy, "model", None)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "vision", None) is not None:
        out["image_size"] = int(config.vision.image_size)
    if getattr(model, "dtype", None) is not None:
        out["dtype"] = str(model.dtype).replace("torch.", "")
    if getattr(policy, "num_steps", None) is not None:
        out["num_steps"] = int(policy.num_steps)
    owner = getattr(getattr(policy, "sample", None), "__self__", None)
    levers = getattr(owner, "levers", None)
    if levers is not None and hasattr(levers, "names"):
        out["levers"], out["levers_label"] = list(levers.names()), str(getattr(owner, "name", ""))
    elif owner is not None and owner is model:
        out["levers"], out["levers_label"] = [], "reference"
    device = getattr(policy, "device", None)
    out["device"] = str(device) if device is not None else None
    tokenizer = getattr(getattr(policy, "transform", None), "tokenizer", None)
    if tokenizer is not None:
        out["tokenizer"] = type(tokenizer).__name__
    if hasattr(policy, "norm_stats"):
        out["normalization"] = policy.norm_stats.describe() if policy.norm_stats is not None else None
    if getattr(policy, "conventions", None) is not None:
        out["conventions"] = policy.conventions.name
    from vlaperf.serve.server import checkpoint_metadata

    out["checkpoint"] = checkpoint_metadata(model)
    return out


class PolicyReplica:
    """The Ray Serve deployment class: one per replica process (serve.deployment wraps it).

    `build` is a zero-argument callable returning a Policy (anything with `infer(list)`; a
    `functools.partial(build_policy_from_spec, spec)` from the CLI). It is called on the
    replica's one inference thread, which then runs every warm-up and `infer` call too (CUDA
    graphs and compiled code stay on the thread that made them)."""

    def __init__(self, build: Callable[[], Any], warmup_batch_sizes: tuple[int, ...] = (1,), seed: int = 0,
                 hang_timeout_s: float = 300.0):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlaperf-replica")
        self._busy_since: float | None = None
        self._fatal: str | None = None
        self._hang_timeout_s = float(hang_timeout_s)
        self.calls = 0
        try:
            from ray import serve

            rid = serve.get_replica_context().replica_id
            self.replica_id, self.actor_name = rid.unique_id, rid.to_full_id_str()
        except Exception:  # outside a replica (a direct test)
            self.replica_id, self.actor_name = f"local-{os.getpid()}", None
        self.info = self._pool.submit(self._build, build, tuple(warmup_batch_sizes), seed).result()

    def _build(self, build, warmup_batch_sizes, seed) -> dict:
        import torch

        from vlaperf.inputs import make_example, warmup_prompts

        torch.set_grad_enabled(False)  # thread-local: this is the thread that runs every call
        t0 = time.perf_counter()
        self.policy = build()
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        workload = getattr(self.policy, "workload", None)
        if workload is not None:
            for prompt in warmup_prompts(workload.prompt_slots):
                for b in sorted(set(warmup_batch_sizes)):
                    examples = [make_example(workload, seed=i) for i in range(b)]
                    for ex in examples:
                        ex["prompt"] = prompt
                    self.policy.infer(examples)
        warmup_s = time.perf_counter() - t0
        torch.manual_seed(seed)  # every replica draws the same fresh noise sequence from here on
        info = describe_policy(self.policy)
        from vlaperf.profile.ray_matrix import device_record

        info.update(replica=self.replica_id, actor_name=self.actor_name, build_s=round(build_s, 3),
                    warmup_s=round(warmup_s, 3), warmup_batch_sizes=sorted(set(warmup_batch_sizes)),
                    node=device_record(getattr(self.policy, "device", None)))
        return info

    def _infer(self, examples: list[dict]) -> dict:
        from vlaperf.inputs import InputError
        from vlaperf.policy import NonFiniteActions

        self._busy_since = time.monotonic()
        try:
            out = self.policy.infer([_writable(ex) for ex in examples])
        except (InputError, NonFiniteActions) as e:
            # the request's own fault, answered as an error frame: returned, not raised, so that Ray Serve does not
            # log ~35 lines of traceback for each (a client could fill the log; the in-process server logs the
            # first LOGGED_ERRORS_PER_CONNECTION of a connection)
            self.calls += 1
            return {"refused": e, "replica": self.replica_id}
        except Exception as e:
            if "CUDA error" in str(e) or type(e).__name__ == "AcceleratorError":
                self._fatal = f"{type(e).__name__}: {e}"  # a sticky CUDA error: health check fails, Ray replaces us
            raise
        finally:
            self._busy_since = None
        self.calls += 1
        return {"actions": np.asarray(out["actions"]), "policy_timing": dict(out.get("policy_timing") or {}),
                "replica": self.replica_id}

    async def infer(self, examples: list[dict]) -> dict:
        """One batch (a list of observation dicts) -> {"actions": (B, H, D), "policy_timing", "replica"}."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._infer, examples)

    def describe(self) -> dict:
        return dict(self.info, calls=self.calls)

    def check_health(self) -> None:
        """Called by Ray Serve every health_check_period_s; raising makes Ray replace the replica."""
        if self._fatal:
            raise RuntimeError(f"replica {self.replica_id} hit a fatal error: {self._fatal}")
        since = self._busy_since
        if since is not None and time.monotonic() - since > self._hang_timeout_s:
            raise RuntimeError(f"replica {self.replica_id}: one call has run for more than {self._hang_timeout_s:g} s")


def _writable(value):
    """Ray hands numpy arguments over read-only (zero-copy from its object store); the policy
    gets its own writable copies, as it would from the websocket decoder."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, dict):
        return {k: _writable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_writable(v) for v in value]
    return value


@dataclass
class ReplicaOptions:
    """How the deployment is placed and supervised (docs/scale-out.md)."""

    replicas: int = 2
    device: str = "cpu"  # "cuda": num_gpus=1 per replica (a whole GPU each); "cpu": num_cpus each
    num_cpus: float = 1.0
    app_name: str = DEFAULT_APP_NAME
    request_timeout_s: float = 60.0  # one batch call, front end side
    hang_timeout_s: float | None = None  # replica side (health check); default 2 x request_timeout_s
    health_check_period_s: float = 2.0
    health_check_timeout_s: float = 30.0
    max_constructor_retry_count: int = 3

    def actor_options(self) -> dict:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.device.startswith("cuda"):
            opts["num_gpus"] = 1
        return opts


def deploy(build: Callable[[], Any], options: ReplicaOptions, warmup_batch_sizes=(1,), seed: int = 0):
    """Start the replicas (blocks until every one is built and warmed up); returns the
    deployment handle. Needs ray.init() first. Serve's HTTP proxy is not started: the
    websocket front end is the only way in."""
    _, serve = require_ray()
    serve.start(proxy_location="Disabled")
    hang = options.hang_timeout_s if options.hang_timeout_s is not None else 2 * options.request_timeout_s
    deployment = serve.deployment(PolicyReplica, name=DEPLOYMENT_NAME).options(
        num_replicas=options.replicas,
        ray_actor_options=options.actor_options(),
        max_ongoing_requests=1,
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=options.health_check_timeout_s,
        max_constructor_retry_count=options.max_constructor_retry_count,
        graceful_shutdown_timeout_s=5,
    )
    app = deployment.bind(build, tuple(warmup_batch_sizes), seed, hang)
    return serve.run(app, name=options.app_name, route_prefix=None)


def replica_actor_names(app_name: str = DEFAULT_APP_NAME) -> list[str]:
    """Names of the live replica actors (namespace "serve"), e.g. to kill one in a test."""
    ray, _ = require_ray()
    prefix = f"SERVE_REPLICA::{app_name}#{DEPLOYMENT_NAME}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


def running_replicas(app_name: str = DEFAULT_APP_NAME) -> int:
    """How many replicas Ray Serve reports RUNNING."""
    _, serve = require_ray()
    try:
        dep = serve.status().applications[app_name].deployments[DEPLOYMENT_NAME]
    except KeyError:
        return 0
    return int(dep.replica_states.get("RUNNING", 0))


# ----------------------------------------------------------------------------- front end side


class RayPolicy:
    """The PolicyServer's policy when the model runs in Ray Serve replicas.

    Validation runs here (the workload's ObservationTransform, on the CPU, needs no model);
    `infer(list)` sends the batch to one replica through the deployment handle and waits at
    most `request_timeout_s`. `concurrency` (= replicas) makes the server run that many
    inference threads."""

    def __init__(self, handle, workload, replicas: int, request_timeout_s: float = 60.0, conventions=None):
        from vlaperf.inputs import ObservationTransform

        self._handle = handle
        self.workload = workload
        self.num_steps = workload.steps
        # the replicas' conventions: the checks must know a default prompt (a request without one is valid then)
        self.transform = ObservationTransform(workload, workload.model_config(), device="cpu", conventions=conventions)
        self.concurrency = int(replicas)
        self.request_timeout_s = float(request_timeout_s)
        self.replica_calls: Counter = Counter()
        self.failures: Counter = Counter()
        self._lock = threading.Lock()

    def infer(self, examples: dict | list[dict]) -> dict:
        single = isinstance(examples, dict)
        batch = [examples] if single else list(examples)
        response = self._handle.infer.remote(batch)
        try:
            out = response.result(timeout_s=self.request_timeout_s)
        except TimeoutError:
            response.cancel()
            self._count_failure("ReplicaTimeout")
            raise ReplicaTimeout(f"no replica answered within {self.request_timeout_s:g} s; the request was "
                                 "cancelled") from None
        except Exception as e:
            raise self._translate(e) from None
        with self._lock:
            self.replica_calls[out.get("replica")] += 1
        if "refused" in out:  # the observation's fault (InputError, NonFiniteActions): the server's error frame
            raise out["refused"]
        actions = out["actions"]
        return {"actions": actions[0] if single else actions, "policy_timing": out.get("policy_timing") or {},
                "replica": out.get("replica")}

    def _translate(self, e: Exception) -> Exception:
        """A Ray exception -> what the server turns into an error frame (no tracebacks, no
        cluster addresses: those go to the log)."""
        from ray.exceptions import RayError, RayTaskError

        if isinstance(e, RayTaskError):  # the policy itself raised inside the replica
            cause = getattr(e, "cause", None)
            if isinstance(cause, Exception):
                return cause
            return RuntimeError(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
        log.warning("replica call failed: %s: %s", type(e).__name__, e)
        name = type(e).__name__
        if isinstance(e, RayError) and ("Actor" in name or "Worker" in name or "Node" in name):
            self._count_failure("ReplicaDied")
            return ReplicaDied("the replica running this batch died (Ray Serve replaces it); retry the request")
        self._count_failure("ReplicaUnavailable")
        return ReplicaUnavailable(f"{name} from Ray Serve; retry the request")

    def _count_failure(self, kind: str) -> None:
        with self._lock:
            self.failures[kind] += 1

    def describe_replicas(self) -> list[dict]:
        """Every running replica's description (its policy, node and GPU)."""
        return sorted(self._handle.broadcast("describe").results(), key=lambda d: d.get("replica") or "")

    def metadata(self, replicas_info: list[dict] | None = None) -> dict:
        """Extra server metadata: the replicas' policy fields and where they run."""
        import ray

        infos = replicas_info if replicas_info is not None else self.describe_replicas()
        first = infos[0] if infos else {}
        meta = {k: first[k] for k in ("image_size", "dtype", "device", "levers", "levers_label", "tokenizer",
                                      "normalization", "conventions", "checkpoint") if k in first}
        meta.update(backend="ray-serve", ray_version=ray.__version__, replicas=self.concurrency,
                    replica_timeout_s=self.request_timeout_s,
                    warmup_s=max((float(i.get("warmup_s") or 0.0) for i in infos), default=0.0),
                    replica_warmup_batch_sizes=first.get("warmup_batch_sizes", []),
                    replica_devices=[{"replica": i.get("replica"), "hostname": (i.get("node") or {}).get("hostname"),
                                      "node_id": (i.get("node") or {}).get("node_id"),
                                      "device": (i.get("node") or {}).get("device"),
                                      "gpu_name": (i.get("node") or {}).get("gpu_name"),
                                      "gpu_uuid": (i.get("node") or {}).get("gpu_uuid")} for i in infos])
        return meta


# ----------------------------------------------------------------------------- CLI


def serve_replicas(args, api_key: str | None, warmup: list[int], console=None, checked=None) -> int:
    """`vlaperf serve --replicas N`: deploy, then serve the websocket front end until stopped. `checked`: the
    caller has read --tokenizer / --norm-stats and checked --conventions already (serve's _precheck_pi0)."""
    from vlaperf.cli import CliError
    from vlaperf.serve.commands import print_serve
    from vlaperf.serve.server import PolicyServer
    from vlaperf.workloads import get_workload

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        started = ray_init(args.ray_address)
    except RayUnavailable as e:
        raise CliError(str(e)) from None
    ray, serve = require_ray()
    app_name = args.ray_app_name
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        device = args.device or ("cuda" if gpus >= 1 else "cpu")
        if device.startswith("cuda") and gpus < args.replicas:
            raise CliError(f"--replicas {args.replicas} needs {args.replicas} GPUs (one per replica); the Ray cluster has "
                           f"{gpus}")
        from vlaperf.cli import resolve_shape

        try:
            workload = get_workload(args.workload or ("libero-pi0" if device.startswith("cuda") else "tiny"))
        except ValueError as e:
            raise CliError(str(e)) from None
        workload, config = resolve_shape(args, workload)  # --steps, --action-horizon, --conventions checked here
        if checked is None and (args.tokenizer or args.norm_stats or args.checkpoint):  # before any replica starts
            from vlaperf.serve.commands import checkpoint_io

            checkpoint_io(args.tokenizer, args.norm_stats, args.checkpoint, config, args.conventions, workload)
        spec = {"workload": workload.id, "levers": args.levers, "device": "cuda" if device.startswith("cuda") else device,
                "dtype": args.dtype, "steps": args.steps, "seed": args.seed, "checkpoint": args.checkpoint,
                "no_check": args.no_check, "keep_reference": getattr(args, "keep_reference", False),
                "tokenizer": getattr(args, "tokenizer", None), "norm_stats": getattr(args, "norm_stats", None),
                "action_horizon": getattr(args, "action_horizon", None), "conventions": getattr(args, "conventions", None),
                "compile_cache": getattr(args, "compile_cache", None)}
        options = ReplicaOptions(replicas=args.replicas, device=device, num_cpus=args.replica_cpus, app_name=app_name,
                                 request_timeout_s=args.replica_timeout_s)
        print(f"vlaperf serve: starting {args.replicas} replica(s) of {workload.id} on {device} "
              f"(Ray {ray.__version__}, {'private local Ray' if started else 'cluster ' + str(args.ray_address)})",
              file=sys.stderr)
        try:
            handle = deploy(functools.partial(build_policy_from_spec, spec), options, warmup, args.seed)
        except Exception as e:
            last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            print(f"vlaperf serve: the replicas failed to start: {last}", file=sys.stderr)
            return 1
        policy = RayPolicy(handle, workload, args.replicas, args.replica_timeout_s, getattr(args, "conventions", None))
        infos = policy.describe_replicas()

        def on_ready(server):
            print_serve(server, console)
            print_replicas(infos, console)

        try:
            server = PolicyServer(policy, host=args.host, port=args.port, api_key=api_key, max_batch=args.max_batch,
                                  max_wait_ms=args.max_wait_ms, max_message_bytes=int(args.max_message_mb * 2**20),
                                  max_queued=args.max_queue, max_connections=args.max_connections,
                                  idle_timeout_s=args.idle_timeout_s, warmup_batch_sizes=(),
                                  metadata=policy.metadata(infos),
                                  allow_unauthenticated_remote=args.allow_unauthenticated, on_ready=on_ready)
        except ValueError as e:
            raise CliError(str(e)) from None
        try:
            server.serve_forever()
        except OSError as e:
            raise CliError(f"cannot listen on {args.host}:{args.port}: {e}") from None
        except KeyboardInterrupt:
            return 130
        return 0
    finally:
        shutdown(app_name, started)


def shutdown(app_name: str, stop_ray: bool, timeout_s: float = 30.0) -> None:
    """Free the replicas: stop the private Ray we started (that ends every process of it), or
    delete our Serve application from a shared cluster (bounded: a cluster that stopped
    answering must not keep the front end from exiting)."""
    try:
        ray, serve = require_ray()
        if not ray.is_initialized():
            return
        if stop_ray:
            try:  # see AUTO_CONNECT_ENV (for a ray imported before ray_init could set it)
                from ray._private import auto_init_hook

                auto_init_hook.enable_auto_connect = False
            except Exception:
                pass
            ray.shutdown()
            return
        t = threading.Thread(target=serve.delete, args=(app_name,), name="vlaperf-serve-delete", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            log.warning("Ray Serve did not delete application %r within %g s; delete it with `serve shutdown` or "
                        "`serve.delete(%r)`", app_name, timeout_s, app_name)
    except Exception:
        log.exception("Ray shutdown failed")


def print_replicas(infos: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Ray Serve replicas ({len(infos)})")
    for col in ("replica", "host", "device", "gpu", "levers", "build s", "warm-up s"):
        t.add_column(col)
    for i in infos:
        node = i.get("node") or {}
        t.add_row(str(i.get("replica")), str(node.get("hostname")), str(i.get("device")),
                  f"{node.get('gpu_name') or '-'} {node.get('gpu_uuid') or ''}".strip(),
                  ",".join(i.get("levers") or []) or str(i.get("levers_label") or "-"), f"{i.get('build_s', 0):.2f}",
                  f"{i.get('warmup_s', 0):.2f}")
    (console or Console()).print(t)
