"""A checkpoint's conventions (vlaperf.conventions): delta actions, ALOHA's space, pi0.5's prompt state,
the action horizon; through Policy, the CLI's options and the server's metadata."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from vlaperf.conventions import (
    ALOHA_JOINT_SIGNS,
    CONVENTIONS,
    aloha_gripper_from_angular,
    aloha_gripper_to_angular,
    get_conventions,
)
from vlaperf.inputs import ObservationTransform, make_example, state_prompt
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.normalize import NormStats
from vlaperf.policy import Policy
from vlaperf.workloads import get_workload

TINY = get_workload("tiny")  # libero layout: state 8, robot actions 7, horizon 10


def _noise(workload, config, seed=0):
    return torch.randn(1, workload.horizon, config.action_dim, generator=torch.Generator().manual_seed(seed))


def test_pi0_libero_adds_the_state_back_to_the_first_six_actions(tmp_path):
    """openpi's pi0_libero: unnormalize, then add the (raw) state on dims 0-5; the gripper stays absolute."""
    model = build_model("tiny")
    noise = _noise(TINY, model.config)
    stats = {"norm_stats": {"state": {"mean": [0.5] * 8, "std": [2.0] * 8},
                            "actions": {"mean": [0.1] * 7, "std": [3.0] * 7}}}
    (tmp_path / "norm_stats.json").write_text(json.dumps(stats))
    ns = NormStats.load(tmp_path, quantile=False)
    plain = Policy(model, model.sample_actions, TINY, noise=noise, norm_stats=ns)
    delta = Policy(model, model.sample_actions, TINY, noise=noise, norm_stats=ns, conventions="openpi:pi0_libero")
    ex = make_example(TINY, seed=2)
    a, b = plain.infer(ex)["actions"], delta.infer(ex)["actions"]
    state = np.asarray(ex["observation/state"], np.float64)
    np.testing.assert_allclose(b[:, :6], a[:, :6] + state[:6], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b[:, 6], a[:, 6])
    # a batch: each sample gets its own state back
    exs = [make_example(TINY, seed=s) for s in (3, 4)]
    batched = Policy(model, model.sample_actions, TINY, norm_stats=ns, conventions="openpi:pi0_libero",
                     noise=_noise(TINY, model.config).repeat(2, 1, 1))
    plain2 = Policy(model, model.sample_actions, TINY, norm_stats=ns, noise=_noise(TINY, model.config).repeat(2, 1, 1))
    got, base = batched.infer(exs)["actions"], plain2.infer(exs)["actions"]
    for i, e in enumerate(exs):
        np.testing.assert_allclose(got[i, :, :6], base[i, :, :6] + e["observation/state"][:6], rtol=1e-5, atol=1e-5)


def test_aloha_adapt_to_pi_maps_the_state_in_and_the_actions_out():
    """openpi's ALOHA space: joints 1, 2, 8, 9 flipped; the grippers (6, 13) converted; with pi0_aloha the
    joints are deltas from the state in pi's space, added back before the actions leave pi's space."""
    conv = CONVENTIONS["openpi:pi0_aloha"]
    state = np.linspace(-0.5, 0.9, 14)
    state[[6, 13]] = [0.2, 0.8]
    model_state = conv.state_to_model(state)
    joints = [i for i in range(14) if i not in (6, 13)]
    np.testing.assert_allclose(model_state[joints], (ALOHA_JOINT_SIGNS * state)[joints])
    # the gripper: ALOHA's [0, 1] opening -> metres -> the horn's angle (law of cosines) -> pi's [0, 1]
    lin = 0.2 * (0.05800 - 0.01844) + 0.01844
    angle = np.arcsin((0.022**2 + lin**2 - 0.036**2) / (2 * 0.022 * lin))
    assert model_state[6] == pytest.approx((angle - 0.5476) / (1.6296 - 0.5476))
    assert aloha_gripper_to_angular(np.array([0.2]))[0] == pytest.approx(model_state[6])
    actions = np.random.default_rng(0).normal(size=(1, 5, 14))
    out = conv.actions_to_robot(actions, model_state[None])
    mask = np.array([True] * 6 + [False] + [True] * 6 + [False])
    pi_space = actions + np.where(mask, model_state, 0.0)
    np.testing.assert_allclose(out[..., joints], (ALOHA_JOINT_SIGNS * pi_space)[..., joints], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[..., [6, 13]], (pi_space[..., [6, 13]] + 0.5476 + 0.6213) / (1.4910 + 0.6213),
                               rtol=1e-6, atol=1e-6)
    assert aloha_gripper_from_angular(np.array([-0.5476 - 0.6213]))[0] == pytest.approx(0.0)
    sim = CONVENTIONS["openpi:pi0_aloha_sim"]  # the same space, absolute actions
    np.testing.assert_allclose(sim.actions_to_robot(actions, model_state[None])[..., joints],
                               (ALOHA_JOINT_SIGNS * actions)[..., joints], rtol=1e-6, atol=1e-6)


def test_aloha_policy_with_conventions_end_to_end():
    """A tiny ALOHA-layout policy: the transform sees the state in pi's space (normalized from there) and
    the actions come out in ALOHA's."""
    cfg = get_config("tiny", action_dim=16)
    workload = dataclasses.replace(TINY, id="tiny-aloha", layout="aloha", state_dim=14, robot_action_dim=14,
                                   action_dim=16)
    model = build_model(cfg)
    noise = _noise(workload, cfg)
    ex = make_example(workload, seed=1)
    ex["state"][[6, 13]] = [0.3, 0.7]
    plain = Policy(model, model.sample_actions, workload, noise=noise)
    adapted = Policy(model, model.sample_actions, workload, noise=noise, conventions="openpi:pi0_aloha")
    conv = adapted.conventions
    pi_state = conv.state_to_model(ex["state"])
    # the model sees pi's state: the same as a plain policy given that state
    plain_ex = dict(ex, state=pi_state.astype(np.float32))
    want = conv.actions_to_robot(plain.infer(plain_ex)["actions"][None], pi_state[None])[0]
    np.testing.assert_allclose(adapted.infer(ex)["actions"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="for the aloha layout; the workload's is libero"):
        Policy(build_model("tiny"), None, TINY, conventions="openpi:pi0_aloha")


def test_pi05_prompt_state_follows_the_conventions():
    """pi05_libero keeps the state out of the prompt (pi0's prompt); LeRobot 0.4 pads it to 32 before binning."""
    cfg = get_config("tiny", pi05=True)
    ex = make_example(TINY, seed=5)

    class Recorder:
        def __init__(self):
            self.texts = []

        def encode(self, text):
            self.texts.append(text)
            return [2, 5, 6]

    def prompt_text(conventions):
        tok = Recorder()
        ObservationTransform(TINY, cfg, tok, conventions=conventions).host_arrays(ex)
        return tok.texts[-1]

    state = np.asarray(ex["observation/state"], np.float64)
    assert prompt_text("openpi:pi05_libero") == ex["prompt"]  # no state: the pi0 prompt's text
    assert prompt_text(None) == f"Task: {ex['prompt']}, {state_prompt(state)}\nAction: "
    numbers = prompt_text("lerobot0.4:pi05").split("State: ")[1].split(";")[0].split()
    assert len(numbers) == 32 and numbers[8:] == ["128"] * 24  # the padding's zeros: bin 128
    with pytest.raises(ValueError, match="for pi05 checkpoints; the model is pi0"):
        ObservationTransform(TINY, get_config("tiny"), conventions="lerobot:pi05")


def test_state_prompt_does_not_clip():
    """openpi and LeRobot digitise without clipping: below -1 is bin -1."""
    assert state_prompt(np.array([-1.5, -1.0, 0.0, 0.5, 1.0, 1.7])) == "State: -1 0 128 192 255 255;"


def test_cli_conventions_set_the_horizon_and_refuse_a_contradiction(capsys):
    from vlaperf.cli import CliError, resolve_shape

    args = dataclasses.make_dataclass("A", [("conventions", object), ("action_horizon", object), ("batch", object),
                                            ("steps", object)])
    w, cfg = resolve_shape(args("openpi:pi05_libero", None, None, None), get_workload("libero-pi05"))
    assert w.horizon == cfg.action_horizon == 10
    w, cfg = resolve_shape(args("lerobot:pi05", None, None, 3), get_workload("libero-pi05"))
    assert w.horizon == cfg.action_horizon == 50 and w.steps == 3 and w.overrides_vs(get_workload("libero-pi05")) == \
        {"horizon": 50, "steps": 3}
    w, cfg = resolve_shape(args(None, 20, None, None), TINY)
    assert w.horizon == cfg.action_horizon == 20
    with pytest.raises(CliError, match="--action-horizon 20: --conventions lerobot:pi05 were trained with 50"):
        resolve_shape(args("lerobot:pi05", 20, None, None), get_workload("libero-pi05"))
    with pytest.raises(CliError, match="--conventions: conventions 'openpi:pi0_libero' are for pi0 checkpoints"):
        resolve_shape(args("openpi:pi0_libero", None, None, None), get_workload("libero-pi05"))


def test_bench_with_another_action_horizon_runs_and_records_it(tmp_path):
    from vlaperf.cli import main
    from vlaperf.report.schema import read_result

    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--levers", "exact", "--action-horizon", "6",
                 "--warmup", "1", "--iters", "2", "--no-progress", "--json", str(out)]) == 0
    r = read_result(out)
    assert r["workload"]["overrides"]["horizon"] == 6 and r["equivalence"]["passed"]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--device", "cpu", "--action-horizon", "0"])
    assert exit_info.value.code == 2


def test_server_metadata_names_the_conventions():
    from vlaperf.serve.server import PolicyServer

    model = build_model("tiny")
    policy = Policy(model, model.sample_actions, TINY, conventions="openpi:pi0_libero")
    meta = PolicyServer(policy, port=0, warmup_batch_sizes=())._build_metadata()
    assert meta["conventions"] == "openpi:pi0_libero" and meta["checkpoint"] is None  # random weights
    model.checkpoint = {"path": "/secret/dir/model.safetensors", "layout": "openpi"}
    meta = PolicyServer(policy, port=0, warmup_batch_sizes=())._build_metadata()
    assert meta["checkpoint"] == {"name": "model.safetensors", "layout": "openpi"}  # the name only: clients see it
    with pytest.raises(ValueError, match="unknown conventions 'pi0'; expected one of: none, openpi:pi0_libero"):
        get_conventions("pi0")


def test_world_action_workloads_refuse_an_action_horizon(capsys):
    from vlaperf.cli import main

    assert main(["bench", "--workload", "wam-tiny", "--device", "cpu", "--action-horizon", "8"]) == 2
    assert "--action-horizon: the pi0 family's chunk" in capsys.readouterr().err
