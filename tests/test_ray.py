"""Scale-out on Ray, on the CPU with the `tiny` workload: `serve --replicas` (2 CPU replicas of
a Ray Serve deployment behind one websocket front end) and `matrix --ray` (one Ray task per
variant). Skipped when ray[serve] is not installed (`pip install -e ".[ray]"`).

One private local Ray for the whole module (4 logical CPUs, no dashboard), on 127.0.0.1 only;
every server and Serve application is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

# Before ray is imported: a private local Ray that stays on 127.0.0.1 (vlaperf.serve.ray_backend).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("websockets")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")


from vlaperf.inputs import make_example, random_noise  # noqa: E402
from vlaperf.models.pi0 import build_model  # noqa: E402
from vlaperf.policy import Policy  # noqa: E402
from vlaperf.report.schema import read_result  # noqa: E402
from vlaperf.serve import ray_backend  # noqa: E402
from vlaperf.serve.client import AuthenticationError, Client, ServerError  # noqa: E402
from vlaperf.serve.ray_backend import RayPolicy, ReplicaOptions  # noqa: E402
from vlaperf.serve.server import PolicyServer  # noqa: E402
from vlaperf.workloads import get_workload  # noqa: E402

pytestmark = [pytest.mark.ray,
              pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")]

# The test policy below is defined here, not in vlaperf: ship it to the replicas by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TINY = get_workload("tiny")
H, D = TINY.horizon, TINY.robot_action_dim
APP = "vlaperf-test"
SLOW_KEY, MARK_KEY = "test/sleep_s", "test/mark_file"


class _TestPolicy:
    """The tiny policy with one fixed noise for every observation (so results do not depend on
    batching or on which replica ran them), plus a test hook: an observation carrying
    `test/sleep_s` makes the call write this replica's actor name to `test/mark_file` and sleep.
    The front end ignores unknown keys, so they reach the replica."""

    def __init__(self):
        model = build_model(TINY.preset, device="cpu", seed=0)
        noise = random_noise(TINY, model.config, seed=3)[:1]

        def sample(obs, _noise, num_steps):
            return model.sample_actions(obs, noise.expand(obs.batch, -1, -1).contiguous(), num_steps)

        self.inner = Policy(model, sample, TINY)
        self.workload, self.model, self.device, self.num_steps = TINY, model, self.inner.device, self.inner.num_steps
        self.conventions = self.inner.conventions

    def infer(self, examples):
        batch = [examples] if isinstance(examples, dict) else examples
        for ex in batch:
            if SLOW_KEY in ex:
                name = serve.get_replica_context().replica_id.to_full_id_str()
                Path(ex[MARK_KEY]).write_text(name)
                time.sleep(float(ex[SLOW_KEY]))
        return self.inner.infer(examples)


def _make_test_policy():
    return _TestPolicy()


@pytest.fixture(scope="module")
def ray_cluster():
    started = ray_backend.ray_init(None, num_cpus=4)
    yield
    try:
        serve.shutdown()
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(scope="module")
def expected():
    """Unbatched results of the same fixed-noise policy, computed here, for seeds 0..11."""
    policy = _TestPolicy()
    return {seed: policy.infer(make_example(TINY, seed=seed))["actions"] for seed in range(12)}


@pytest.fixture(scope="module")
def replicas(ray_cluster):
    options = ReplicaOptions(replicas=2, device="cpu", num_cpus=1, app_name=APP, request_timeout_s=30.0,
                             health_check_period_s=0.5, health_check_timeout_s=10.0)
    handle = ray_backend.deploy(_make_test_policy, options, warmup_batch_sizes=(1, 4), seed=0)
    policy = RayPolicy(handle, TINY, replicas=2, request_timeout_s=30.0)
    yield policy
    serve.delete(APP)


@pytest.fixture(scope="module")
def server(replicas):
    s = PolicyServer(replicas, port=0, max_batch=4, max_wait_ms=20.0, warmup_batch_sizes=(),
                     metadata=replicas.metadata()).start()
    yield s
    s.stop()


def _check(reply, request_id, seed, expected):
    assert isinstance(reply, dict), reply
    assert reply["request_id"] == request_id
    assert reply["actions"].shape == (H, D) and reply["actions"].dtype == np.float32
    np.testing.assert_allclose(reply["actions"], expected[seed], atol=1e-5, rtol=0)


def _clients_in_parallel(url, n_clients, n_requests, expected, tag):
    """n_clients threads, each its own connection, n_requests each; returns (ok, errors)."""
    ok, errors, lock = [], [], threading.Lock()

    def run(c):
        try:
            with Client(url, timeout_s=60) as client:
                for r in range(n_requests):
                    seed, rid = (c * n_requests + r) % 12, f"{tag}-c{c}-r{r}"
                    reply = client.infer(dict(make_example(TINY, seed=seed), request_id=rid))
                    _check(reply, rid, seed, expected)
                    with lock:
                        ok.append(rid)
        except Exception as e:  # collected, asserted below
            with lock:
                errors.append(f"client {c}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client hung"
    return ok, errors


# ----------------------------------------------------------------------------- serve --replicas


def test_front_end_metadata_health_and_replicas(server, replicas):
    with Client(server.url) as c:
        meta = c.metadata
    assert meta["backend"] == "ray-serve" and meta["replicas"] == 2
    assert meta["workload"] == "tiny" and meta["action_horizon"] == H and meta["dtype"] == "float32"
    assert meta["conventions"] == "none" and meta["checkpoint"] is None  # the replicas' policy fields reach clients
    assert len({d["replica"] for d in meta["replica_devices"]}) == 2
    assert all(d["device"] == "cpu" and d["node_id"] for d in meta["replica_devices"])
    health = f"http://127.0.0.1:{server.port}/healthz"
    assert urllib.request.urlopen(health, timeout=10).read() == b"ok\n"
    infos = replicas.describe_replicas()
    assert len(infos) == 2 and {i["warmup_batch_sizes"][-1] for i in infos} == {4}


def _metric(server, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_two_replicas_serve_8_concurrent_clients(server, replicas, expected):
    before = sum(replicas.replica_calls.values())
    observations = _metric(server, "vlaperf_batched_observations_total")
    infer_count = _metric(server, "vlaperf_infer_seconds_count")
    ok, errors = _clients_in_parallel(server.url, 8, 6, expected, "load")
    assert not errors, errors[:3]
    assert len(ok) == len(set(ok)) == 48  # nothing lost, every reply matched to its own request and seed
    assert len([r for r in replicas.replica_calls if r]) == 2, replicas.replica_calls  # both replicas served
    assert sum(replicas.replica_calls.values()) > before
    # the front end's /metrics count every replica's calls
    assert _metric(server, "vlaperf_batched_observations_total") - observations == 48
    assert _metric(server, "vlaperf_infer_seconds_count") - infer_count == sum(replicas.replica_calls.values()) - before


def test_loadgen_against_replicas(server):
    from vlaperf.serve.loadgen import run_loadgen

    result = run_loadgen(server.url, clients=[8], requests=4, warmup=1, timeout_s=120)
    phase = result["loadgen"]["phases"][0]
    assert result["loadgen"]["passed"], phase["error_samples"]
    assert phase["ok"] == 32 and phase["misrouted"] == 0 and phase["lost"] == 0
    assert result["server"]["backend"] == "ray-serve"


def test_errors_and_auth_unchanged_with_replicas(replicas, expected):
    with PolicyServer(replicas, port=0, api_key="sekret", warmup_batch_sizes=(), metadata=replicas.metadata()) as s:
        with pytest.raises(AuthenticationError, match="HTTP 401"):
            Client(s.url)
        with Client(s.url, api_key="sekret") as c:
            bad = make_example(TINY, seed=0)
            bad["observation/state"] = bad["observation/state"][:3]
            with pytest.raises(ServerError) as err:
                c.infer(dict(bad, request_id="bad-1"))
            assert err.value.kind == "InputError" and err.value.request_id == "bad-1"
            assert "expected 8 values, got 3" in err.value.message
            _check(c.infer(dict(make_example(TINY, seed=2), request_id="good-1")), "good-1", 2, expected)


def test_killed_replica_errors_in_flight_then_is_replaced(server, replicas, expected, tmp_path):
    names = ray_backend.replica_actor_names(APP)
    assert len(names) == 2
    mark = tmp_path / "replica"
    slow = dict(make_example(TINY, seed=1), request_id="slow-1", **{SLOW_KEY: 20.0, MARK_KEY: str(mark)})
    reply: dict = {}

    def send():
        with Client(server.url, timeout_s=60) as c:
            t = time.monotonic()
            try:
                reply["value"] = c.infer(slow)
            except ServerError as e:
                reply["error"] = e
            reply["at"] = time.monotonic() - t

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = mark.read_text()
    assert victim in names
    t_kill = time.monotonic()
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    sender.join(30)
    assert not sender.is_alive(), "the in-flight request hung"
    assert "error" in reply, reply  # an error frame, promptly: not the reply 20 s later, not a hang
    assert reply["error"].kind == "InternalError" and reply["error"].message.startswith("ReplicaDied")
    assert reply["error"].request_id == "slow-1"
    waited = time.monotonic() - t_kill
    print(f"in-flight request answered {waited:.2f} s after the kill")
    assert waited < 10
    assert replicas.failures["ReplicaDied"] >= 1
    # Ray Serve replaces the dead replica; then every request succeeds again.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = ray_backend.replica_actor_names(APP)
        if len(now) == 2 and victim not in now and ray_backend.running_replicas(APP) == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no replacement replica within 90 s: {ray_backend.replica_actor_names(APP)}")
    ok, errors = _clients_in_parallel(server.url, 4, 4, expected, "after")
    assert not errors, errors[:3]
    assert len(ok) == 16
    ids = {d["replica"] for d in replicas.describe_replicas()}
    assert len(ids) == 2 and victim.rsplit("#", 1)[1] not in ids  # the replacement has a new id


# ----------------------------------------------------------------------------- matrix --ray


def _matrix_args(argv):
    """`vlaperf matrix ...` parsed by vlaperf's own parser, with the --ray options added to it
    (also before vlaperf.cli registers them itself)."""
    from vlaperf.cli import build_parser
    from vlaperf.profile.ray_matrix import add_matrix_arguments

    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
    matrix = sub.choices["matrix"]
    if not any("--ray" in a.option_strings for a in matrix._actions):
        add_matrix_arguments(matrix)
    return parser.parse_args(["matrix", *argv])


def test_matrix_ray_merges_tasks_with_device_per_row(ray_cluster, tmp_path, capsys):
    from vlaperf.profile.ray_matrix import run_matrix_ray

    out = tmp_path / "matrix.json"
    args = _matrix_args(["--ray", "--workload", "tiny", "--variants", "for_loop;exact", "--warmup", "2", "--iters", "5",
                         "--action-horizon", "6", "--no-progress", "--json", str(out)])
    assert args.ray and args.ray_address is None
    assert run_matrix_ray(args) == 0
    result = read_result(out)  # a valid vlaperf.result/1 file
    assert result["command"] == "matrix" and result["workload"] == {"id": "tiny", "overrides": {"horizon": 6}}
    rows = {r["variant"]: r for r in result["variants"]}
    assert list(rows) == ["reference", "for_loop", "exact"]
    for name in ("for_loop", "exact"):
        r = rows[name]
        assert r["equivalence"]["passed"]
        assert r["timers"]["wall_ms"]["count"] == 5 and r["reference"]["timers"]["wall_ms"]["count"] == 5
        assert r["ratio"]["wall_ms"]["speedup"] > 0
        assert r["device"]["device"] == "cpu" and r["device"]["node_id"] and r["device"]["pid"]
        assert r["env"]["torch"]
    assert rows["reference"]["timed_in_task_of"] == "for_loop"
    assert rows["reference"]["ratio"]["wall_ms"]["speedup"] == 1.0
    assert rows["for_loop"]["device"]["pid"] != rows["exact"]["device"]["pid"]  # one fresh process per task
    assert result["ray"]["tasks"] == 2 and len(result["ray"]["devices"]) == 1  # one node, the CPU: one device
    assert "for_loop" in capsys.readouterr().out


def test_device_record_has_the_same_keys_on_the_cpu():
    """A CPU task's record has the GPU fields too (None), so rows from mixed devices share one schema."""
    from vlaperf.profile.ray_matrix import device_record

    rec = device_record("cpu")
    assert rec["device"] == "cpu" and rec["gpu_name"] is None and rec["gpu_uuid"] is None
    assert {"hostname", "pid", "cuda_visible_devices", "node_id", "node_ip", "ray_gpu_ids"} <= set(rec)


def test_device_record_outside_ray_does_not_start_ray(monkeypatch):
    """Called outside a Ray worker (run_variant or a PolicyReplica used directly), the record leaves the Ray fields
    empty rather than asking Ray, which would start a private local Ray just to name its node; an unknown device
    still gives every key."""
    from vlaperf.profile.ray_matrix import device_record

    outside = _fake_ray(initialized=False)
    outside.get_runtime_context = lambda: pytest.fail("asked Ray for its context")  # not an Exception: not swallowed
    monkeypatch.setitem(sys.modules, "ray", outside)
    rec = device_record("cpu")
    assert (rec["node_id"], rec["node_ip"], rec["ray_gpu_ids"], rec["device"]) == (None, None, [], "cpu")
    bad = device_record("no-such-device")
    assert set(bad) == set(rec) and bad["device"] is None


def test_matrix_ray_refuses_an_unknown_lever_before_any_replica_starts():
    from vlaperf.cli import CliError
    from vlaperf.profile.ray_matrix import ray_matrix

    with pytest.raises(CliError, match="unknown lever 'no_such_lever'"):
        ray_matrix(["tiny"], "no_such_lever", device="cpu", warmup=1, iters=2, log=lambda m: None)


def test_matrix_ray_reports_a_failed_variant(ray_cluster):
    from vlaperf.profile.ray_matrix import ray_matrix

    # a lever that cannot apply on the replica's device: the replica reports the row as skipped
    (result,) = ray_matrix(["tiny"], "for_loop,cuda_graph", device="cpu", warmup=1, iters=2, log=lambda m: None)
    row = result["variants"][-1]
    assert row["variant"] == "for_loop,cuda_graph" and "timers" not in row and "needs a CUDA device" in row["skipped"]
    assert result["variants"][0]["variant"] == "reference" and "timers" not in result["variants"][0]
    json.dumps(result, default=str)


# ----------------------------------------------------------------------------- audited by mutation: no Ray started
# The parts of both modules that are plain Python (argument checks, routing of Ray's errors, the replica's own
# bookkeeping, the records and their merging), run against stand-ins for ray / ray.serve where Ray would be asked.


class _Fake:
    """A stand-in module or object: attributes given as keywords; records the calls of `call(name)`."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)
        self.calls = []

    def call(self, name, result=None):
        def f(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return result(*args, **kwargs) if callable(result) else result
        return f


def _fake_ray(initialized=False, init=None):
    """A stand-in `ray` whose init and shutdown are recorded."""
    ray_ = _Fake(__version__="9.9.9")
    ray_.is_initialized = lambda: initialized
    ray_.init = ray_.call("init", init)
    ray_.shutdown = ray_.call("shutdown")
    return ray_


def test_require_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ray_backend.RayUnavailable, match=r"scale-out needs Ray Serve .*pip install 'vlaperf\[ray\]'"):
        ray_backend.require_ray()


def test_ray_init_local_or_address_and_its_errors(monkeypatch):
    """A private local Ray (started: True) only without an address; RAY_ADDRESS counts as one (as for ray.init);
    an initialised Ray is used as it is; a failure names the address."""
    fake = _fake_ray()
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (fake, None))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_backend.ray_init(None, num_cpus=3, runtime_env={"env_vars": {"A": "1"}}) is True
    assert fake.calls == [("init", (), {"num_cpus": 3, "num_gpus": None, "include_dashboard": False,
                                        "log_to_driver": True, "runtime_env": {"env_vars": {"A": "1"}}})]
    fake.calls.clear()
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert ray_backend.ray_init(None) is False  # a cluster someone else runs: not ours to shut down
    assert fake.calls == [("init", (), {"address": "head:6379", "include_dashboard": False, "log_to_driver": True})]
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (_fake_ray(initialized=True), None))
    assert ray_backend.ray_init(None, num_cpus=3) is False

    def refuse(**kwargs):
        raise ConnectionError("refused")

    monkeypatch.setattr(ray_backend, "require_ray", lambda: (_fake_ray(init=refuse), None))
    with pytest.raises(ray_backend.RayUnavailable,
                       match=r"^cannot start or reach Ray \(address 'other:6379'\): ConnectionError: refused$"):
        ray_backend.ray_init("other:6379")


def test_shutdown_stops_our_ray_or_deletes_our_app_within_its_time(monkeypatch):
    fake, serve_ = _fake_ray(initialized=True), _Fake()
    release = threading.Event()
    serve_.delete = serve_.call("delete", lambda name: release.wait(5))  # a cluster that stopped answering
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (fake, serve_))
    from ray._private import auto_init_hook

    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", True)
    ray_backend.shutdown("app-a", stop_ray=True)
    assert fake.calls == [("shutdown", (), {})] and serve_.calls == []
    assert auto_init_hook.enable_auto_connect is False  # a Serve thread left over must not start a new local Ray
    fake.calls.clear()
    t = time.monotonic()
    ray_backend.shutdown("app-b", stop_ray=False, timeout_s=0.2)
    assert time.monotonic() - t < 2  # bounded: the front end exits
    release.set()
    assert serve_.calls == [("delete", ("app-b",), {})] and fake.calls == []
    not_running = _fake_ray(initialized=False)
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (not_running, serve_))
    ray_backend.shutdown("app-c", stop_ray=True)
    assert not_running.calls == [] and len(serve_.calls) == 1


def test_deploy_places_one_batch_per_replica_with_its_hang_timeout(monkeypatch):
    """One call at a time per replica (max_ongoing_requests=1), a whole GPU each on cuda, no HTTP proxy, and the
    replica's hang timeout twice the front end's request timeout unless given."""
    serve_ = _Fake()
    deployment = _Fake()
    deployment.options = deployment.call("options", lambda **kw: deployment)
    deployment.bind = deployment.call("bind", lambda *a: "app")
    serve_.start = serve_.call("start")
    serve_.deployment = serve_.call("deployment", lambda cls, name: deployment)
    serve_.run = serve_.call("run", lambda app, **kw: "handle")
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (None, serve_))
    build = object()
    options = ReplicaOptions(replicas=3, device="cuda:1", num_cpus=2.0, app_name="a1", request_timeout_s=7.0,
                             health_check_period_s=1.5, health_check_timeout_s=9.0, max_constructor_retry_count=4)
    assert ray_backend.deploy(build, options, warmup_batch_sizes=[1, 4], seed=5) == "handle"
    assert serve_.calls[0] == ("start", (), {"proxy_location": "Disabled"})
    assert serve_.calls[1] == ("deployment", (ray_backend.PolicyReplica,), {"name": "VlaperfPolicy"})
    assert serve_.calls[2] == ("run", ("app",), {"name": "a1", "route_prefix": None})
    (_, _, kw), (_, bound, _) = deployment.calls
    assert kw == {"num_replicas": 3, "ray_actor_options": {"num_cpus": 2.0, "num_gpus": 1}, "max_ongoing_requests": 1,
                  "health_check_period_s": 1.5, "health_check_timeout_s": 9.0, "max_constructor_retry_count": 4,
                  "graceful_shutdown_timeout_s": 5}
    assert bound == (build, (1, 4), 5, 14.0)
    deployment.calls.clear()
    ray_backend.deploy(build, ReplicaOptions(replicas=1, device="cpu", num_cpus=0.5, hang_timeout_s=3.0))
    (_, _, kw), (_, bound, _) = deployment.calls
    assert kw["ray_actor_options"] == {"num_cpus": 0.5} and bound[-1] == 3.0  # no GPU asked for on the CPU


def test_replica_names_and_running_count_are_this_apps(monkeypatch):
    fake, serve_ = _fake_ray(), _Fake()
    fake.util = _Fake(list_named_actors=lambda all_namespaces: [
        {"name": "SERVE_REPLICA::app#VlaperfPolicy#zz"}, {"name": "SERVE_REPLICA::other#VlaperfPolicy#aa"},
        {"name": "SERVE_CONTROLLER_ACTOR"}, {"name": "SERVE_REPLICA::app#VlaperfPolicy#bb"}])
    dep = _Fake(replica_states={"RUNNING": 2, "STARTING": 1})
    serve_.status = lambda: _Fake(applications={"app": _Fake(deployments={"VlaperfPolicy": dep})})
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (fake, serve_))
    assert ray_backend.replica_actor_names("app") == ["SERVE_REPLICA::app#VlaperfPolicy#bb",
                                                      "SERVE_REPLICA::app#VlaperfPolicy#zz"]
    assert ray_backend.running_replicas("app") == 2  # the one still starting is not counted
    assert ray_backend.running_replicas("no-such-app") == 0


class _Response:
    def __init__(self, value=None, error=None):
        self.value, self.error, self.cancelled = value, error, False

    def result(self, timeout_s):
        self.timeout_s = timeout_s
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self):
        self.cancelled = True


class _Handle:
    """A deployment handle whose every call answers with `response` (and records the batch it got)."""

    def __init__(self, response=None, described=()):
        self.response, self.batches, self.described = response, [], list(described)
        self.infer = _Fake(remote=self._remote)

    def _remote(self, batch):
        self.batches.append(batch)
        return self.response

    def broadcast(self, name):
        assert name == "describe"
        return _Fake(results=lambda: self.described)


def test_ray_policy_returns_one_row_for_one_observation_and_counts_replicas():
    actions = np.arange(2 * H * D, dtype=np.float32).reshape(2, H, D)
    reply = {"actions": actions, "policy_timing": {"infer_ms": 3.0}, "replica": "r1"}
    handle = _Handle(_Response(reply))
    policy = RayPolicy(handle, TINY, replicas=3, request_timeout_s=4.5)
    assert policy.concurrency == 3  # the server's inference threads: one batch in flight per replica
    ex = make_example(TINY, seed=0)
    out = policy.infer(ex)
    assert handle.batches == [[ex]] and handle.response.timeout_s == 4.5
    np.testing.assert_array_equal(out["actions"], actions[0])
    assert out["policy_timing"] == {"infer_ms": 3.0} and out["replica"] == "r1"
    out = policy.infer([ex, ex])
    np.testing.assert_array_equal(out["actions"], actions)
    assert policy.replica_calls == {"r1": 2} and not policy.failures


def test_ray_policy_timeout_cancels_the_call():
    response = _Response(error=TimeoutError())
    policy = RayPolicy(_Handle(response), TINY, replicas=1, request_timeout_s=2.5)
    with pytest.raises(ray_backend.ReplicaTimeout,
                       match=r"^no replica answered within 2.5 s; the request was cancelled$"):
        policy.infer(make_example(TINY, seed=0))
    assert response.cancelled and policy.failures == {"ReplicaTimeout": 1} and not policy.replica_calls


def test_ray_errors_become_the_servers_error_kinds():
    """The policy's own exception comes back as itself; a dead actor, worker or node is ReplicaDied; any other
    Ray failure is ReplicaUnavailable naming Ray's error (each counted); no traceback reaches the message."""
    from ray.exceptions import ActorDiedError, NodeDiedError, RaySystemError, RayTaskError, WorkerCrashedError

    policy = RayPolicy(None, TINY, replicas=2)
    cause = ValueError("observation/state: expected 8 values")
    assert policy._translate(RayTaskError("infer", "Traceback ...", cause)) is cause
    no_cause = policy._translate(RayTaskError("infer", "Traceback (most recent call last):\n  x\nKeyError: 'a'", None))
    assert type(no_cause) is RuntimeError and str(no_cause).endswith("KeyError: 'a'")
    for e in (ActorDiedError(), WorkerCrashedError(), NodeDiedError("node gone")):
        died = policy._translate(e)
        assert type(died) is ray_backend.ReplicaDied and str(died).startswith("the replica running this batch died")
    assert policy.failures == {"ReplicaDied": 3}

    class ActorLookalikeError(Exception):  # not Ray's: nothing says a replica died
        pass

    for e, name in ((RaySystemError("lost the GCS"), "RaySystemError"), (ActorLookalikeError(), "ActorLookalikeError")):
        other = policy._translate(e)
        assert type(other) is ray_backend.ReplicaUnavailable
        assert str(other) == f"{name} from Ray Serve; retry the request"
    assert policy.failures == {"ReplicaDied": 3, "ReplicaUnavailable": 2}


def test_ray_policy_metadata_from_the_replicas():
    """The policy fields come from the first replica (sorted by id); the warm-up is the slowest replica's; every
    replica's device is listed."""
    infos = [{"replica": "b", "actor_name": "A", "image_size": 32, "dtype": "float32", "conventions": "none",
              "checkpoint": None, "levers": [], "levers_label": "reference", "device": "cpu", "warmup_s": 4.0,
              "warmup_batch_sizes": [1, 4], "node": {"hostname": "h2", "node_id": "n2", "device": "cpu"}},
             {"replica": "a", "actor_name": "Z", "image_size": 32, "dtype": "float32", "conventions": "none",
              "checkpoint": None, "levers": ["x"], "levers_label": "exact", "device": "cpu", "warmup_s": 1.5,
              "warmup_batch_sizes": [1], "node": {"hostname": "h1", "node_id": "n1", "device": "cpu",
                                                  "gpu_name": "G", "gpu_uuid": "GPU-1"}}]
    policy = RayPolicy(_Handle(described=infos), TINY, replicas=2, request_timeout_s=7.5)
    described = policy.describe_replicas()
    assert [d["replica"] for d in described] == ["a", "b"]
    meta = policy.metadata(described)
    assert meta["levers_label"] == "exact" and meta["replica_warmup_batch_sizes"] == [1]
    assert meta["conventions"] == "none" and meta["image_size"] == 32 and "warmup_batch_sizes" not in meta
    assert (meta["backend"], meta["replicas"], meta["replica_timeout_s"], meta["warmup_s"]) == ("ray-serve", 2, 7.5, 4.0)
    assert meta["replica_devices"] == [
        {"replica": "a", "hostname": "h1", "node_id": "n1", "device": "cpu", "gpu_name": "G", "gpu_uuid": "GPU-1"},
        {"replica": "b", "hostname": "h2", "node_id": "n2", "device": "cpu", "gpu_name": None, "gpu_uuid": None}]
    assert RayPolicy(None, TINY, replicas=1).metadata([])["warmup_s"] == 0.0


def test_describe_policy_fields_from_any_policy():
    """The replica's description reads what a policy has: its workload, model, levers and io."""
    model = build_model(TINY.preset, device="cpu", seed=0)
    stats = _Fake(describe=lambda: "quantile (state 8, actions 7)")
    policy = _Fake(workload=TINY, model=model, num_steps=3, sample=model.sample_actions, device="cpu",
                   transform=_Fake(tokenizer=_Fake()), norm_stats=stats, conventions=_Fake(name="openpi:pi0_libero"))
    model.checkpoint = {"path": "/ckpts/run-7/model.safetensors", "layout": "openpi"}
    d = ray_backend.describe_policy(policy)
    assert d == {"workload": "tiny", "image_size": model.config.vision.image_size, "dtype": "float32", "num_steps": 3,
                 "levers": [], "levers_label": "reference", "device": "cpu", "tokenizer": "_Fake",
                 "normalization": "quantile (state 8, actions 7)", "conventions": "openpi:pi0_libero",
                 "checkpoint": {"name": "model.safetensors", "layout": "openpi"}}
    other = _Fake(sample=_Fake().call("sample"))  # a bound method of something that is not the model
    assert ray_backend.describe_policy(_Fake(model=model, sample=other.sample)).get("levers") is None


def test_build_policy_from_spec_as_serve_builds_it(monkeypatch):
    """The serve default on the CPU is the exact engine, checked, with the reference weights released; 'reference'
    and 'none' serve the model itself; the spec's steps and chunk reach the policy."""
    import vlaperf.check
    from vlaperf.engine import Engine

    released = []
    monkeypatch.setattr(Engine, "release_reference_weights", lambda self: released.append(self.name) or 0)
    policy = ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu", "steps": 3, "action_horizon": 6})
    d = ray_backend.describe_policy(policy)
    exact = Engine(policy.model, "exact")
    assert (d["levers"], d["levers_label"]) == (exact.levers.names(), exact.name) and released == [exact.name]
    assert policy.num_steps == 3 and policy.workload.horizon == 6 and d["conventions"] == "none"
    assert policy.infer(make_example(policy.workload, seed=0))["actions"].shape == (6, D)
    for levers in ("reference", "none"):
        d = ray_backend.describe_policy(ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu",
                                                                            "levers": levers}))
        assert (d["levers"], d["levers_label"]) == ([], "reference")
    ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu", "keep_reference": True})
    assert len(released) == 1
    openpi = ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu", "levers": "reference",
                                                 "conventions": "openpi:pi0_libero"})
    assert ray_backend.describe_policy(openpi)["conventions"] == "openpi:pi0_libero"
    monkeypatch.setattr(vlaperf.check, "check_equivalence", lambda *a: {"passed": False, "rel_l2": 0.5, "tolerance": 0.01})
    with pytest.raises(RuntimeError, match=r"fails equivalence \(rel_l2 0.5 > 0.01\); refusing to serve it"):
        ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu", "levers": "exact"})
    ray_backend.build_policy_from_spec({"workload": "tiny", "device": "cpu", "levers": "exact", "no_check": True})


class _RecordingPolicy:
    """Records each batch (its size, prompts and whether its arrays are writable); `fail` / `hold` for the health
    checks."""

    def __init__(self):
        self.workload, self.batches, self.fail, self.hold, self.entered = TINY, [], None, None, None

    def infer(self, batch):
        if self.entered is not None:
            self.entered.set()
        if self.hold is not None:
            self.hold.wait(10)
        if self.fail is not None:
            raise self.fail

        def arrays(v):
            return ([v] if isinstance(v, np.ndarray) else [a for x in v.values() for a in arrays(x)]
                    if isinstance(v, dict) else [a for x in v for a in arrays(x)] if isinstance(v, list) else [])

        self.batches.append((len(batch), [ex.get("prompt") for ex in batch], all(a.flags.writeable for a in arrays(batch))))
        return {"actions": np.zeros((len(batch), H, D), np.float32), "policy_timing": {"infer_ms": 1.0}}


def test_policy_replica_warms_up_every_size_and_prompt_then_seeds(monkeypatch):
    import asyncio

    import torch

    from vlaperf.inputs import warmup_prompts

    inner = _RecordingPolicy()
    replica = ray_backend.PolicyReplica(lambda: inner, warmup_batch_sizes=(4, 1, 4), seed=5)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))  # every replica draws the same noise from here on
    prompts = warmup_prompts(TINY.prompt_slots)
    assert len(prompts) >= 2
    assert inner.batches == [(b, [p] * b, True) for p in prompts for b in (1, 4)]
    info = replica.describe()
    assert info["warmup_batch_sizes"] == [1, 4] and info["replica"].startswith("local-") and info["calls"] == 0
    inner.batches.clear()
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False  # as Ray hands numpy arguments over
    ex = dict(make_example(TINY, seed=0), **{"observation/state": frozen, "extra": {"a": frozen}, "more": [frozen]})
    out = asyncio.run(replica.infer([ex, ex]))
    assert inner.batches == [(2, [ex["prompt"]] * 2, True)] and not frozen.flags.writeable
    assert out["actions"].shape == (2, H, D) and out["replica"] == info["replica"]
    assert out["policy_timing"] == {"infer_ms": 1.0} and replica.describe()["calls"] == 1


def test_policy_replica_health_fails_on_a_cuda_error_or_a_stuck_call():
    import asyncio

    inner = _RecordingPolicy()
    replica = ray_backend.PolicyReplica(lambda: inner, hang_timeout_s=1.0)
    inner.fail = ValueError("observation/state: bad")  # the request's fault: the replica stays healthy
    with pytest.raises(ValueError):
        asyncio.run(replica.infer([make_example(TINY)]))
    replica.check_health()
    # a malformed observation or NaN actions: returned, not raised, so Ray Serve logs no traceback for each; the
    # front end raises it as the server's error frame
    from vlaperf.inputs import InputError
    from vlaperf.policy import NonFiniteActions

    for refused in (InputError("observation/state: expected 8 values"), NonFiniteActions("rows [0]", rows=[0])):
        inner.fail = refused
        out = asyncio.run(replica.infer([make_example(TINY)]))
        assert out == {"refused": refused, "replica": replica.replica_id}
        policy = RayPolicy(_Handle(_Response(out)), TINY, replicas=1)
        with pytest.raises(type(refused)) as raised:
            policy.infer(make_example(TINY))
        assert raised.value is refused and policy.replica_calls == {replica.replica_id: 1}
    replica.check_health()
    inner.hold, inner.entered = threading.Event(), threading.Event()
    inner.fail = None
    call = threading.Thread(target=lambda: asyncio.run(replica.infer([make_example(TINY)])))
    call.start()
    assert inner.entered.wait(10)
    replica.check_health()  # a call just begun is no hang
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # unhealthy once the call has run for 1 s
        try:
            replica.check_health()
        except RuntimeError as e:
            assert str(e) == f"replica {replica.replica_id}: one call has run for more than 1 s"
            break
        time.sleep(0.05)
    else:
        pytest.fail("a call stuck for 10 s left the replica healthy")
    inner.hold.set()
    call.join(10)
    replica.check_health()  # the call finished: healthy again
    inner.hold = None

    class AcceleratorError(RuntimeError):  # torch's name for a sticky device error
        pass

    for fatal in (RuntimeError("CUDA error: an illegal memory access was encountered"), AcceleratorError("boom")):
        replica = ray_backend.PolicyReplica(lambda: inner)
        inner.fail = fatal
        with pytest.raises(RuntimeError):
            asyncio.run(replica.infer([make_example(TINY)]))
        with pytest.raises(RuntimeError, match=f"hit a fatal error: {type(fatal).__name__}: "):
            replica.check_health()
        inner.fail = None


@pytest.fixture
def no_ray_cli(monkeypatch):
    """`vlaperf serve --replicas N` with Ray's side stood in for: a cluster of `gpus["n"]` GPUs (not started by
    us), deploy recorded (and raising `deploy_error` if set), shutdown recorded."""
    from vlaperf.cli import main as run_cli

    state = {"gpus": 0, "deploy_error": None, "deployed": [], "shutdown": []}
    monkeypatch.setattr(ray_backend, "ray_init", lambda address: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0, "GPU": float(state["gpus"])})

    def deploy(build, options, warmup, seed):
        state["deployed"].append((build, options, warmup, seed))
        if state["deploy_error"] is not None:
            raise state["deploy_error"]
        return _Handle(described=[{"replica": "r0", "dtype": "float32", "device": "cpu", "warmup_batch_sizes": [1]}])

    monkeypatch.setattr(ray_backend, "deploy", deploy)
    monkeypatch.setattr(ray_backend, "shutdown", lambda app, stop: state["shutdown"].append((app, stop)))
    monkeypatch.setattr(PolicyServer, "serve_forever", lambda self: pytest.fail("served"))
    state["run"] = lambda *argv: run_cli(["serve", "--port", "0", "--replicas", *argv])
    return state


def test_serve_replicas_needs_a_gpu_per_replica(no_ray_cli, capsys):
    no_ray_cli["gpus"] = 1
    assert no_ray_cli["run"]("2", "--ray-app-name", "mine") == 2  # cuda by default: the cluster has a GPU
    assert "--replicas 2 needs 2 GPUs (one per replica); the Ray cluster has 1" in capsys.readouterr().err
    assert no_ray_cli["deployed"] == [] and no_ray_cli["shutdown"] == [("mine", False)]


def test_serve_replicas_deploys_the_spec_and_reports_a_failed_start(no_ray_cli, capsys):
    """What the replicas are built from (the CLI's options, cuda:N as 'cuda': Ray picks each replica's GPU), and a
    replica that fails to build: exit 1 naming the error's last line, nothing served."""
    no_ray_cli["gpus"] = 2
    no_ray_cli["deploy_error"] = RuntimeError("Traceback (most recent call last):\n  ...\nValueError: bad weights")
    assert no_ray_cli["run"]("2", "--device", "cuda:1", "--replica-timeout-s", "9", "--replica-cpus", "3",
                             "--steps", "4", "--no-check", "--seed", "7") == 1
    assert "vlaperf serve: the replicas failed to start: ValueError: bad weights" in capsys.readouterr().err
    ((build, options, warmup, seed),) = no_ray_cli["deployed"]
    assert build.func is ray_backend.build_policy_from_spec and seed == 7
    spec = build.args[0]
    assert (spec["workload"], spec["device"], spec["steps"], spec["seed"], spec["no_check"]) == ("libero-pi0", "cuda", 4,
                                                                                                7, True)
    assert (options.replicas, options.device, options.num_cpus, options.request_timeout_s) == (2, "cuda:1", 3.0, 9.0)
    assert no_ray_cli["shutdown"] == [("vlaperf", False)]


def test_serve_replicas_called_directly_checks_the_checkpoint_before_deploying(no_ray_cli, tmp_path):
    """A script calling serve_replicas itself (no `checked`) gets the CLI's file checks before any replica starts."""
    from vlaperf.cli import CliError, build_parser
    from vlaperf.serve.commands import _replica_options

    args = build_parser().parse_args(["serve", "--replicas", "1", "--workload", "tiny", "--port", "0",
                                      "--checkpoint", str(tmp_path / "missing.safetensors")])
    _replica_options(args)
    with pytest.raises(CliError, match="^--checkpoint: "):
        ray_backend.serve_replicas(args, None, [1])
    assert no_ray_cli["deployed"] == [] and no_ray_cli["shutdown"] == [("vlaperf", False)]


def test_serve_replicas_serves_the_front_end_and_exits_130_on_ctrl_c(no_ray_cli, monkeypatch, capsys):
    served = []

    def serve_forever(self):
        served.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(PolicyServer, "serve_forever", serve_forever)
    assert no_ray_cli["run"]("1", "--workload", "tiny", "--max-message-mb", "2") == 130
    (server,) = served
    extra = server._extra_metadata  # what the server adds to its metadata once it listens
    assert extra["backend"] == "ray-serve" and extra["replicas"] == 1 and extra["replica_timeout_s"] == 60.0
    assert server.max_message_bytes == 2 * 2**20 and server.warmup_batch_sizes == ()  # the replicas warmed up
    assert no_ray_cli["deployed"][0][0].args[0]["device"] == "cpu" and no_ray_cli["shutdown"] == [("vlaperf", False)]


def _cache_env(monkeypatch) -> dict:
    """The compile-cache variables, cleared for the test and restored after it; returns a reader of them. Set first so
    that monkeypatch records them even where they were unset: a delenv of an unset variable records nothing, and the
    folder the test's replica set then stayed in os.environ for every later test of the process."""
    from vlaperf.engine.compile import CACHE_ENV

    for var in CACHE_ENV.values():
        monkeypatch.setenv(var, "unset-by-test")
        monkeypatch.delenv(var)
    return lambda: {sub: os.environ.get(var) for sub, var in CACHE_ENV.items()}


def test_serve_replicas_applies_compile_cache_in_each_replica(no_ray_cli, monkeypatch, tmp_path):
    """`serve --replicas N --compile-cache DIR`: each replica keeps its compile caches in DIR, as `serve` does without
    Ray (the option used to stop at the front end, which compiles nothing)."""
    cache = tmp_path / "cache"
    no_ray_cli["deploy_error"] = RuntimeError("stop after the deploy")
    assert no_ray_cli["run"]("1", "--workload", "tiny", "--compile-cache", str(cache)) == 1
    ((build, _, _, _),) = no_ray_cli["deployed"]
    assert build.args[0]["compile_cache"] == str(cache)
    cache_env = _cache_env(monkeypatch)
    build()  # what each replica runs
    assert cache_env() == {"triton": str(cache / "triton"), "inductor": str(cache / "inductor")}


def test_matrix_ray_applies_compile_cache_in_each_task(fake_run_matrix_ray, monkeypatch, tmp_path):
    """`matrix --ray --compile-cache DIR`: the folder reaches every task, which keeps its compile caches there."""
    from vlaperf.profile.ray_matrix import run_variant

    cache = tmp_path / "cache"
    assert fake_run_matrix_ray["run"]("--workload", "tiny", "--compile-cache", str(cache)) == 0
    assert fake_run_matrix_ray["calls"][-1][1]["compile_cache"] == str(cache)
    cache_env = _cache_env(monkeypatch)
    run_variant({"workload": "tiny", "variant": "exact", "device": "cpu", "steps": 1, "warmup": 1, "iters": 1,
                 "compile_cache": str(cache)})
    assert cache_env() == {"triton": str(cache / "triton"), "inductor": str(cache / "inductor")}


def test_ray_matrix_sends_compile_cache_with_each_task(fake_matrix_ray, tmp_path):
    fake_matrix_ray["matrix"](["tiny"], "for_loop;exact", device="cpu", compile_cache=str(tmp_path))
    assert [t["compile_cache"] for t in fake_matrix_ray["tasks"]] == [str(tmp_path)] * 2


def test_run_variant_times_the_variant_beside_its_own_reference(monkeypatch):
    """One task, run here without Ray: the task's shape reaches the model, the variant and the reference are timed
    `iters` times each, and the row's speedup is the reference's median over the variant's."""
    import vlaperf.cli
    import vlaperf.profile.matrix
    from vlaperf.profile.ray_matrix import run_variant

    setup, seen = vlaperf.cli.setup, []
    monkeypatch.setattr(vlaperf.cli, "setup", lambda args: seen.append(vars(args).copy()) or setup(args))
    monkeypatch.setattr(vlaperf.profile.matrix, "first_call_seconds", lambda *a: 12.5)  # the engine's, before its check
    # the allocator's peak, as read in turn: the reference's first call, the variant's, then each one's warm-up (the
    # reference's first call is the task's first: the variant's check would otherwise have warmed the model)
    peaks = iter([100, 400, 250, 250])
    monkeypatch.setattr("vlaperf.timing._reset_peak_memory", lambda device: None)
    monkeypatch.setattr("vlaperf.timing._peak_memory", lambda device: next(peaks))
    task = {"workload": "tiny", "variant": "exact", "device": "cpu", "steps": 1, "batch": 2, "action_horizon": 6,
            "seed": 3, "warmup": 1, "iters": 2}
    row = run_variant(task)
    assert (row["peak_memory_bytes"], row["reference"]["peak_memory_bytes"]) == (400, 250)  # over first call + warm-up
    monkeypatch.setattr("vlaperf.timing._peak_memory", lambda device: None)  # as on the CPU, for the rest
    assert {k: seen[0][k] for k in ("workload", "device", "steps", "batch", "action_horizon", "seed")} == \
        {"workload": "tiny", "device": "cpu", "steps": 1, "batch": 2, "action_horizon": 6, "seed": 3}
    wall, ref = row["timers"]["wall_ms"], row["reference"]["timers"]["wall_ms"]
    assert wall["count"] == 2 and ref["count"] == 2 and row["warmup_s"] >= 0 and row["task_s"] > 0
    assert row["first_call_s"] == 12.5 and row["equivalence"]["passed"]
    assert row["ratio"]["wall_ms"]["speedup"] == pytest.approx(ref["median"] / wall["median"])
    assert row["reference"]["ratio"]["wall_ms"]["speedup"] == 1.0
    assert row["device"]["device"] == "cpu" and row["dtype"] == "float32"
    skipped = run_variant(dict(task, variant="for_loop,cuda_graph"))  # cannot apply on the CPU: not timed
    assert "needs a CUDA device" in skipped["skipped"] and "timers" not in skipped and "reference" not in skipped


def test_run_variant_in_policy_mode_times_both_served_paths(monkeypatch):
    """A task with mode 'policy' times the variant's and its reference's Policy.infer, as `vlaperf matrix --mode
    policy` does in one process."""
    from vlaperf.policy import Policy
    from vlaperf.profile.ray_matrix import run_variant

    owners = []
    infer = Policy.infer
    monkeypatch.setattr(Policy, "infer", lambda self, example: owners.append(type(self.sample.__self__).__name__)
                        or infer(self, example))
    row = run_variant({"workload": "tiny", "variant": "exact", "device": "cpu", "steps": 1, "warmup": 1, "iters": 2,
                       "mode": "policy"})
    assert row["timers"]["wall_ms"]["count"] == 2 and row["reference"]["timers"]["wall_ms"]["count"] == 2
    assert owners.count("Pi0Model") == owners.count("Engine") >= 1 + 2


def _task_row(task, device=None, variant=None):
    """A timed matrix row as run_variant returns it, with made-up numbers."""
    timers = {"wall_ms": {"median": 2.0, "p95": 2.5, "count": task["iters"]}, "cuda_event_ms": None}
    ratio = {"wall_ms": {"speedup": 1.5, "significant": True, "ratio_p10": 1.4, "ratio_p90": 1.6}, "cuda_event_ms": None}
    ref_ratio = {"wall_ms": {"speedup": 1.0, "significant": False, "ratio_p10": 1.0, "ratio_p90": 1.0}}
    return {"variant": variant or task["variant"], "levers": [], "workload": task["workload"], "dtype": "bfloat16",
            "device": device or {"node_id": "n1", "gpu_uuid": "GPU-1", "device": "cuda:0", "hostname": "h1", "pid": 1},
            "env": {"task_of": task["variant"]}, "timers": timers, "ratio": ratio, "first_call_s": 0.5,
            "warmup_s": 0.1, "peak_memory_bytes": 0, "equivalence": {"passed": True, "rel_l2": 1e-3},
            "reference": {"timers": timers, "first_call_s": 0.4, "warmup_s": 0.1, "peak_memory_bytes": 0,
                          "ratio": ref_ratio}}


@pytest.fixture
def fake_matrix_ray(monkeypatch):
    """ray_matrix against a stand-in cluster: tasks run `state["run"](task)` at once, in order; what each task got
    and the task options are recorded."""
    from vlaperf.profile import ray_matrix as rm

    state = {"tasks": [], "options": [], "refs": [], "gpus": 2, "run": _task_row}
    fake = _fake_ray()
    fake.cluster_resources = lambda: {"CPU": 8.0, "GPU": float(state["gpus"])}
    fake.nodes = lambda: [{}, {}]

    def remote(**options):
        state["options"].append(options)

        def submit(task):
            state["tasks"].append(task)
            try:
                outcome = ("ok", state["run"](task))
            except Exception as e:
                outcome = ("error", e)
            state["refs"].append(outcome)
            return len(state["refs"]) - 1  # an object ref
        return lambda fn: _Fake(remote=submit)

    def get(ref):
        kind, value = state["refs"][ref]
        if kind == "error":
            raise value
        return value

    fake.remote, fake.get = remote, get
    fake.wait = lambda refs, num_returns: (refs[:num_returns], refs[num_returns:])
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(rm, "run_variant", None)  # never run here: the stand-in runs state["run"]
    state["matrix"] = lambda wids, variants, **kw: rm.ray_matrix(wids, variants, **dict(dict(log=lambda m: None), **kw))
    return state


def test_ray_matrix_sends_its_mode_with_each_task_and_refuses_another(fake_matrix_ray):
    results = fake_matrix_ray["matrix"](["tiny"], "for_loop;exact", device="cpu", mode="policy")
    assert [t["mode"] for t in fake_matrix_ray["tasks"]] == ["policy", "policy"] and results[0]["mode"] == "policy"
    with pytest.raises(ValueError, match="mode: expected 'model' or 'policy', got 'forward'"):
        fake_matrix_ray["matrix"](["tiny"], "exact", device="cpu", mode="forward")
    assert len(fake_matrix_ray["tasks"]) == 2  # refused before any task


def test_ray_matrix_one_task_per_variant_and_workload_merged(fake_matrix_ray):
    (a, b) = fake_matrix_ray["matrix"](["tiny", "libero-pi0"], "for_loop;exact", device="cuda", action_horizon=6,
                                       seed=4, warmup=3, iters=7, cpus_per_task=2.0)
    tasks = fake_matrix_ray["tasks"]
    assert [(t["workload"], t["variant"]) for t in tasks] == [("tiny", "for_loop"), ("tiny", "exact"),
                                                               ("libero-pi0", "for_loop"), ("libero-pi0", "exact")]
    assert all(t["device"] == "cuda" and t["action_horizon"] == 6 and t["seed"] == 4 and (t["warmup"], t["iters"]) ==
               (3, 7) for t in tasks)
    assert fake_matrix_ray["options"] == [{"num_cpus": 2.0, "num_gpus": 1, "max_calls": 1, "max_retries": 1}]
    assert [r["variant"] for r in a["variants"]] == ["reference", "for_loop", "exact"]
    assert all(r["workload"] == "tiny" for r in a["variants"]) and b["variants"][1]["workload"] == "libero-pi0"
    assert a["workload"] == {"id": "tiny", "overrides": {"horizon": 6}} and (a["warmup"], a["iters"]) == (3, 7)
    assert a["variant"] == {"levers": [], "label": "for_loop;exact", "dtype": "bfloat16"}
    assert a["ray"]["tasks"] == 2 and a["ray"]["task_resources"] == {"num_cpus": 2.0, "num_gpus": 1}
    ref = a["variants"][0]
    assert ref["timed_in_task_of"] == "for_loop" and ref["device"]["gpu_uuid"] == "GPU-1" and ref["equivalence"] is None
    assert ref["ratio"]["wall_ms"]["speedup"] == 1.0 and ref["first_call_s"] == 0.4


def test_ray_matrix_devices_are_distinct_gpus(fake_matrix_ray):
    """Two GPUs of one node are two devices; two tasks on one GPU (two processes) are one."""
    gpus = {"for_loop": "GPU-1", "exact": "GPU-2", "for_loop,sdpa": "GPU-1"}
    fake_matrix_ray["run"] = lambda task: _task_row(task, device={
        "node_id": "n1", "gpu_uuid": gpus[task["variant"]], "device": "cuda:0", "pid": len(fake_matrix_ray["tasks"])})
    (result,) = fake_matrix_ray["matrix"](["tiny"], "for_loop;exact;for_loop,sdpa", device="cuda")
    assert [d["gpu_uuid"] for d in result["ray"]["devices"]] == ["GPU-1", "GPU-2"]


def test_ray_matrix_reports_failed_tasks_and_the_reference_of_the_first_timed_one(fake_matrix_ray):
    def run(task):
        if task["variant"] == "for_loop":
            raise RuntimeError("Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory")
        return _task_row(task)

    fake_matrix_ray["run"] = run
    (result,) = fake_matrix_ray["matrix"](["tiny"], "for_loop;exact", device="cuda")
    ref, failed, timed = result["variants"]
    assert failed == {"variant": "for_loop", "levers": [], "workload": "tiny",
                      "skipped": "task failed: torch.OutOfMemoryError: CUDA out of memory"}
    assert ref["timed_in_task_of"] == "exact" and result["env"] == {"task_of": "exact"}
    assert result["variant"]["dtype"] == "bfloat16"

    def fail(task):
        raise RuntimeError("worker died")

    fake_matrix_ray["run"] = fail
    (result,) = fake_matrix_ray["matrix"](["tiny"], "exact", device="cuda")
    ref, failed = result["variants"]
    assert ref["skipped"] == "no variant task finished, so the reference was not timed" and "timers" not in ref


def test_ray_matrix_refuses_a_typo_before_asking_the_cluster(fake_matrix_ray):
    fake_matrix_ray["gpus"] = "not asked"  # float() of it fails: the cluster was asked
    from vlaperf.cli import CliError

    with pytest.raises(CliError, match="unknown lever 'no_such_lever'"):
        fake_matrix_ray["matrix"](["tiny"], "exact;no_such_lever")


def test_ray_matrix_of_the_reference_alone_is_one_task(fake_matrix_ray):
    (result,) = fake_matrix_ray["matrix"](["tiny"], "reference", device="cuda")
    assert [t["variant"] for t in fake_matrix_ray["tasks"]] == ["reference"]
    assert [r["variant"] for r in result["variants"]] == ["reference"] and result["ray"]["tasks"] == 1


def test_ray_matrix_refuses_cuda_without_gpus_and_places_cpu_tasks(fake_matrix_ray):
    fake_matrix_ray["gpus"] = 0
    with pytest.raises(RuntimeError, match="^device cuda asked for, but the Ray cluster has no GPU$"):
        fake_matrix_ray["matrix"](["tiny"], "exact", device="cuda")
    assert fake_matrix_ray["tasks"] == []
    fake_matrix_ray["matrix"](["tiny"], "exact", cpus_per_task=1.5)  # no GPU: the CPU by default
    assert fake_matrix_ray["tasks"][0]["device"] == "cpu" and fake_matrix_ray["options"][-1]["num_gpus"] == 0


@pytest.fixture
def fake_run_matrix_ray(monkeypatch):
    """run_matrix_ray with Ray stood in for (started by us: shut down at the end) and ray_matrix recorded."""
    from vlaperf.profile import ray_matrix as rm

    state = {"gpus": 1, "calls": [], "written": [], "error": None, "rows": {}}
    fake = _fake_ray()
    fake.cluster_resources = lambda: {"GPU": float(state["gpus"])}
    state["ray"] = fake
    monkeypatch.setattr(ray_backend, "ray_init", lambda address: state.setdefault("started", True))
    monkeypatch.setattr(ray_backend, "require_ray", lambda: (fake, None))

    def ray_matrix(wids, variants, **kw):
        state["calls"].append((wids, kw))
        if state["error"]:
            raise state["error"]
        return [{"workload": {"id": w}, "variants": state["rows"].get(w, [])} for w in wids]

    monkeypatch.setattr(rm, "ray_matrix", ray_matrix)
    monkeypatch.setattr(rm, "print_ray_matrix", lambda r: None)
    import vlaperf.report.schema

    monkeypatch.setattr(vlaperf.report.schema, "write_result", lambda r, path: state["written"].append(Path(path).name))
    state["run"] = lambda *argv: rm.run_matrix_ray(_matrix_args(["--ray", *argv]))
    return state


def test_matrix_ray_workloads_and_their_files(fake_run_matrix_ray, tmp_path):
    from vlaperf.cli import CliError

    with pytest.raises(CliError, match=r"^unknown workload\(s\) nope; expected some of: "):
        fake_run_matrix_ray["run"]("--workload", "tiny,nope")
    assert "started" not in fake_run_matrix_ray  # before Ray starts
    assert fake_run_matrix_ray["run"]("--workload", " tiny , libero-pi0 ", "--json", str(tmp_path / "m.json"),
                                      "--ray-cpus-per-task", "2") == 0
    wids, kw = fake_run_matrix_ray["calls"][-1]
    assert wids == ["tiny", "libero-pi0"] and kw["cpus_per_task"] == 2.0 and kw["device"] == "cuda"
    assert fake_run_matrix_ray["written"] == ["m.tiny.json", "m.libero-pi0.json"]  # one file per workload
    assert fake_run_matrix_ray["run"]("--json", str(tmp_path / "one.json")) == 0
    assert fake_run_matrix_ray["calls"][-1][0] == ["libero-pi0"] and fake_run_matrix_ray["written"][-1] == "one.json"
    assert len(fake_run_matrix_ray["ray"].calls) == 2  # each run shut down the Ray it started
    assert fake_run_matrix_ray["calls"][-1][1]["mode"] == "model"
    assert fake_run_matrix_ray["run"]("--workload", "tiny", "--mode", "policy") == 0
    assert fake_run_matrix_ray["calls"][-1][1]["mode"] == "policy"
    # a variant that failed its check on any workload: every file written, exit 1 (as a matrix in one process)
    fake_run_matrix_ray["rows"] = {"libero-pi0": [{"variant": "sdpa", "equivalence": {"passed": False}}],
                                   "tiny": [{"variant": "sdpa", "equivalence": {"passed": True}},
                                            {"variant": "graph", "skipped": "could not run: cuda_graph needs CUDA"}]}
    assert fake_run_matrix_ray["run"]("--workload", "tiny", "--json", str(tmp_path / "t.json")) == 0
    assert fake_run_matrix_ray["run"]("--workload", "tiny,libero-pi0", "--json", str(tmp_path / "f.json")) == 1
    assert fake_run_matrix_ray["written"][-2:] == ["f.tiny.json", "f.libero-pi0.json"]


def test_matrix_ray_errors_are_cli_errors_and_ray_is_stopped(fake_run_matrix_ray):
    from vlaperf.cli import CliError

    fake_run_matrix_ray["gpus"] = 0
    with pytest.raises(CliError, match=r"^--device cuda: the Ray cluster has no GPU$"):
        fake_run_matrix_ray["run"]("--device", "cuda")
    assert fake_run_matrix_ray["ray"].calls == [("shutdown", (), {})] and fake_run_matrix_ray["calls"] == []
    fake_run_matrix_ray["error"] = RuntimeError("device cuda asked for, but the Ray cluster has no GPU")
    with pytest.raises(CliError, match="^device cuda asked for"):
        fake_run_matrix_ray["run"]("--workload", "tiny")
    assert len(fake_run_matrix_ray["ray"].calls) == 2


def test_print_ray_matrix_rows(capsys):
    from vlaperf.profile.ray_matrix import print_ray_matrix

    task = {"variant": "x", "workload": "tiny", "iters": 5}
    long = ",".join(["fuse_projections", "static_prefix", "cuda_graph", "compile", "for_loop"])  # 58 characters
    rows = [_task_row(task, variant="reference"), _task_row(task, variant=long),
            {"variant": "for_loop", "levers": [], "workload": "tiny", "skipped": "task failed: boom"}]
    rows[0]["ratio"] = rows[0]["reference"]["ratio"]  # the reference's own: never marked as noise
    rows[1]["ratio"]["wall_ms"]["significant"] = False
    print_ray_matrix({"workload": {"id": "tiny"}, "variants": rows, "ray": {"tasks": 2, "devices": [{}]}})
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert any(line.startswith("│ reference │") and "1.00x │" in line for line in lines), lines
    assert any(line.startswith("│ fuse+static_prefix+graph+compile+loop │") and "1.50x (noise)" in line for line in lines), lines
    assert any(line.startswith("│ for_loop │ task failed: boom │") for line in lines), lines
