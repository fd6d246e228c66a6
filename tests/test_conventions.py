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
# openpi's pi0 conventions were trained with 50 actions a chunk: a tiny model of that chunk
TINY50 = dataclasses.replace(TINY, horizon=50)


def _noise(workload, config, seed=0):
    return torch.randn(1, workload.horizon, config.action_dim, generator=torch.Generator().manual_seed(seed))


def test_pi0_libero_adds_the_state_back_to_the_first_six_actions(tmp_path):
    """openpi's pi0_libero: unnormalize, then add the (raw) state on dims 0-5; the gripper stays absolute."""
    model = build_model(TINY50.model_config())
    noise = _noise(TINY50, model.config)
    stats = {"norm_stats": {"state": {"mean": [0.5] * 8, "std": [2.0] * 8},
                            "actions": {"mean": [0.1] * 7, "std": [3.0] * 7}}}
    (tmp_path / "norm_stats.json").write_text(json.dumps(stats))
    ns = NormStats.load(tmp_path, quantile=False)
    plain = Policy(model, model.sample_actions, TINY50, noise=noise, norm_stats=ns)
    delta = Policy(model, model.sample_actions, TINY50, noise=noise, norm_stats=ns, conventions="openpi:pi0_libero")
    ex = make_example(TINY50, seed=2)
    a, b = plain.infer(ex)["actions"], delta.infer(ex)["actions"]
    state = np.asarray(ex["observation/state"], np.float64)
    np.testing.assert_allclose(b[:, :6], a[:, :6] + state[:6], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b[:, 6], a[:, 6])
    # a batch: each sample gets its own state back
    exs = [make_example(TINY50, seed=s) for s in (3, 4)]
    batched = Policy(model, model.sample_actions, TINY50, norm_stats=ns, conventions="openpi:pi0_libero",
                     noise=_noise(TINY50, model.config).repeat(2, 1, 1))
    plain2 = Policy(model, model.sample_actions, TINY50, norm_stats=ns,
                    noise=_noise(TINY50, model.config).repeat(2, 1, 1))
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


@pytest.mark.parametrize("name", ["openpi:pi0_aloha", "openpi:pi0_aloha_sim"])
def test_aloha_policy_with_conventions_end_to_end(name):
    """A tiny ALOHA-layout policy: the transform sees the state in pi's space (normalized from there) and
    the actions come out in ALOHA's, with delta actions (pi0_aloha) and without them (pi0_aloha_sim, whose
    actions still change: ALOHA's space)."""
    cfg = get_config("tiny", action_dim=16, action_horizon=50)
    workload = dataclasses.replace(TINY50, id="tiny-aloha", layout="aloha", state_dim=14, robot_action_dim=14,
                                   action_dim=16)
    model = build_model(cfg)
    noise = _noise(workload, cfg)
    ex = make_example(workload, seed=1)
    ex["state"][[6, 13]] = [0.3, 0.7]
    plain = Policy(model, model.sample_actions, workload, noise=noise)
    adapted = Policy(model, model.sample_actions, workload, noise=noise, conventions=name)
    conv = adapted.conventions
    pi_state = conv.state_to_model(ex["state"])
    # the model sees pi's state: the same as a plain policy given that state
    plain_ex = dict(ex, state=pi_state.astype(np.float32))
    want = conv.actions_to_robot(plain.infer(plain_ex)["actions"][None], pi_state[None])[0]
    np.testing.assert_allclose(adapted.infer(ex)["actions"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="for the aloha layout; the workload's is libero"):
        Policy(build_model("tiny"), None, TINY, conventions="openpi:pi0_aloha")
    # a model of another chunk than the conventions were trained with would serve other actions silently
    with pytest.raises(ValueError, match="'openpi:pi0_libero' were trained with 50 actions a chunk; the model has "
                                         "10 .*--action-horizon 50"):
        Policy(build_model("tiny"), None, TINY, conventions="openpi:pi0_libero")


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
    # LeRobot's chunk is each checkpoint's own (its config.json), 50 its default: --action-horizon may say another
    w, cfg = resolve_shape(args("lerobot:pi05", 20, None, None), get_workload("libero-pi05"))
    assert w.horizon == cfg.action_horizon == 20
    with pytest.raises(CliError, match="--action-horizon 20: --conventions openpi:pi05_libero were trained with 10"):
        resolve_shape(args("openpi:pi05_libero", 20, None, None), get_workload("libero-pi05"))
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

    model = build_model(TINY50.model_config())
    policy = Policy(model, model.sample_actions, TINY50, conventions="openpi:pi0_libero")
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


# ------------------------------------------------------------------- DROID and pi0.5 ALOHA layouts

# A tiny model in DROID's layout: openpi's pi05_droid (state 8 = 7 joints + the gripper, 8 actions, 15 a chunk)
TINY_DROID = dataclasses.replace(TINY, id="tiny-droid", layout="droid", robot_action_dim=8, horizon=15)


def _droid_as_libero(ex):
    return {"observation/image": ex["observation/exterior_image_1_left"],
            "observation/wrist_image": ex["observation/wrist_image_left"],
            "observation/state": np.concatenate([ex["observation/joint_position"],
                                                 np.atleast_1d(ex["observation/gripper_position"])]),
            "prompt": ex["prompt"]}


def test_droid_observation_is_libero_s_with_openpi_s_keys():
    """openpi's DroidInputs: the exterior camera in the base slot, the wrist camera in the left wrist slot, the
    right wrist slot zeros and masked; the state is the 7 joints then the gripper (a 1-value array or a scalar)."""
    cfg = get_config("tiny", pi05=True, action_horizon=15)
    droid = ObservationTransform(TINY_DROID, cfg, conventions="openpi:pi05_droid")
    libero = ObservationTransform(dataclasses.replace(TINY_DROID, layout="libero"), cfg)
    ex = make_example(TINY_DROID, seed=4)
    assert ex["observation/joint_position"].shape == (7,) and ex["observation/gripper_position"].shape == (1,)
    want = libero(_droid_as_libero(ex))
    for scalar in (False, True):
        if scalar:
            ex["observation/gripper_position"] = float(ex["observation/gripper_position"][0])
        got = droid(ex)
        assert got.image_mask.tolist() == [[True, True, False]]
        for a, b in zip(got.tensors(), want.tensors()):
            assert torch.equal(a, b)  # the state is also in pi0.5's prompt: the tokens agree too
    for key, value, message in [
        ("observation/joint_position", np.zeros(6), "observation/joint_position: expected 7 values, got 6"),
        ("observation/joint_position", [[0.1], [1.0, 2.0]], "observation/joint_position: expected a 1-d numeric array"),
        ("observation/gripper_position", np.zeros(2), "observation/gripper_position: expected 1 value, got 2"),
        ("observation/gripper_position", np.array([np.nan]), "observation/gripper_position: state holds NaN"),
        ("observation/wrist_image_left", np.zeros((5, 5)), "observation/wrist_image_left: expected a 3-d image"),
    ]:
        bad = dict(make_example(TINY_DROID, seed=4), **{key: value})
        with pytest.raises(ValueError, match=message):
            droid.validate(bad)
    bad = make_example(TINY_DROID, seed=4)
    del bad["observation/exterior_image_1_left"]
    with pytest.raises(ValueError, match="missing key 'observation/exterior_image_1_left'"):
        droid.validate(bad)


def test_droid_policy_serves_eight_actions_of_its_chunk():
    """pi05_droid: 15 actions a chunk, the first 8 dims (DroidOutputs), absolute; a model of another chunk is
    refused; the conventions need the DROID layout."""
    cfg = get_config("tiny", pi05=True, action_horizon=15)
    model = build_model(cfg)
    policy = Policy(model, model.sample_actions, TINY_DROID, noise=_noise(TINY_DROID, cfg),
                    conventions="openpi:pi05_droid")
    out = policy.infer(make_example(TINY_DROID, seed=1))["actions"]
    assert out.shape == (15, 8) and out.dtype == np.float32
    plain = Policy(model, model.sample_actions, TINY_DROID, noise=_noise(TINY_DROID, cfg))
    np.testing.assert_array_equal(out, plain.infer(make_example(TINY_DROID, seed=1))["actions"])
    with pytest.raises(ValueError, match="'openpi:pi05_droid' are for the droid layout; the workload's is libero"):
        Policy(model, model.sample_actions, dataclasses.replace(TINY_DROID, layout="libero"),
               conventions="openpi:pi05_droid")
    with pytest.raises(ValueError, match="'openpi:pi0_droid' are for pi0 checkpoints; the model is pi05"):
        Policy(model, model.sample_actions, TINY_DROID, conventions="openpi:pi0_droid")


def test_default_prompt_fills_a_missing_prompt_only():
    """openpi's InjectDefaultPrompt (pi0_aloha_towel's "fold the towel"): used where the observation has no
    prompt; a given prompt wins; without a default the prompt stays required."""
    cfg = get_config("tiny", action_dim=16, action_horizon=50)
    workload = dataclasses.replace(TINY50, layout="aloha", state_dim=14, robot_action_dim=14, action_dim=16)

    class Recorder:
        text = None

        def encode(self, text):
            Recorder.text = text
            return [2, 5]

    towel = ObservationTransform(workload, cfg, Recorder(), conventions="openpi:pi0_aloha_towel")
    ex = make_example(workload, seed=0)
    towel.host_arrays(ex)
    assert Recorder.text == ex["prompt"]
    del ex["prompt"]
    towel.validate(ex)
    towel.host_arrays(ex)
    assert Recorder.text == "fold the towel"
    with pytest.raises(ValueError, match="prompt: missing"):
        ObservationTransform(workload, cfg, Recorder(), conventions="openpi:pi0_aloha").validate(ex)
    # served through Ray replicas, the front end checks requests with the replicas' conventions too
    from vlaperf.serve.ray_backend import RayPolicy

    aloha = get_workload("aloha-pi0")
    promptless = make_example(aloha, seed=0)
    del promptless["prompt"]
    RayPolicy(None, aloha, 1, conventions="openpi:pi0_aloha_towel").transform.validate(promptless)
    with pytest.raises(ValueError, match="prompt: missing"):
        RayPolicy(None, aloha, 1).transform.validate(promptless)
    assert CONVENTIONS["openpi:pi05_aloha_pen_uncap"].default_prompt == "uncap the pen"
    assert CONVENTIONS["openpi:pi0_aloha_sim"].default_prompt == "Transfer cube"  # openpi's pi0_aloha_sim config
    assert CONVENTIONS["openpi:pi05_aloha"].family == "pi05" and CONVENTIONS["openpi:pi05_aloha"].delta_action_mask


@pytest.mark.parametrize("workload_id, conventions, horizon", [
    ("droid-pi0", "openpi:pi0_droid", 10), ("droid-pi05", "openpi:pi05_droid", 15),
    ("aloha-pi05", "openpi:pi05_aloha", 50), ("aloha-pi05", "openpi:pi05_aloha_pen_uncap", 50),
])
def test_each_openpi_config_has_a_workload_of_its_layout(workload_id, conventions, horizon):
    """The serving workloads of openpi's DROID and pi0.5 ALOHA configs: their model is their preset with their
    chunk, and the CLI's shape for their conventions is the workload as it is."""
    from vlaperf.cli import resolve_shape

    base = get_workload(workload_id)
    assert base.model_config().action_horizon == base.horizon == horizon
    args = dataclasses.make_dataclass("A", [("conventions", object), ("action_horizon", object), ("batch", object),
                                            ("steps", object)])
    w, cfg = resolve_shape(args(conventions, None, None, None), base)
    assert w == base and cfg == base.model_config() and w.overrides_vs(base) == {}


def test_droid_server_round_trip():
    """A DROID-layout policy behind the server: an openpi DROID client's observation in, (15, 8) actions out;
    the warm-up's synthetic observations are DROID's too."""
    pytest.importorskip("websockets")
    from vlaperf.serve.client import Client
    from vlaperf.serve.server import PolicyServer

    cfg = get_config("tiny", pi05=True, action_horizon=15)
    model = build_model(cfg)
    server = PolicyServer(Policy(model, model.sample_actions, TINY_DROID, conventions="openpi:pi05_droid"),
                          port=0).start()
    try:
        with Client(server.url) as client:
            assert client.metadata["conventions"] == "openpi:pi05_droid" and client.metadata["action_horizon"] == 15
            reply = client.infer(make_example(TINY_DROID, seed=2))
            assert reply["actions"].shape == (15, 8)
    finally:
        server.stop()


def test_aloha_joint_signs_literal():
    """Openpi's ALOHA joint flips are joints 1, 2, 8, 9 (pinned literally, not through the constant)."""
    from vlaperf.conventions import CONVENTIONS
    conv = CONVENTIONS["openpi:pi0_aloha_sim"]
    state = np.arange(1, 15, dtype=np.float64) / 20
    out = conv.state_to_model(state)
    joints = [i for i in range(14) if i not in (6, 13)]
    expect = state.copy()
    expect[[1, 2, 8, 9]] *= -1
    np.testing.assert_allclose(out[joints], expect[joints])


@pytest.mark.parametrize("name", ["lerobot:pi0", "lerobot:pi05", "openpi:pi05_libero"])
def test_images_are_resized_as_the_checkpoints_library_does(name):
    """An image not at the model's size: openpi resizes it with PIL's antialiased bilinear filter and rounds to
    uint8; LeRobot's policies (resize_with_pad_torch in _preprocess_images) resize the [0, 1] float image with
    torch's bilinear filter, no antialiasing, no rounding, pad with 0, then map to [-1, 1]."""
    import torch.nn.functional as F

    from vlaperf.inputs import resize_with_pad

    conv = CONVENTIONS[name]
    cfg = get_config("tiny", pi05=conv.family == "pi05")
    R = cfg.vision.image_size
    transform = ObservationTransform(TINY, cfg, conventions=name)
    ex = make_example(TINY, seed=3, image_size=2 * R + 8)  # a camera larger than the model's input
    ex["observation/wrist_image"] = ex["observation/wrist_image"][:R, :R]  # one slot already at size
    images = transform.preprocess(transform.upload(transform.host_arrays(ex))).images[0]
    base = torch.from_numpy(ex["observation/image"])
    if conv.image_resize == "lerobot":  # a square camera: resized to R x R, no padding
        x = base.permute(2, 0, 1)[None].float() / 255.0
        want = F.interpolate(x, size=(R, R), mode="bilinear", align_corners=False).clamp(0, 1)[0] * 2.0 - 1.0
    else:
        want = resize_with_pad(base, R).float() / 127.5 - 1.0
    torch.testing.assert_close(images[0], want, atol=1e-5, rtol=0)
    if conv.image_resize == "lerobot":  # the filters differ: openpi's antialiased one is not what LeRobot saw
        assert (images[0] - (resize_with_pad(base, R).float() / 127.5 - 1.0)).abs().mean() > 0.01
    wrist = torch.from_numpy(ex["observation/wrist_image"]).permute(2, 0, 1).float() / 127.5 - 1.0
    torch.testing.assert_close(images[1], wrist, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("name", "pad"), [("lerobot0.4:pi05", -3.0), ("lerobot:pi05", -1.0),
                                           ("openpi:pi05_libero", -1.0)])
def test_a_wide_camera_is_padded_as_the_checkpoints_library_pads(name, pad):
    """A camera wider than tall is padded above and below. openpi and LeRobot 0.5+ pad black (-1 in SigLIP's [-1, 1]);
    LeRobot 0.4's resize_with_pad_torch padded its [0, 1] float image with -1 (it assumed [-1, 1] input), which its
    policy then mapped to -3: a pi0.5 trained there saw -3 bands."""
    conv = CONVENTIONS[name]
    cfg = get_config("tiny", pi05=True)
    R = cfg.vision.image_size
    transform = ObservationTransform(TINY, cfg, conventions=name)
    ex = make_example(TINY, seed=4, image_size=2 * R)
    ex["observation/image"] = ex["observation/image"][: R, :]  # R x 2R: resized to R/2 x R, R/4 rows of pad each side
    image = transform.preprocess(transform.upload(transform.host_arrays(ex))).images[0, 0]
    band = R // 4
    assert conv.image_resize in ("openpi", "lerobot", "lerobot0.4")
    torch.testing.assert_close(image[:, :band], torch.full_like(image[:, :band], pad), atol=1e-6, rtol=0)
    torch.testing.assert_close(image[:, R - band:], torch.full_like(image[:, R - band:], pad), atol=1e-6, rtol=0)
    assert image[:, band : R - band].min() >= -1.0 - 1e-6  # the picture itself stays in [-1, 1]
