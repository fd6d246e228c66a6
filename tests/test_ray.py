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


def test_two_replicas_serve_8_concurrent_clients(server, replicas, expected):
    before = sum(replicas.replica_calls.values())
    ok, errors = _clients_in_parallel(server.url, 8, 6, expected, "load")
    assert not errors, errors[:3]
    assert len(ok) == len(set(ok)) == 48  # nothing lost, every reply matched to its own request and seed
    assert len([r for r in replicas.replica_calls if r]) == 2, replicas.replica_calls  # both replicas served
    assert sum(replicas.replica_calls.values()) > before


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
