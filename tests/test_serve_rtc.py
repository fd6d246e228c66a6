"""Real-time chunking served: `Policy.infer(..., rtc=)` against the reference's guided call, the previous chunk
re-expressed relative to a new state for delta actions, and the server's per-connection chunks over websockets
(`vlaperf serve --rtc`), on the CPU with the `tiny` workload.

A robot with RTC runs its chunk while the next one is computed: the observation is taken after `executed` actions
of the current chunk, and `delay` more run before the new chunk arrives. The new chunk is held to what is left of
the old one (frozen over the delay, fading to the execution horizon)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vlaperf.check import check_equivalence
from vlaperf.conventions import get_conventions
from vlaperf.engine import Engine
from vlaperf.inputs import make_example, random_noise
from vlaperf.models.pi0 import Guidance, build_model, rtc_prefix_weights, rtc_step_weights
from vlaperf.normalize import ArrayStats, NormStats
from vlaperf.policy import ModelChunk, Policy, RtcConfig, RtcRequest  # the three as docs/serving.md imports them
from vlaperf.workloads import get_workload

# openpi-client opens its connection without a context manager; websockets >= 17 warns.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
TINY = get_workload("tiny")
H, D = TINY.horizon, TINY.robot_action_dim  # 10, 7
RTC = RtcConfig(execution_horizon=6, max_guidance_weight=5.0)


@pytest.fixture(scope="module")
def model():
    return build_model(TINY.preset, device="cpu", seed=0)


def fixed_noise(model):
    return random_noise(TINY, model.config, seed=3)[:1]


def rtc_policy(model, rtc=RTC, seen=None, **kw) -> Policy:
    """The same starting noise for every observation; `seen` collects the guidance of each call."""
    noise = fixed_noise(model)

    def sample(obs, _noise, num_steps, guidance=None):
        if seen is not None:
            seen.append(guidance)
        return model.sample_actions(obs, noise.expand(obs.batch, -1, -1).contiguous(), num_steps, guidance)

    return Policy(model, sample, TINY, rtc=rtc, **kw)


def expected_guided(model, example, previous: ModelChunk, executed: int, delay: int) -> torch.Tensor:
    """The reference's guided call, its guidance written out by hand: the previous chunk from `executed` on,
    zero-padded; the delay frozen; the weights fading to the execution horizon (at most what is left)."""
    policy = rtc_policy(model, rtc=None)
    obs = policy.transform(example)
    target = torch.zeros(1, H, model.config.action_dim)
    target[0, : H - executed] = torch.from_numpy(previous.actions[executed:])
    weights = rtc_prefix_weights(delay, min(RTC.execution_horizon, H - executed), H, RTC.schedule)
    guidance = Guidance(target, weights, rtc_step_weights(TINY.steps, RTC.max_guidance_weight))
    return model.sample_actions(obs, fixed_noise(model), TINY.steps, guidance)[0]


# ----------------------------------------------------------------------------- the policy


def test_guided_infer_equals_the_reference_guided_call(model):
    policy = rtc_policy(model)
    first = policy.infer(make_example(TINY, seed=0), rtc=[None])
    plain = rtc_policy(model, rtc=None).infer(make_example(TINY, seed=0))
    np.testing.assert_array_equal(first["actions"], plain["actions"])  # no previous chunk: unguided
    assert first["guided"] == [False] and "chunks" not in plain
    [chunk] = first["chunks"]
    assert chunk.actions.shape == (H, model.config.action_dim) and chunk.actions.dtype == np.float32
    np.testing.assert_array_equal(chunk.actions[:, :D], first["actions"])  # no statistics: the model's units

    example = make_example(TINY, seed=1)
    second = policy.infer(example, rtc=[RtcRequest(chunk, executed=3, delay=2)])
    assert second["guided"] == [True]
    want = expected_guided(model, example, chunk, 3, 2)
    np.testing.assert_allclose(second["chunks"][0].actions, want.numpy(), atol=1e-5, rtol=0)
    # the guidance holds the frozen positions toward the leftover: closer than the unguided chunk is
    unguided = rtc_policy(model, rtc=None).infer(example)["actions"]
    leftover = chunk.actions[3:5, :D]
    assert np.linalg.norm(second["actions"][:2] - leftover) < 0.5 * np.linalg.norm(unguided[:2] - leftover)


def test_a_batch_mixes_guided_and_unguided_rows(model):
    policy = rtc_policy(model)
    examples = [make_example(TINY, seed=s) for s in (4, 5, 6)]
    chunks = policy.infer(examples, rtc=[None] * 3)["chunks"]
    out = policy.infer(examples, rtc=[None, RtcRequest(chunks[1], 2, 1), RtcRequest(chunks[2], H, 0)])
    assert out["guided"] == [False, True, False]  # executed = H: nothing of it left
    alone = [policy.infer(examples[0], rtc=[None]), policy.infer(examples[1], rtc=[RtcRequest(chunks[1], 2, 1)]),
             policy.infer(examples[2], rtc=[None])]
    for i, one in enumerate(alone):
        np.testing.assert_allclose(out["actions"][i], one["actions"], atol=1e-5, rtol=0, err_msg=str(i))


def test_delta_actions_leftover_is_reexpressed_relative_to_the_new_state(model):
    """openpi's delta actions (and LeRobot's relative ones) are relative to the state of their own observation:
    the leftover of a chunk computed at state s0 is re-expressed relative to the new state s1 (as LeRobot's
    reanchor_relative_rtc_prefix), so that it still means the same absolute actions for the robot."""
    mask = (True,) * 6 + (False,)
    conventions = dataclasses.replace(get_conventions("none"), name="test delta", delta_action_mask=mask)
    A, S = model.config.action_dim, TINY.state_dim
    rng = np.random.default_rng(0)
    stats = NormStats(ArrayStats(rng.normal(size=S), rng.uniform(0.5, 2, S)),
                      ArrayStats(rng.normal(size=A), rng.uniform(0.5, 2, A)), quantile=False)
    seen: list = []
    policy = rtc_policy(model, seen=seen, norm_stats=stats, conventions=conventions)
    first = policy.infer(make_example(TINY, seed=0), rtc=[None])
    example = make_example(TINY, seed=1)  # another state
    policy.infer(example, rtc=[RtcRequest(first["chunks"][0], executed=4, delay=1)])
    target = seen[-1].target[0].numpy().astype(np.float64)
    # what the robot got from the first call, from position 4 on, in absolute actions: the new call's target,
    # unnormalized and with the new state added back, is the same
    new_state = np.asarray(example["observation/state"], np.float64)
    again = conventions.actions_to_robot(stats.unnormalize_actions64(target[None, : H - 4]), new_state[None])[0]
    np.testing.assert_allclose(again[:, :D], first["actions"][4:], atol=1e-4, rtol=0)
    assert not np.allclose(target[: H - 4, :6], first["chunks"][0].actions[4:, :6], atol=1e-3)  # moved


@pytest.mark.parametrize("quantile", [False, True], ids=["zscore", "quantile"])
def test_normalize_actions_inverts_unnormalize(quantile):
    rng = np.random.default_rng(1)
    a = ArrayStats(rng.normal(size=5), rng.uniform(0.1, 2, 5), rng.normal(size=5) - 2, rng.normal(size=5) + 2)
    for convention in ("openpi", "lerobot"):
        stats = NormStats(None, a, quantile=quantile, convention=convention)
        x = rng.normal(size=(3, 7))  # two dims past the statistics: unchanged both ways
        np.testing.assert_allclose(stats.normalize_actions64(stats.unnormalize_actions64(x)), x, atol=1e-12)
        np.testing.assert_array_equal(stats.normalize_actions64(x)[:, 5:], x[:, 5:])


def test_bad_rtc_requests_are_named(model):
    policy, example = rtc_policy(model), make_example(TINY, seed=0)
    [chunk] = policy.infer(example, rtc=[None])["chunks"]
    cases = [
        (rtc_policy(model, rtc=None), [None], "rtc: this policy has no real-time chunking settings"),
        (policy, [None, None], "rtc: expected a list of 1 RtcRequest-or-None (one per observation), got 2"),
        (policy, [RtcRequest(chunk, H + 1, 0)], f"rtc.executed: expected an integer in [0, {H}]"),
        (policy, [RtcRequest(chunk, 0, True)], f"rtc.delay: expected an integer in [0, {H}]"),
        (policy, [RtcRequest(ModelChunk(chunk.actions[:4], chunk.state), 0, 0)], "rtc.previous: expected the "
         f"ModelChunk of a call of this policy, actions ({H}, {model.config.action_dim}), got (4, "),
        (policy, ["x"], "rtc: expected an RtcRequest or None, got str"),
    ]
    for p, rtc, message in cases:
        with pytest.raises(ValueError) as info:
            p.infer(example, rtc=rtc)
        assert message in str(info.value), (message, str(info.value))
    with pytest.raises(TypeError, match="rtc: expected a vlaperf.models.pi0.RtcConfig or None, got dict"):
        Policy(model, model.sample_actions, TINY, rtc={"execution_horizon": 5})


def test_the_equivalence_check_covers_the_guided_call(model):
    engine = Engine(model, "for_loop,static_kv_cache,fuse_projections")
    eq = check_equivalence(model, engine, TINY, rtc=RTC)
    assert eq["passed"] and eq["guided"] and eq["rel_l2"] < 1e-4
    assert "guided" not in check_equivalence(model, engine, TINY)

    class Unguided:  # a variant that ignores the guidance: the guided check fails it
        name = "ignores guidance"

        def sample_actions(self, obs, noise, num_steps, guidance=None):
            return engine.sample_actions(obs, noise, num_steps)

    assert check_equivalence(model, Unguided(), TINY)["passed"]
    bad = check_equivalence(model, Unguided(), TINY, rtc=RTC)
    assert not bad["passed"] and bad["rel_l2"] > 1e-2


# ----------------------------------------------------------------------------- the server

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

from vlaperf.serve.client import connect_options  # noqa: E402
from vlaperf.serve.protocol import packb, parse_error_frame, unpackb  # noqa: E402
from vlaperf.serve.server import PolicyServer  # noqa: E402


@pytest.fixture(scope="module")
def rtc_server(model):
    s = PolicyServer(rtc_policy(model), port=0, max_batch=4, max_wait_ms=20.0).start()
    yield s
    s.stop()


def _connect(server):
    ws = connect(server.url, compression=None, max_size=None, **connect_options(connect))
    return ws, unpackb(ws.recv(timeout=10))


def _ask(ws, payload):
    ws.send(packb(payload))
    reply = ws.recv(timeout=60)
    return parse_error_frame(reply) if isinstance(reply, str) else unpackb(reply)


def _rtc(seed, executed, delay):
    return {**make_example(TINY, seed=seed), "rtc/executed": executed, "rtc/delay": delay}


def test_served_rtc_guides_each_connection_by_its_own_last_chunk(model, rtc_server):
    local = rtc_policy(model)
    guided0, unguided0 = rtc_server.stats["rtc_guided"], rtc_server.stats["rtc_unguided"]  # other tests share it
    ws, meta = _connect(rtc_server)
    other, _ = _connect(rtc_server)
    with ws, other:
        assert meta["rtc"] == {"keys": ["rtc/executed", "rtc/delay"], "execution_horizon": 6,
                               "max_guidance_weight": 5.0, "schedule": "linear"}
        first = _ask(ws, _rtc(0, 0, 2))  # the connection's first chunk: nothing to guide by
        assert first["rtc"]["guided"] is False and "no previous chunk" in first["rtc"]["reason"]
        want_first = local.infer(make_example(TINY, seed=0), rtc=[None])
        np.testing.assert_allclose(first["actions"], want_first["actions"], atol=1e-5, rtol=0)
        # another connection has its own chunks: its first request is unguided too
        assert _ask(other, _rtc(7, 3, 2))["rtc"]["guided"] is False
        second = _ask(ws, _rtc(1, 3, 2))
        assert second["rtc"] == {"guided": True, "executed": 3, "delay": 2}
        want = local.infer(make_example(TINY, seed=1), rtc=[RtcRequest(want_first["chunks"][0], 3, 2)])
        np.testing.assert_allclose(second["actions"], want["actions"], atol=1e-5, rtol=0)
        # a request without the keys is unguided, but its chunk is the next one's previous chunk
        plain = _ask(ws, make_example(TINY, seed=2))
        assert "rtc" not in plain
        third = _ask(ws, _rtc(3, 4, 1))
        want_plain = local.infer(make_example(TINY, seed=2), rtc=[None])
        want = local.infer(make_example(TINY, seed=3), rtc=[RtcRequest(want_plain["chunks"][0], 4, 1)])
        np.testing.assert_allclose(third["actions"], want["actions"], atol=1e-5, rtol=0)
        done = _ask(ws, _rtc(4, H, 0))  # the whole chunk executed: nothing left to hold to
        assert done["rtc"]["guided"] is False and "nothing of the previous chunk is left" in done["rtc"]["reason"]
    # GET /metrics counts them: guided 2 (second, third), unguided 3 (first, the other connection's, done)
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{rtc_server.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("vlaperf_rtc"))
    assert int(samples["vlaperf_rtc_guided_observations_total"]) - guided0 == 2
    assert int(samples["vlaperf_rtc_unguided_observations_total"]) - unguided0 == 3


def test_the_openpi_client_sends_the_rtc_keys(model, rtc_server):
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    client = wcp.WebsocketClientPolicy("127.0.0.1", rtc_server.port)
    try:
        assert client.get_server_metadata()["rtc"]["execution_horizon"] == 6
        first = client.infer(make_example(TINY, seed=0))["actions"]
        reply = client.infer({**make_example(TINY, seed=1), "rtc/executed": 4, "rtc/delay": 2})
        assert reply["rtc"] == {"guided": True, "executed": 4, "delay": 2}
        # the frozen positions continue the first chunk: closer to its actions 4 and 5 than the unguided chunk is
        unguided = rtc_policy(model, rtc=None).infer(make_example(TINY, seed=1))["actions"]
        assert np.linalg.norm(reply["actions"][:2] - first[4:6]) < 0.5 * np.linalg.norm(unguided[:2] - first[4:6])
    finally:
        client._ws.close()


def test_served_rtc_in_a_list_request_keeps_a_chunk_per_position(model, rtc_server):
    local = rtc_policy(model)
    ws, _ = _connect(rtc_server)
    with ws:
        firsts = _ask(ws, [_rtc(0, 0, 0), _rtc(1, 0, 0)])
        assert [r["rtc"]["guided"] for r in firsts] == [False, False]
        seconds = _ask(ws, [_rtc(2, 2, 1), make_example(TINY, seed=3)])
        assert seconds[0]["rtc"]["guided"] is True and "rtc" not in seconds[1]
        chunks = local.infer([make_example(TINY, seed=0), make_example(TINY, seed=1)], rtc=[None, None])["chunks"]
        want = local.infer(make_example(TINY, seed=2), rtc=[RtcRequest(chunks[0], 2, 1)])  # position 0's own
        np.testing.assert_allclose(seconds[0]["actions"], want["actions"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("changes, message", [
    ({"rtc/executed": 1}, "rtc/delay: missing; real-time chunking takes both rtc/executed and rtc/delay"),
    ({"rtc/executed": H + 1, "rtc/delay": 0}, f"rtc/executed: expected an integer in [0, {H}] (the chunk's horizon), "
                                              "got 11"),
    ({"rtc/executed": 0, "rtc/delay": -1}, f"rtc/delay: expected an integer in [0, {H}]"),
    ({"rtc/executed": True, "rtc/delay": 0}, "rtc/executed: expected an integer"),
    ({"rtc/executed": 1.5, "rtc/delay": 0}, "rtc/executed: expected an integer"),
    ({"rtc/executed": "3", "rtc/delay": 0}, f"rtc/executed: expected an integer in [0, {H}] (the chunk's horizon), "
                                            "got '3'"),
])
def test_bad_rtc_keys_get_an_error_frame_and_the_chunk_is_kept(model, rtc_server, changes, message):
    ws, _ = _connect(rtc_server)
    with ws:
        _ask(ws, make_example(TINY, seed=0))
        error = _ask(ws, {**make_example(TINY, seed=1), **changes})
        assert error["error"] == "InputError" and message in error["message"], error
        # a refused request changes nothing: the chunk the robot still runs guides the next one
        assert _ask(ws, _rtc(1, 2, 2))["rtc"]["guided"] is True


def test_a_server_without_rtc_refuses_the_keys(model):
    with PolicyServer(rtc_policy(model, rtc=None), port=0) as server:
        ws, meta = _connect(server)
        with ws:
            assert "rtc" not in meta
            error = _ask(ws, _rtc(0, 0, 0))
            assert error["error"] == "InputError"
            assert "rtc/executed: this server does not run real-time chunking" in error["message"]
            assert _ask(ws, make_example(TINY, seed=0))["actions"].shape == (H, D)


def test_cli_rtc_options():
    import argparse

    from vlaperf.cli import CliError
    from vlaperf.serve.commands import _rtc_config, register

    parser = argparse.ArgumentParser(prog="vlaperf")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--rtc", "--rtc-execution-horizon", "8", "--rtc-schedule", "exp"])
    assert _rtc_config(args) == RtcConfig(execution_horizon=8, schedule="exp")
    assert _rtc_config(parser.parse_args(["serve"])) is None
    with pytest.raises(CliError, match="--rtc-max-guidance-weight: a setting of real-time chunking; add --rtc"):
        _rtc_config(parser.parse_args(["serve", "--rtc-max-guidance-weight", "3"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--rtc", "--rtc-schedule", "cosine"])
    from vlaperf.serve.commands import cmd_serve

    for extra, message in ((["--workload", "wam-tiny"], "wam-tiny \\(the world-action model\\) has no previous-chunk"),
                           (["--replicas", "2"], "--rtc: real-time chunking is served by the pi0 family in this "
                                                 "process; drop --replicas")):
        with pytest.raises(CliError, match=message):
            cmd_serve(parser.parse_args(["serve", "--rtc", "--port", "0", "--device", "cpu", *extra]))


# ----------------------------------------------------------------------------- rollout, executing while computing


def test_async_rollout_with_rtc_joins_chunks_smoothly(rtc_server, tmp_path, capsys):
    """rollout --rtc: the robot executes while the next chunk is computed, every switch guided; the action executed
    after a switch stays near the one the old chunk had there, much nearer than without the guidance (--async)."""
    from vlaperf.report.schema import read_result, write_result
    from vlaperf.serve.commands import print_rollout
    from vlaperf.serve.rollout import run_rollout

    kw = dict(episodes=2, steps_per_episode=24, control_hz=50.0, replan_every=3)
    guided = run_rollout(rtc_server.url, rtc=True, back_to_back=3, **kw)
    plain = run_rollout(rtc_server.url, execution="async", **kw)
    g, p = guided["rollout"], plain["rollout"]
    assert (g["execution"], g["rtc"], p["execution"], p["rtc"]) == ("async", True, "async", False)
    assert g["errors"] == 0 and not g["timed_out"] and g["switches"] >= 4
    assert g["guided_switches"] == g["switches"] and p["guided_switches"] == 0
    # the closed-loop baseline's calls are guided as the loop's are: the server holds the connection's last chunk
    assert g["back_to_back"]["guided"] == 6 and g["back_to_back"]["errors"] == 0
    # each episode: one synchronous first call, then one call per switch (and at most one in flight at its end)
    assert all(r["switches"] <= r["policy_calls"] - 1 <= r["switches"] + 1 for r in g["per_episode"])
    assert all(r["overran_at"] is None for r in g["per_episode"])  # a step does not wait for its call: no tie to one
    assert g["switch_jump"]["median"] < 0.5 * p["switch_jump"]["median"], (g["switch_jump"], p["switch_jump"])
    read_result(write_result(guided, tmp_path / "rollout.json"))
    print_rollout(guided)
    out = " ".join(capsys.readouterr().out.split())
    assert f"async: {g['switches']} chunk switches ({g['switches']} guided)" in out and "async, RTC)" in out


def test_rollout_rtc_needs_a_server_with_rtc(model):
    from vlaperf.serve.loadgen import LoadgenError
    from vlaperf.serve.rollout import run_rollout

    with PolicyServer(rtc_policy(model, rtc=None), port=0) as server:
        with pytest.raises(LoadgenError, match="does not serve real-time chunking .*--async executes while"):
            run_rollout(server.url, episodes=1, steps_per_episode=2, rtc=True)
        with pytest.raises(LoadgenError, match="execution must be 'sync' or 'async', got 'later'"):
            run_rollout(server.url, execution="later")
        ro = run_rollout(server.url, episodes=1, steps_per_episode=12, control_hz=50.0, replan_every=3,
                         execution="async")["rollout"]
        assert ro["switches"] >= 1 and ro["guided_switches"] == 0 and ro["errors"] == 0


def test_keep_warm_between_guided_requests_changes_no_answer(model):
    """`serve --rtc --keep-warm-ms`: the runs between a connection's requests rerun the last observation's host stages
    (its RTC keys included) and touch neither the model nor the connection's last chunk: the guided answer is the
    one a local policy gives."""
    import time

    local = rtc_policy(model)
    s = PolicyServer(rtc_policy(model), port=0, max_batch=1, warmup_batch_sizes=(), keep_warm_ms=1.0).start()
    try:
        ws, _ = _connect(s)
        with ws:
            first = _ask(ws, _rtc(0, 0, 2))
            deadline = time.perf_counter() + 10
            while s.stats["keep_warm_runs"] < 5:  # runs between the two requests
                assert time.perf_counter() < deadline, "no keep-warm run"
                time.sleep(0.01)
            second = _ask(ws, _rtc(1, 3, 2))
        assert second["rtc"] == {"guided": True, "executed": 3, "delay": 2}
        want_first = local.infer(make_example(TINY, seed=0), rtc=[None])
        np.testing.assert_array_equal(first["actions"], want_first["actions"])
        want = local.infer(make_example(TINY, seed=1), rtc=[RtcRequest(want_first["chunks"][0], 3, 2)])
        np.testing.assert_allclose(second["actions"], want["actions"], atol=1e-6, rtol=0)
    finally:
        s.stop()
