"""The world-action model behind the same websocket server (wam-tiny on the CPU): the real
openpi client, input errors naming the field, batching, metadata, loadgen and rollout."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("websockets")

from vlaperf.engine.wam import WAM_EXACT, WamEngine  # noqa: E402
from vlaperf.models.wam import WamNoise, build_wam  # noqa: E402
from vlaperf.policy import HashTextEncoder, WamPolicy, make_wam_example  # noqa: E402
from vlaperf.serve.client import Client, ServerError  # noqa: E402
from vlaperf.serve.server import PolicyServer  # noqa: E402
from vlaperf.workloads import get_wam_workload  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

W = get_wam_workload("wam-tiny")


class FixedNoisePolicy(WamPolicy):
    """The same starting noise for every observation, whatever the batch: batched and unbatched
    replies must then agree."""

    def _noise(self, batch: int):
        g = torch.Generator().manual_seed(3)
        cfg = self.model.config
        video = torch.randn(1, cfg.video_frames, cfg.patches, cfg.patch_channels, generator=g)
        actions = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g)
        return WamNoise(video.expand(batch, -1, -1, -1).contiguous(), actions.expand(batch, -1, -1).contiguous())


@pytest.fixture(scope="module")
def model():
    return build_wam("wam-tiny", seed=0)


@pytest.fixture(scope="module")
def server(model):
    engine = WamEngine(model, "exact")
    s = PolicyServer(FixedNoisePolicy(model, engine.generate, W), port=0, max_batch=4, max_wait_ms=50.0).start()
    yield s
    s.stop()


def test_openpi_client_gets_the_reference_actions(server, model):
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    client = wcp.WebsocketClientPolicy(host="127.0.0.1", port=server.port)
    meta = client.get_server_metadata()
    assert meta["workload"] == "wam-tiny" and meta["layout"] == "wam" and meta["action_horizon"] == 4
    assert meta["levers_label"] == ",".join(WAM_EXACT)
    assert meta["sampler"] == {"steps": 4, "video_steps": 2, "sparsity": "none", "cfg_scale": 0.0, "shift": 3.0}
    example = make_wam_example(W, seed=5)
    out = client.infer(example)
    assert out["actions"].shape == (4, 8) and out["actions"].dtype == np.float32
    local = FixedNoisePolicy(model, model.generate, W).infer(example)["actions"]  # the reference, same noise
    assert np.abs(out["actions"] - local).max() < 1e-4


def test_batched_requests_match_unbatched(server):
    examples = [make_wam_example(W, seed=s) for s in range(3)]
    with Client(server.url) as c:
        alone = [c.infer(ex)["actions"] for ex in examples]
        together = np.stack([reply["actions"] for reply in c.infer(examples)])  # a list request: a reply each
    assert together.shape == (3, 4, 8)
    for a, b in zip(alone, together):
        assert np.abs(a - b).max() < 1e-4
    assert not np.allclose(alone[0], alone[1])


def test_a_prompt_sent_as_bytes_or_a_string_array_is_the_same_instruction(server, model):
    """The pi0 family's transform took a prompt as msgpack bin (bytes) or openpi's np.asarray(prompt); the
    world-action transform refused both as 'expected a string'. Both now decode to the same instruction."""
    example = make_wam_example(W, seed=4)
    with Client(server.url) as c:
        as_str = c.infer(example)["actions"]
        as_bytes = c.infer({**example, "prompt": example["prompt"].encode()})["actions"]
        other = c.infer({**example, "prompt": example["prompt"] + " slowly"})["actions"]
    assert np.array_equal(as_bytes, as_str)
    assert not np.allclose(other, as_str)  # the instruction does reach the model
    # a string array cannot cross the wire (the protocol carries numeric arrays only), but a Python caller's can
    local = FixedNoisePolicy(model, model.generate, W)
    assert np.array_equal(local.infer({**example, "prompt": np.asarray(example["prompt"])})["actions"],
                          local.infer(example)["actions"])


@pytest.mark.parametrize("change,message", [
    (lambda ex: ex.pop("observation/state"), "observation/state: missing"),
    (lambda ex: ex.update({"observation/context_latent": np.zeros((1, 8, 15), np.float32)}),
     "observation/context_latent: expected shape (1, 8, 16), got (1, 8, 15)"),
    (lambda ex: ex.update({"observation/state": np.full(8, np.nan, np.float32)}), "observation/state: holds NaN or inf"),
    (lambda ex: ex.update({"prompt": ""}), "prompt: empty; the world-action model is conditioned on its instruction"),
    (lambda ex: ex.update({"prompt": 7}), "prompt: expected a string, got int"),
    (lambda ex: ex.update({"prompt": b" "}), "prompt: empty; the world-action model"),
    (lambda ex: ex.pop("prompt"), "prompt: missing"),
    (lambda ex: ex.update({"observation/context_latent": [[1], [1, 2]]}),
     "observation/context_latent: expected a numeric array of shape (1, 8, 16)"),
    (lambda ex: ex.update({"prompt": "a" * 5000}), "prompt: 5000 characters, expected at most 4096"),
    (lambda ex: ex.update({"observation/state": np.full(ex["observation/state"].shape, 1e300)}),
     "observation/state: holds values beyond float32's range"),
])
def test_bad_observations_name_the_field_and_the_connection_survives(server, change, message):
    example = make_wam_example(W, seed=1)
    change(example)
    with Client(server.url) as c:
        with pytest.raises(ServerError, match="InputError") as info:
            c.infer(example)
        assert message in str(info.value)
        assert c.infer(make_wam_example(W, seed=2))["actions"].shape == (4, 8)


def test_loadgen_and_rollout_against_the_world_action_server(server, capsys):
    from vlaperf.serve.loadgen import run_loadgen
    from vlaperf.serve.rollout import run_rollout

    result = run_loadgen(server.url, clients=[3], requests=4, timeout_s=60, warmup=1)
    phase = result["loadgen"]["phases"][0]
    assert result["loadgen"]["passed"], phase["error_samples"]
    assert phase["ok"] == 12 and result["workload"]["id"] == "wam-tiny"
    from vlaperf.serve.commands import print_loadgen

    print_loadgen(result)  # three clients: a row each in the per-client table (past 16 only in the JSON)
    out = capsys.readouterr().out
    assert "per client round trip" in out and "in the JSON result" not in out and "all replies well-formed" in out
    ro = run_rollout(server.url, episodes=1, steps_per_episode=4, control_hz=50.0, replan_every=2)["rollout"]
    assert ro["errors"] == 0 and ro["action_horizon"] == 4 and ro["per_episode"][0]["policy_calls"] == 2


def test_serve_cli_builds_a_checked_world_action_policy(monkeypatch, capsys):
    """`vlaperf serve --workload wam-tiny` builds its policy through the equivalence check, then
    frees the reference weights the engine holds stacked copies of (as for pi0); the server itself
    is exercised above, so the listener is replaced here."""
    import vlaperf.serve.server as srv
    from vlaperf.cli import main

    seen = {}

    def fake_serve_forever(self):
        seen["policy"] = self._policy

    monkeypatch.setattr(srv.PolicyServer, "serve_forever", fake_serve_forever)
    assert main(["serve", "--workload", "wam-tiny", "--device", "cpu", "--port", "0", "--sparsity", "drop_middle"]) == 0
    policy = seen["policy"]
    assert isinstance(policy, WamPolicy) and policy.workload.sparsity == "drop_middle"
    assert "MB of reference weights the engine holds fused copies of" in capsys.readouterr().out
    assert policy.infer(make_wam_example(W))["actions"].shape == (4, 8)  # the engine runs on after the release


def test_serve_replicas_refuses_the_world_action_model(capsys):
    """Ray Serve replicas serve the pi0 family; asked for wam-tiny the command says so before
    starting Ray (exit 2), instead of failing inside the replica set-up."""
    from vlaperf.cli import main

    assert main(["serve", "--workload", "wam-tiny", "--device", "cpu", "--port", "0", "--replicas", "1"]) == 2
    assert "--replicas: Ray Serve replicas serve the pi0 family; wam-tiny" in capsys.readouterr().err


# ----------------------------------------------------------------------------- audited by mutation


def _serve_cli(monkeypatch, argv):
    """`vlaperf serve` on wam-tiny up to the listener: (exit code, the PolicyServer it built)."""
    import vlaperf.serve.server as srv
    from vlaperf.cli import main

    seen = {}
    monkeypatch.setattr(srv.PolicyServer, "serve_forever", lambda self: seen.setdefault("server", self))
    code = main(["serve", "--workload", "wam-tiny", "--device", "cpu", "--port", "0", *argv])
    return code, seen.get("server")


def test_serve_cli_hands_its_options_to_the_server(monkeypatch):
    """Each server option reaches PolicyServer in its own unit (MiB -> bytes), and --levers reference serves the
    model's own generate (no engine, so nothing to check or free)."""
    code, server = _serve_cli(monkeypatch, ["--levers", "reference", "--max-batch", "3", "--max-wait-ms", "1.5",
                                            "--max-message-mb", "2", "--max-queue", "70", "--max-connections", "5",
                                            "--warmup-batches", "all", "--allow-unauthenticated"])
    assert code == 0
    assert (server.max_batch, server.max_wait_ms, server.max_message_bytes, server.max_queued, server.max_connections,
            server.warmup_batch_sizes) == (3, 1.5, 2 * 2**20, 70, 5, (1, 2, 3))
    policy = server._policy
    assert policy.sample.__self__ is policy.model and policy.num_steps == W.steps
    import io

    from rich.console import Console

    from vlaperf.serve.commands import print_serve

    server.metadata = server._build_metadata()  # what start() sends; the listener was replaced
    buf = io.StringIO()
    print_serve(server, Console(file=buf, width=300))
    out = " ".join(buf.getvalue().split())
    assert "levers │ reference" in out and "messages up to 2 MiB, 70 observations queued, 5 connections" in out


def test_serve_cli_refuses_the_pi0_familys_options_for_the_world_action_model(capsys):
    from vlaperf.cli import main

    assert main(["serve", "--workload", "wam-tiny", "--device", "cpu", "--port", "0", "--action-horizon", "8"]) == 2
    assert "--tokenizer / --norm-stats / --conventions / --action-horizon: the pi0 family's; wam-tiny" in \
        capsys.readouterr().err


def test_serve_cli_refuses_a_world_action_variant_that_fails_its_check(monkeypatch, capsys):
    """A variant whose check fails is not served: exit 1 and the numbers on stderr; --no-check skips the check."""
    import vlaperf.check

    monkeypatch.setattr(vlaperf.check, "check_wam_equivalence",
                        lambda *a: {"passed": False, "rel_l2": 0.5, "video_rel_l2": 0.25, "tolerance": 0.01})
    code, server = _serve_cli(monkeypatch, [])
    assert code == 1 and server is None
    assert f"variant {','.join(WAM_EXACT)} fails equivalence (actions rel_l2 0.5, video 0.25 > 0.01); refusing to " \
        "serve it" in capsys.readouterr().err
    code, server = _serve_cli(monkeypatch, ["--no-check", "--keep-reference"])
    assert code == 0 and type(server._policy.sample.__self__) is WamEngine  # 'serve' on the CPU: the exact engine
    assert "freed" not in capsys.readouterr().out  # --keep-reference


def test_serve_cli_exit_codes_of_the_listener(monkeypatch, capsys):
    """A Ctrl-C during warm-up exits 130; a listener that cannot bind is a set-up error (2) naming the address."""
    import vlaperf.serve.server as srv
    from vlaperf.cli import main

    def interrupted(self):
        raise KeyboardInterrupt

    def cannot_bind(self):
        raise OSError("address in use")

    argv = ["serve", "--workload", "wam-tiny", "--device", "cpu", "--port", "0", "--levers", "reference"]
    monkeypatch.setattr(srv.PolicyServer, "serve_forever", interrupted)
    assert main(argv) == 130
    monkeypatch.setattr(srv.PolicyServer, "serve_forever", cannot_bind)
    assert main(argv) == 2
    assert "cannot listen on 127.0.0.1:0: address in use" in capsys.readouterr().err


def test_print_serve_describes_the_world_action_server(server):
    import io

    from rich.console import Console

    from vlaperf.serve.commands import print_serve

    buf = io.StringIO()
    print_serve(server, Console(file=buf, width=300))
    out = " ".join(buf.getvalue().split())  # the table's padding aside
    for row in ("action chunk │ 4 x 8 float32", "latents, state, prompt (text encoder HashTextEncoder)",
                "up to 4 per call, wait <= 50 ms", f"messages up to {server.max_message_bytes / 2**20:g} MiB",
                "auth │ none", "steps 4, video_steps 2, sparsity none"):
        assert row in out, out


def test_loadgen_command_exits_1_when_stopped_by_its_time_limit(server, tmp_path, capsys):
    """A phase stopped by --timeout-s has not passed (exit 1), and its result is still written."""
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out = tmp_path / "lg.json"
    assert main(["loadgen", "--url", server.url, "--clients", "1", "--requests", "10000", "--warmup", "0",
                 "--timeout-s", "0.3", "--json", str(out)]) == 1
    assert read_result(out)["loadgen"]["phases"][0]["timed_out"]
    text = capsys.readouterr().out
    assert "stopped at the time limit (1 client): " in text and "FAILED: the time limit stopped it" in text


@pytest.mark.parametrize("field,value", [("errors", 1), ("timed_out", True)])
def test_rollout_command_exits_1_on_error_replies_or_its_time_limit(server, monkeypatch, capsys, field, value):
    """The run's own numbers, with one error reply or the time limit reached (set here: a real time limit depends
    on the machine's load): exit 1. The rollout names the world-action observations it made up."""
    from vlaperf.cli import main
    from vlaperf.serve import rollout

    real = rollout.run_rollout

    def with_a_fault(*a, **kw):
        result = real(*a, **kw)
        result["rollout"][field] = value
        return result

    monkeypatch.setattr(rollout, "run_rollout", with_a_fault)
    assert main(["rollout", "--url", server.url, "--episodes", "1", "--steps-per-episode", "2",
                 "--control-hz", "100"]) == 1
    assert "random latents and state, no simulator" in capsys.readouterr().out


def test_wam_policy_refuses_non_finite_actions(model):
    from vlaperf.policy import NonFiniteActions

    def generate(obs, noise, **kw):
        actions = torch.zeros(len(obs.state), 4, 8)
        actions[1, 0, 0] = float("nan")
        return actions, None

    with pytest.raises(NonFiniteActions) as info:
        WamPolicy(model, generate, W).infer([make_wam_example(W, seed=s) for s in range(3)])
    assert info.value.rows == [1]


def test_wam_policy_noise_sequence_replays_after_a_restart(model):
    """The world-action server's fresh noise comes from its own generator seeded at startup: a restarted server
    (a new WamPolicy) answers the same observations with the same actions, call for call, whatever else drew
    from torch's global generator meanwhile (a rollout evaluation can be replayed)."""
    ex = make_wam_example(W, seed=2)
    first = WamPolicy(model, model.generate, W)
    a = [first.infer(ex)["actions"] for _ in range(2)]
    torch.manual_seed(1234)
    torch.randn(1000)  # other users of the global generator
    second = WamPolicy(model, model.generate, W)
    b = [second.infer(ex)["actions"] for _ in range(2)]
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.allclose(a[0], a[1])  # fresh noise per call, not one fixed draw


def test_wam_policy_noise_batches_and_refusals(model):
    """Fixed noise serves calls of its batch size, others get fresh noise (two calls differ); a dict gets (H, A),
    a list (B, H, A); an empty list, a non-dict item, a boolean array and a pi0 workload are refused by name."""
    from vlaperf.inputs import InputError
    from vlaperf.workloads import get_workload

    ex = make_wam_example(W, seed=1)
    fresh = WamPolicy(model, model.generate, W)
    assert fresh.infer(ex)["actions"].shape == (4, 8) and fresh.infer([ex, ex])["actions"].shape == (2, 4, 8)
    assert not np.allclose(fresh.infer(ex)["actions"], fresh.infer(ex)["actions"])
    g = torch.Generator().manual_seed(9)
    cfg = model.config
    noise = WamNoise(torch.randn(1, cfg.video_frames, cfg.patches, cfg.patch_channels, generator=g),
                     torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g))
    fixed = WamPolicy(model, model.generate, W, noise=noise)
    first = fixed.infer(ex)["actions"]
    assert np.array_equal(first, fixed.infer(ex)["actions"])
    assert fixed.infer([ex, ex])["actions"].shape == (2, 4, 8)  # batch 2: fresh noise, not the batch-1 one
    for bad, message in (([], "observation must be a dict (or a non-empty list of dicts)"),
                         ("text", "observation must be a dict (or a non-empty list"),
                         ([ex, 3], "observation must be a dict, got int"),
                         ({**ex, "observation/state": np.ones(8, bool)}, "observation/state: expected numbers, got "
                                                                          "dtype bool")):
        with pytest.raises(InputError, match=re.escape(message)):
            fresh.infer(bad)
    with pytest.raises(TypeError, match="expected a WamWorkload .*got Workload: serve the pi0 family with Policy"):
        WamPolicy(model, model.generate, get_workload("tiny"))


def test_wam_policy_samples_with_the_workloads_settings(model):
    """The workload's sampler settings (here video_steps 1, drop_middle) reach generate: the same noise through
    generate with them directly gives the same actions, and differs from the defaults."""
    from vlaperf.policy import WamTransform

    w = W.with_overrides(video_steps=1, sparsity="drop_middle")
    policy = FixedNoisePolicy(model, model.generate, w)
    ex = make_wam_example(w, seed=2)
    got = policy.infer(ex)["actions"]
    obs = WamTransform(model.config, model.device, model.dtype)([ex])
    want, _ = model.generate(obs, policy._noise(1), **w.sampling())
    assert np.allclose(got, want[0].numpy(), atol=1e-6)
    default, _ = model.generate(obs, policy._noise(1), steps=w.steps)
    assert not np.allclose(got, default[0].numpy())


def test_wam_policy_metadata_and_warmup_examples(model):
    from vlaperf.policy import HashTextEncoder

    class Encoder(HashTextEncoder):
        pass

    cfg = model.config
    w = W.with_overrides(sparsity="drop_middle")
    policy = WamPolicy(model, model.generate, w, text_encoder=Encoder(cfg.text_tokens, cfg.text_dim))
    meta = policy.workload_metadata()
    ex = make_wam_example(w)
    assert meta["context_latent_shape"] == list(ex["observation/context_latent"].shape)
    assert meta["state_dim"] == ex["observation/state"].shape[0] and meta["keys"] == sorted(ex, key=list(ex).index)
    assert meta["workload_overrides"] == w.overrides_vs(W) != {} and meta["text_encoder"] == "Encoder"
    warm = policy.warmup_examples(3)
    assert len(warm) == 3 and not np.array_equal(warm[0]["observation/state"], warm[1]["observation/state"])
    from vlaperf.models.wam import get_config

    narrow = build_wam(get_config("wam-tiny", state_dim=5), seed=0)  # wam-tiny's state and action dims are both 8
    assert WamPolicy(narrow, narrow.generate, W).workload_metadata()["state_dim"] == 5 != narrow.config.action_dim


def test_hash_text_encoder_normalizes_prompts_and_keeps_at_most_its_cache_size():
    enc = HashTextEncoder(4, 3, cache_size=2)
    a = enc("Put the  bowl")
    assert np.array_equal(a, enc("put the bowl ")) and not np.array_equal(a, enc("put the cup"))
    enc("third")
    assert len(enc.cache) == 2 and "put the bowl" not in enc.cache  # the oldest went first


def test_keep_warm_reruns_the_world_action_host_stages_and_changes_no_answer(model):
    """`serve --keep-warm-ms` with the world-action model: the runs between requests rerun its transform (checks,
    text encoder, copies), never `generate`, and the next answer is the one it would have been."""
    import time

    calls = []
    engine = WamEngine(model, "exact")

    def generate(*args, **kwargs):
        calls.append(1)
        return engine.generate(*args, **kwargs)

    s = PolicyServer(FixedNoisePolicy(model, generate, W), port=0, max_batch=1, warmup_batch_sizes=(),
                     keep_warm_ms=1.0).start()
    try:
        with Client(s.url) as c:
            example = make_wam_example(W, seed=2)
            first = c.infer(example)["actions"]
            deadline = time.perf_counter() + 10
            while s.stats["keep_warm_runs"] < 5:
                assert time.perf_counter() < deadline, "no keep-warm run"
                time.sleep(0.01)
            assert len(calls) == 1  # the runs called no model
            np.testing.assert_array_equal(c.infer(example)["actions"], first)
    finally:
        s.stop()


def test_serve_levers_with_spaces_around_none_serves_the_reference():
    """`serve --levers ' none'` on the world-action model was refused as an unknown lever 'none' (the command compared
    the raw text with 'none'); --levers now comes stripped from the parser, for every command."""
    from rich.console import Console

    from vlaperf.cli import build_parser
    from vlaperf.serve.commands import _wam_policy

    args = build_parser().parse_args(["serve", "--workload", "wam-tiny", "--device", "cpu", "--levers", " none "])
    assert args.levers == "none"
    args.batch = None  # as cmd_serve sets it before building the policy (the server batches requests itself)
    policy = _wam_policy(args, Console(quiet=True))
    assert policy is not None and policy.sample == policy.model.generate  # no engine: the reference model
