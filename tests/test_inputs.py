"""Observations: random ones per workload, and openpi LIBERO / ALOHA dicts (policy mode)."""

import re
import time

import numpy as np
import pytest
import torch

from vlaperf.inputs import InputError, ObservationTransform, WordHashTokenizer, make_example, random_observation
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.policy import Policy
from vlaperf.workloads import get_workload


def test_random_observation_follows_workload():
    w = get_workload("tiny")
    obs = random_observation(w)
    assert obs.images.shape == (1, 3, 3, 56, 56)
    assert obs.image_mask.tolist() == [[True, True, False]]
    assert torch.all(obs.images[:, 2] == -1.0), "masked slot holds the all-zero uint8 image, normalised"
    assert obs.images[:, :2].std() > 0.3
    assert obs.token_mask.sum().item() == 6 and obs.token_mask[0, :6].all()
    assert obs.state.shape == (1, 8) and torch.all(obs.state[:, 8:] == 0)
    assert obs.host_image_valid == (True, True, False) and obs.host_prompt_len == 6


def test_batched_workload_prompt_lengths_differ():
    w = get_workload("libero-pi0-b4")
    assert w.prompt_valid == (12, 17, 23, 28)
    obs = random_observation(w.with_overrides(), get_config("tiny").__class__("t", get_config("tiny").vision,
                             get_config("tiny").backbone, get_config("tiny").expert, max_token_len=48))
    assert obs.token_mask.sum(1).tolist() == [12, 17, 23, 28]


def test_workload_errors():
    from vlaperf.workloads import get_workload as gw

    with pytest.raises(ValueError, match="unknown workload 'libero-pi9'"):
        gw("libero-pi9")
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        gw("tiny").with_overrides(batch=0)
    with pytest.raises(ValueError, match="world-action model"):
        gw("wam-761")


def test_tokenizer_is_deterministic_and_pluggable():
    tok = WordHashTokenizer(1024)
    assert tok.encode("Put the bowl") == tok.encode("put the  bowl")
    assert tok.encode("a b")[0] == WordHashTokenizer.BOS and len(tok.encode("a b")) == 4

    class Fixed:
        def encode(self, text):
            return [5, 6, 7]

    w = get_workload("tiny")
    obs = ObservationTransform(w, get_config("tiny"), Fixed())(make_example(w))
    assert obs.tokens[0, :4].tolist() == [5, 6, 7, 0] and obs.host_prompt_len == 3


@pytest.fixture
def libero():
    w = get_workload("tiny")
    return w, ObservationTransform(w, get_config("tiny"))


def test_libero_dict_maps_to_slots(libero):
    w, tr = libero
    obs = tr(make_example(w, image_size=224))  # clients send 224 px; tiny resizes to 56
    assert obs.images.shape == (1, 3, 3, 56, 56)
    assert obs.image_mask.tolist() == [[True, True, False]]
    assert obs.images.min() >= -1 and obs.images.max() <= 1


def test_aloha_dict_and_missing_camera():
    w = get_workload("aloha-pi0")
    with pytest.raises(ValueError, match="14-d state, more than model 'tiny' pads to \\(8\\)"):
        ObservationTransform(w, get_config("tiny"))
    tr = ObservationTransform(w, get_config("tiny", action_dim=16))
    ex = make_example(w, image_size=64)
    del ex["images"]["cam_right_wrist"]
    obs = tr(ex)
    assert obs.image_mask.tolist() == [[True, True, False]]
    assert obs.state[0, :14].abs().sum() > 0 and torch.all(obs.state[0, 14:] == 0)


def test_resize_with_pad_keeps_aspect(libero):
    w, tr = libero
    ex = make_example(w)
    ex["observation/image"] = np.full((60, 120, 3), 255, np.uint8)
    img = tr(ex).images[0, 0]  # (3, 56, 56): white band in the middle, black (-1) bars above and below
    assert img[:, 28, :].min() > 0.99 and img[:, 0, :].max() < -0.99


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda e: e.pop("observation/state"), "missing key 'observation/state'"),
        (lambda e: e.__setitem__("observation/state", np.zeros(5, np.float32)), "expected 8 values, got 5"),
        (lambda e: e.__setitem__("observation/state", np.full(8, np.nan, np.float32)), "NaN"),
        (lambda e: e.__setitem__("observation/image", np.zeros((224, 224), np.uint8)), "expected a 3-d image"),
        (lambda e: e.__setitem__("observation/image", np.zeros((1, 224, 224, 3), np.uint8)),
         re.escape("expected a 3-d image (H, W, 3) or (3, H, W), got shape (1, 224, 224, 3) (one observation's image "
                   "has no batch axis: a batch is a list of observations)")),
        (lambda e: e.__setitem__("observation/image", np.zeros((224, 224, 3), np.int64)), "expected uint8 or float pixels"),
        (lambda e: e.__setitem__("observation/wrist_image", np.zeros((224, 224, 4), np.uint8)), "3 colour channels"),
        (lambda e: e.__setitem__("prompt", 42), "prompt: expected a string"),
        (lambda e: e.__setitem__("observation/state", np.array(["a"] * 8)), "1-d numeric array"),
        (lambda e: e.__setitem__("observation/image", np.full((64, 64, 3), 254.0, np.float32)),
         r"observation/image: float pixels must be in \[0, 1\], got 254..254 \(send uint8 for 0..255\)"),
        (lambda e: e.pop("prompt"), "prompt: missing; an observation carries its task instruction as 'prompt'"),
        (lambda e: e.__setitem__("prompt", np.array(["a", "b"])), r"prompt: expected a string, got an array of shape \(2,\)"),
        (lambda e: e.__setitem__("prompt", "a " * 5000), "prompt: 10000 characters, expected at most 4096"),
    ],
)
def test_bad_inputs_name_the_field(libero, edit, message):
    w, tr = libero
    ex = make_example(w)
    edit(ex)
    with pytest.raises(InputError, match=message):
        tr(ex)


def test_either_image_layout_and_float_pixels_in_range_are_taken(libero):
    """openpi's image parsing takes (3, H, W) and (H, W, 3) alike; so does the transform, for any camera.
    Float pixels in [0, 1] (up to FLOAT_PIXEL_SLACK outside) read as the same image in uint8."""
    w, tr = libero
    ex = make_example(w)
    hwc = ex["observation/image"]
    base = tr(ex).images
    ex["observation/image"] = np.ascontiguousarray(hwc.transpose(2, 0, 1))  # channels first
    assert torch.equal(tr(ex).images, base)
    ex["observation/image"] = hwc.astype(np.float32) / 255 + 5e-4  # a rounding's overshoot stays in range
    assert (tr(ex).images - base).abs().max() <= 2 / 127.5
    prompts = [tr.host_arrays(dict(ex, prompt=p)).tokens[0] for p in (ex["prompt"], np.asarray(ex["prompt"]),
                                                                       np.asarray(ex["prompt"].encode()), ex["prompt"].encode())]
    assert all(np.array_equal(t, prompts[0]) for t in prompts)  # str, 0-d str / bytes arrays, bytes: one prompt


def test_tokenizer_ids_outside_the_vocabulary_are_refused(libero):
    """A custom tokenizer's out-of-range id fails at tokenization, naming the tokenizer (the embedding would
    index out of range later: on CUDA a device-side assert that ends the process)."""
    w, tr = libero

    class Wrong:
        def encode(self, text):
            return [1, 5000]

    bad = ObservationTransform(w, tr.config, Wrong())
    with pytest.raises(ValueError, match=r"tokenizer Wrong: encode\('.*'\) gave the id 5000, expected integers in \[0, 1024\)"):
        bad(make_example(w))
    for example in (None, 3, "obs"):
        with pytest.raises(InputError, match="observation must be a dict"):
            tr(example)


def test_policy_refuses_a_bad_step_count():
    w = get_workload("tiny")
    model = build_model("tiny")
    assert Policy(model, model.sample_actions, w).num_steps == w.steps
    for steps in (0, -1, 2.5, 1001):
        with pytest.raises(ValueError, match=f"num_steps: expected an integer in 1..1000 .*got {steps!r}"):
            Policy(model, model.sample_actions, w, num_steps=steps)


def test_policy_infer_returns_robot_actions():
    w = get_workload("tiny")
    model = build_model("tiny")
    noise = torch.randn(1, model.config.action_horizon, model.config.action_dim)
    policy = Policy(model, model.sample_actions, w, noise=noise)
    out = policy.infer(make_example(w))
    assert out["actions"].shape == (10, 7) and out["actions"].dtype == np.float32
    assert out["actions"].flags["C_CONTIGUOUS"]
    # the robot's dims of the model's chunk, exactly (sliced on the host after the copy)
    full = model.sample_actions(policy.transform(make_example(w)), noise, w.steps)
    np.testing.assert_array_equal(out["actions"], full[0, :, :7].numpy())
    assert out["policy_timing"]["infer_ms"] > 0
    batch = policy.infer([make_example(w, seed=1), make_example(w, seed=2)])
    assert batch["actions"].shape == (2, 10, 7)


def _per_array_reference(tr, examples):
    """The transform as it was before the packed upload: one copy per array, every image resized
    (or permuted) on its own, stacked, normalised. The packed path must give the same tensors."""
    from vlaperf.inputs import resize_with_pad

    hb = tr.host_arrays(examples)
    R = tr.config.vision.image_size
    images = torch.stack([torch.stack([resize_with_pad(torch.from_numpy(np.ascontiguousarray(a)), R) for a in slots])
                          for slots in hb.pixels])
    return (images.float() / 127.5 - 1.0, torch.tensor(hb.image_valid), torch.from_numpy(np.stack(hb.tokens)),
            torch.from_numpy(np.stack(hb.token_masks)), torch.from_numpy(np.stack(hb.states)))


@pytest.mark.parametrize("case", ["model_size", "resized", "mixed_sizes", "aloha_model_size", "aloha_missing_camera",
                                  "batch"])
def test_packed_upload_gives_the_per_array_tensors(case):
    """One staging buffer and one copy (images at the model's size skip the per-image path)
    give exactly the tensors of one copy per array, for every layout and batch. ALOHA's images
    arrive channels first and are staged so (a plain copy, not a transposing one)."""
    w, cfg = get_workload("tiny"), get_config("tiny")
    if case.startswith("aloha"):
        w, cfg = get_workload("aloha-pi0"), get_config("tiny", action_dim=16)
    tr = ObservationTransform(w, cfg)
    R = cfg.vision.image_size
    if case == "batch":
        examples = [make_example(w, seed=i, image_size=R) for i in range(3)]
    else:
        ex = make_example(w, seed=1, image_size=R if case in ("model_size", "aloha_model_size") else 64)
        if case == "mixed_sizes":
            ex["observation/wrist_image"] = np.full((40, 80, 3), 200, np.uint8)
        if case == "aloha_missing_camera":
            del ex["images"]["cam_left_wrist"]
        examples = ex
    obs = tr(examples)
    ref = _per_array_reference(tr, examples)
    assert tr.upload(tr.host_arrays(examples)).channels_first == case.startswith("aloha")
    for got, want in zip((obs.images, obs.image_mask, obs.tokens, obs.token_mask, obs.state), ref):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), case
    # the staging buffer is reused: a second call must not change the first call's tensors
    before = obs.images.clone()
    tr(make_example(w, seed=9, image_size=R))
    assert torch.equal(obs.images, before)


def test_packed_upload_from_several_threads():
    """The staging buffer is shared: callers on several threads each get their own tensors."""
    from concurrent.futures import ThreadPoolExecutor

    w, cfg = get_workload("tiny"), get_config("tiny")
    tr = ObservationTransform(w, cfg)
    examples = [make_example(w, seed=i, image_size=cfg.vision.image_size) for i in range(16)]
    want = [tr(ex).images for ex in examples]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda ex: tr(ex).images, examples))
    assert all(torch.equal(g, x) for g, x in zip(got, want))


def test_library_entry_points_name_bad_arguments():
    """build_model, Levers.parse, Policy and the transform refuse wrong argument types with messages naming them."""
    from vlaperf.engine.levers import LeverError, Levers

    with pytest.raises(ValueError, match="device: expected 'cpu', 'cuda' or 'cuda:N'"):
        build_model("tiny", "gpu")
    with pytest.raises(ValueError, match="dtype: expected a floating torch dtype or its name"):
        build_model("tiny", "cpu", "int8")
    assert build_model("tiny", "cpu", "bfloat16").dtype == torch.bfloat16
    with pytest.raises(LeverError, match="levers: expected a comma-separated string"):
        Levers.parse(5)
    model = build_model("tiny")
    with pytest.raises(ValueError, match="workload 'libero-pi0' .* does not fit model 'tiny'"):
        Policy(model, model.sample_actions, get_workload("libero-pi0"))
    from vlaperf.profile.breakdown import breakdown
    from vlaperf.profile.doctor import doctor

    with pytest.raises(ValueError, match="workload 'libero-pi0' .* does not fit model 'tiny'"):
        breakdown(model, "libero-pi0", iters=1, warmup=0)
    with pytest.raises(TypeError, match="doctor: the model checks are the pi0 family's and the world-action model's"):
        doctor(torch.nn.Linear(3, 3))
    w = get_workload("tiny")
    ex = make_example(w)
    ex["observation/state"] = np.asarray(ex["observation/state"]) + 1j
    with pytest.raises(InputError, match="observation/state: expected a 1-d numeric array, got dtype complex"):
        Policy(model, model.sample_actions, w).infer(ex)


def test_aloha_camera_names_are_checked_as_openpi_checks_them():
    """A misspelt camera was dropped and masked off, as if that camera were absent, with no word. Now, as in
    openpi's AlohaInputs: cam_high is required, a wrist camera may be left out (zeros, masked off), cam_low is
    taken and unused, and any other name is refused, named."""
    import dataclasses

    cfg = get_config("tiny", action_dim=16)
    workload = dataclasses.replace(get_workload("tiny"), layout="aloha", state_dim=14, robot_action_dim=14,
                                   action_dim=16)
    transform = ObservationTransform(workload, cfg, WordHashTokenizer(cfg.backbone.vocab_size))
    ex = make_example(workload, seed=0, image_size=16)
    typo = dict(ex, images={**{k: v for k, v in ex["images"].items() if k != "cam_left_wrist"},
                            "cam_left_wrst": ex["images"]["cam_left_wrist"]})
    with pytest.raises(InputError, match=r"images: unknown camera 'cam_left_wrst'; expected names among \('cam_high'"):
        transform.validate(typo)
    no_high = dict(ex, images={k: v for k, v in ex["images"].items() if k != "cam_high"})
    with pytest.raises(InputError, match=r"images: missing 'cam_high' \(required; .*got \['cam_left_wrist', 'cam_rig"):
        transform.validate(no_high)
    with pytest.raises(InputError, match="images: expected a dict of camera arrays, got list"):
        transform.validate(dict(ex, images=list(ex["images"].values())))
    with pytest.raises(InputError, match="observation is missing key 'images'"):
        transform.validate({k: v for k, v in ex.items() if k != "images"})
    one_wrist = dict(ex, images={"cam_high": ex["images"]["cam_high"], "cam_right_wrist": ex["images"]["cam_right_wrist"],
                                 "cam_low": ex["images"]["cam_high"]})
    hb = transform.host_arrays(one_wrist)
    assert hb.image_valid == [[True, False, True]]
    assert not hb.pixels[0][1].any() and hb.pixels[0][2].shape == (16, 16, 3)
    assert (hb.pixels[0][2] == ex["images"]["cam_right_wrist"].transpose(1, 2, 0)).all()


def test_printable_escapes_control_characters_and_clips():
    from vlaperf.serve.protocol import printable

    assert printable("x\n2026 CRITICAL fake") == "x\\n2026 CRITICAL fake"
    assert printable("héllo \u2192 ok") == "héllo \u2192 ok"  # printable non-ASCII stays as it is
    assert printable("a" * 10, 5) == "aaaa\u2026"


def test_float_pixels_scale_to_255():
    """Float pixels in [0, 1] convert as openpi does, 1.0 -> 255."""
    from vlaperf.inputs import _image
    img = np.stack([np.zeros((8, 8)), np.full((8, 8), 0.5), np.ones((8, 8))], -1).astype(np.float32)
    out = _image(img, "observation/image", False)
    assert out.dtype == np.uint8 and out[..., 0].max() == 0 and out[..., 1].max() == 127 and out[..., 2].min() == 255


def test_prompt_length_limit_is_inclusive():
    """A prompt of exactly MAX_PROMPT_CHARS characters is taken, one more refused."""
    from vlaperf.inputs import MAX_PROMPT_CHARS, InputError, prompt_text
    assert prompt_text("a" * MAX_PROMPT_CHARS) == "a" * MAX_PROMPT_CHARS
    with pytest.raises(InputError):
        prompt_text("a" * (MAX_PROMPT_CHARS + 1))


def test_host_prompt_len_is_the_longest_prompt():
    """The host-side prompt length (which the engine trims the prompt to) is the LONGEST prompt of the batch."""
    from vlaperf.inputs import ObservationTransform, WordHashTokenizer, make_example
    w = get_workload("libero-pi0")
    tr = ObservationTransform(w, w.model_config(), WordHashTokenizer(1024))
    a, b = make_example(w, seed=0), make_example(w, seed=1)
    a["prompt"], b["prompt"] = "go", "go " * 20
    db = tr.upload(tr.host_arrays([a, b]))
    assert db.host_prompt_len == int(db.token_mask.sum(1).max()) == 22


def test_host_image_valid_is_any_over_the_batch():
    """A camera slot that any sample of the batch has is valid for the batch (the engine skips only slots none has)."""
    from vlaperf.inputs import ObservationTransform, WordHashTokenizer, make_example
    w = get_workload("aloha-pi0")
    tr = ObservationTransform(w, w.model_config(), WordHashTokenizer(1024))
    a, b = make_example(w, seed=0), make_example(w, seed=1)
    del b["images"]["cam_left_wrist"]
    db = tr.upload(tr.host_arrays([a, b]))
    assert db.host_image_valid == (True, True, True)
    assert db.image_mask.tolist() == [[True, True, True], [True, False, True]]


def test_batch_override_cycles_prompt_lengths():
    """A batch override repeats the per-sample prompt lengths cyclically."""
    w = get_workload("libero-pi0-b4")
    assert w.with_overrides(batch=6).prompt_valid == w.prompt_valid + w.prompt_valid[:2]
    assert w.with_overrides(batch=2).prompt_valid == w.prompt_valid[:2]


def test_overrides_vs_keeps_a_chosen_prompt_valid():
    """A prompt_valid that is a real choice (not what the batch size derives) is recorded as an override."""
    import dataclasses
    w = get_workload("libero-pi0-b4")
    assert dataclasses.replace(w, prompt_valid=(5, 5, 5, 5)).overrides_vs(w) == {"prompt_valid": (5, 5, 5, 5)}
    assert w.with_overrides(batch=8).overrides_vs(w) == {"batch": 8}


def test_tokenizer_ids_up_to_the_last_of_the_vocabulary_are_taken():
    """The vocabulary is [0, vocab_size): its last id is taken, vocab_size itself is refused (it would index one
    past the embedding)."""
    from vlaperf.inputs import tokenize_prompt

    class Ids:
        def __init__(self, ids):
            self.ids = ids

        def encode(self, text):
            return self.ids

    tokens, mask = tokenize_prompt(Ids([0, 1023]), "go", 4, vocab_size=1024)
    assert tokens.tolist() == [0, 1023, 0, 0] and mask.tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match=r"gave the id 1024, expected integers in \[0, 1024\)"):
        tokenize_prompt(Ids([2, 1024]), "go", 4, vocab_size=1024)


def test_pi05_prompt_through_a_plain_encode_is_openpis_text():
    """A tokenizer without encode_with_state gets pi0.5's prompt text through encode: the task cleaned as openpi
    cleans it, the state in 256 bins over [-1, 1] (bin = floor((x + 1) * 128)), then the action cue."""
    from vlaperf.inputs import tokenize_prompt

    class Recording:
        def __init__(self):
            self.texts = []

        def encode(self, text):
            self.texts.append(text)
            return [2, 300]

    tok = Recording()
    state = np.array([-1.0, 0.0, 0.5, 0.999])
    tokenize_prompt(tok, "  pick up the bowl \n", 8, state=state)
    bins = np.floor((state + 1) * 128).astype(int)  # [0, 128, 192, 255]
    assert tok.texts == [f"Task: pick up the bowl, State: {' '.join(map(str, bins))};\nAction: "]
    # cleaned as openpi's tokenizer cleans the task: '_' and newlines inside it as spaces (they were kept)
    tokenize_prompt(tok, " pick_up the\nbowl ", 8, state=state)
    assert tok.texts[-1].startswith("Task: pick up the bowl, State: ")


def test_a_workload_of_another_horizon_does_not_fit():
    """check_fits compares the action chunk too: a workload whose horizon is not the model's is refused by name
    (the noise would otherwise have the wrong shape deep inside the call)."""
    from vlaperf.inputs import random_noise

    w = get_workload("tiny")
    with pytest.raises(ValueError, match=r"workload 'tiny' \(preset 'tiny': horizon 10, action dim 8\) does not fit "
                                         r"model 'tiny' \(horizon 5, action dim 8\)"):
        random_noise(w, get_config("tiny", action_horizon=5))
    model = build_model(get_config("tiny", action_horizon=5))
    with pytest.raises(ValueError, match="does not fit model 'tiny' \\(horizon 5"):
        Policy(model, model.sample_actions, w)


def test_float_images_with_nan_and_states_beyond_float32_are_named(libero):
    """validate (a server's check of each request before it joins a batch) names the field: a NaN float image (it
    would pass the [0, 1] range check, NaN comparing false, and become arbitrary pixels) and a float64 state beyond
    float32's range (it would become inf in the model's float32 state)."""
    w, tr = libero
    ex = make_example(w)
    image = np.full((16, 16, 3), 0.5, np.float32)
    image[3, 4, 1] = np.nan
    with pytest.raises(InputError, match="observation/wrist_image: image holds NaN or inf"):
        tr.validate(dict(ex, **{"observation/wrist_image": image}))
    state = np.zeros(8)
    state[2] = 1e39
    with pytest.raises(InputError, match=r"observation/state: state holds values beyond float32's range"):
        tr.validate(dict(ex, **{"observation/state": state}))


def test_a_bad_observation_in_a_list_is_named_by_its_index(libero):
    """Policy.infer([...]) with one bad observation of three said "observation/state: expected 8 values, got 3"
    without which one; the error now leads with its index (a single observation's stays as it was)."""
    w, tr = libero
    good = make_example(w)
    bad = dict(good, **{"observation/state": np.zeros(3)})
    with pytest.raises(InputError, match=r"^observation \[1\] of 3: observation/state: expected 8 values, got 3"):
        tr.host_arrays([good, bad, good])
    with pytest.raises(InputError, match=r"^observation/state: expected 8 values, got 3"):
        tr.host_arrays(bad)


def test_a_state_that_overflows_its_normalization_is_an_input_error():
    """A finite state can leave float32's range once normalized (a constant dimension: std 0, divided by eps
    1e-6): refused as an InputError naming the state, not sent to the model as inf."""
    from vlaperf.normalize import ArrayStats, NormStats

    w = get_workload("tiny")
    ns = NormStats(ArrayStats(np.zeros(8), np.zeros(8)), None, quantile=False)
    tr = ObservationTransform(w, get_config("tiny"), norm_stats=ns)
    ex = make_example(w)
    tr.host_arrays(ex)  # a state in range normalizes
    state = np.zeros(8, np.float32)
    state[5] = 1e36  # / 1e-6 = 1e42 > float32's 3.4e38
    with pytest.raises(InputError, match="state: not finite after its normalization"):
        tr.host_arrays(dict(ex, **{"observation/state": state}))


def test_policy_refuses_non_finite_actions_naming_the_rows_with_its_timing():
    """Policy.infer never returns NaN or inf actions: NonFiniteActions names the batch rows at fault (inf counts as
    much as NaN) and carries the whole batch's actions and the call's timing, so a server can answer the others.
    The timing's parts add up to infer_ms, in milliseconds."""
    from vlaperf.policy import NonFiniteActions

    w = get_workload("tiny")
    model = build_model("tiny")

    def sample(obs, noise, steps):
        time.sleep(0.02)
        actions = torch.zeros(obs.batch, w.horizon, model.config.action_dim)
        actions[1, 3, 2] = float("inf")  # a robot dim
        actions[0, 0, 7] = float("nan")  # past the robot's 7 dims: never returned, so no fault
        return actions

    policy = Policy(model, sample, w)
    with pytest.raises(NonFiniteActions, match="the actions hold NaN or inf") as err:
        policy.infer([make_example(w, seed=i) for i in range(3)])
    assert err.value.rows == [1] and err.value.actions.shape == (3, 10, 7)
    timing = err.value.timing
    assert timing["sample_and_copy_ms"] >= 20
    assert timing["infer_ms"] == pytest.approx(timing["transform_ms"] + timing["sample_and_copy_ms"])
    assert 0 < timing["transform_ms"] < timing["infer_ms"]
    # verify (the engine's kernel-fault check) runs before this check, its error naming the cause, and its time
    # counts as the sample's
    waits = []
    checked = Policy(model, sample, w, verify=lambda: waits.append(time.sleep(0.02)))
    with pytest.raises(NonFiniteActions) as err:
        checked.infer([make_example(w, seed=i) for i in range(2)])
    assert len(waits) == 1 and err.value.timing["sample_and_copy_ms"] >= 40

    def fault():
        raise RuntimeError("kernel fault")

    with pytest.raises(RuntimeError, match="kernel fault"):
        Policy(model, sample, w, verify=fault).infer([make_example(w, seed=i) for i in range(2)])


def test_policy_noise_serves_only_its_batch_size():
    """A fixed noise is passed for calls of its batch size; calls of another size get None (fresh noise)."""
    w = get_workload("tiny")
    model = build_model("tiny")
    noise = torch.randn(2, w.horizon, model.config.action_dim)
    seen = []

    def sample(obs, noise_given, steps):
        seen.append(noise_given)
        return torch.zeros(obs.batch, w.horizon, model.config.action_dim)

    policy = Policy(model, sample, w, noise=noise)
    policy.infer([make_example(w, seed=0), make_example(w, seed=1)])
    policy.infer(make_example(w))
    assert seen[0] is noise and seen[1] is None


def test_image_sides_are_taken_from_4_to_4096_pixels():
    """Each side of a camera image is in [4, 4096], both ends taken; outside, the error names the camera."""
    from vlaperf.inputs import _image

    for shape in [(4, 4, 3), (4096, 4, 3), (4, 4096, 3)]:
        assert _image(np.zeros(shape, np.uint8), "observation/image", False).shape == shape
    for shape, size in [((4, 3, 3), r"\(4, 3\)"), ((2, 8, 3), r"\(2, 8\)"), ((8, 4097, 3), r"\(8, 4097\)"),
                        ((4097, 8, 3), r"\(4097, 8\)")]:
        with pytest.raises(InputError, match=rf"observation/image: image size {size} out of range \[4, 4096\]"):
            _image(np.zeros(shape, np.uint8), "observation/image", False)


def test_word_hash_tokenizer_needs_room_past_the_reserved_ids():
    """Ids below 256 are reserved (BOS 2, newline 108): a vocabulary smaller than 256 is refused by name."""
    assert WordHashTokenizer(256).vocab_size == 256
    with pytest.raises(ValueError, match="vocab_size must be >= 256, got 255"):
        WordHashTokenizer(255)


def test_paligemma_prompt_cleaning_is_openpis():
    """openpi cleans the task: stripped, '_' and newlines as spaces."""
    from vlaperf.inputs import PaligemmaTokenizer

    assert PaligemmaTokenizer.clean("  pick_up\nthe bowl \n") == "pick up the bowl"


def test_overrides_are_checked_and_a_new_batch_repeats_the_prompt_lengths():
    """batch / steps must be integers >= 1 (the message names the field and the value); None keeps the workload's;
    another batch size repeats the per-sample prompt lengths cyclically, which overrides_vs does not record as a
    choice, while prompt lengths set by hand are recorded."""
    import dataclasses

    from vlaperf.workloads import get_workload as gw

    b4 = gw("libero-pi0-b4")  # prompt lengths (12, 17, 23, 28)
    for name, value in (("batch", 2.5), ("batch", "4"), ("steps", 0)):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1, got {value!r}"):
            b4.with_overrides(**{name: value})
    assert b4.with_overrides(batch=None, steps=None) is b4
    b6 = b4.with_overrides(batch=6)
    assert b6.prompt_valid == (12, 17, 23, 28, 12, 17) and b6.overrides_vs(b4) == {"batch": 6}
    assert b4.with_overrides(batch=2).prompt_valid == (12, 17)
    own = dataclasses.replace(b6, prompt_valid=(28,) * 6)
    assert own.overrides_vs(b4) == {"batch": 6, "prompt_valid": (28,) * 6}


def test_a_workloads_model_config_has_its_action_chunk():
    """droid-pi0 / droid-pi05 run their preset with openpi's chunk for DROID (10, 15 actions), not the preset's."""
    from vlaperf.models.pi0 import get_config
    from vlaperf.workloads import get_workload as gw

    assert gw("droid-pi0").model_config().action_horizon == 10 != get_config("pi0").action_horizon
    assert gw("droid-pi05").model_config().action_horizon == 15 != get_config("pi05").action_horizon
    assert gw("libero-pi0").model_config() == get_config("pi0")


def test_unknown_workload_lists_both_families():
    from vlaperf.workloads import WAM_WORKLOADS, WORKLOADS
    from vlaperf.workloads import get_workload as gw

    with pytest.raises(ValueError) as e:
        gw("nope")
    assert str(e.value).endswith("expected one of: " + ", ".join(list(WORKLOADS) + list(WAM_WORKLOADS)))


def test_standard_workloads_are_the_design_files_rows():
    """The rows of shared/design/workloads.md (every figure names one of them, so they must not drift):
    (preset, batch, image slots valid, prompt slots, valid tokens, state dim, horizon, action dim, steps); and the
    extra layouts' relations stated beside the table: pi0.5 ALOHA is aloha-pi0's cameras, state and chunk with pi0.5's
    200 prompt slots."""
    from vlaperf.workloads import WAM_WORKLOADS, WORKLOADS

    def row(w):
        return (w.preset, w.batch, w.image_valid, w.prompt_slots, w.prompt_valid[0], w.state_dim, w.horizon,
                w.action_dim, w.steps)

    libero = (True, True, False)
    assert row(WORKLOADS["libero-pi0"]) == ("pi0", 1, libero, 48, 20, 8, 50, 32, 10)
    assert row(WORKLOADS["libero-pi05"]) == ("pi05", 1, libero, 200, 64, 8, 10, 32, 10)
    assert row(WORKLOADS["libero-shallow6"]) == ("shallow6", 1, libero, 48, 20, 8, 50, 32, 10)
    assert row(WORKLOADS["aloha-pi0"]) == ("pi0", 1, (True,) * 3, 48, 6, 14, 50, 32, 10)
    assert row(WORKLOADS["tiny"]) == ("tiny", 1, libero, 16, 6, 8, 10, 8, 4)
    for b in (4, 8):
        w = WORKLOADS[f"libero-pi0-b{b}"]
        assert w.batch == len(w.prompt_valid) == b and (min(w.prompt_valid), max(w.prompt_valid)) == (12, 28)
    a0, a5 = WORKLOADS["aloha-pi0"], WORKLOADS["aloha-pi05"]
    assert (a5.image_valid, a5.state_dim, a5.robot_action_dim, a5.horizon) == (a0.image_valid, a0.state_dim,
                                                                              a0.robot_action_dim, a0.horizon)
    assert a5.prompt_slots == WORKLOADS["libero-pi05"].prompt_slots == 200
    assert [(w.steps, w.video_steps) for w in WAM_WORKLOADS.values()] == [(10, 5), (4, 2)]


def test_upload_extras_travel_in_the_same_transfer():
    """Extra float32 arrays (real-time chunking's guidance) come back as device views of the one staged copy, equal
    to what was sent and placed after the observation's arrays; the observation's own views are unchanged."""
    from vlaperf.inputs import ObservationTransform, WordHashTokenizer, make_example
    w = get_workload("libero-pi0")
    tr = ObservationTransform(w, w.model_config(), WordHashTokenizer(1024))
    hb = tr.host_arrays(make_example(w, seed=3))
    plain = tr.upload(hb)
    target = np.random.default_rng(0).standard_normal((1, 50, 32)).astype(np.float32)
    weights = np.linspace(1, 0, 50, dtype=np.float32)[None]
    db = tr.upload(hb, extras=(target, weights))
    assert plain.extras == () and len(db.extras) == 2
    assert np.array_equal(db.extras[0].numpy(), target) and np.array_equal(db.extras[1].numpy(), weights)
    assert db.extras[0].dtype == torch.float32 and db.extras[1].shape == (1, 50)
    for name in ("image_mask", "tokens", "token_mask", "state"):
        assert torch.equal(getattr(db, name), getattr(plain, name)), name
    assert torch.equal(db.pixels, plain.pixels)
    # the extras are views of the copy, not of the reused staging buffer: the next upload leaves them as they were
    tr.upload(hb, extras=(np.zeros_like(target), np.zeros_like(weights)))
    assert np.array_equal(db.extras[0].numpy(), target)
    with pytest.raises(TypeError, match="float64"):
        tr.upload(hb, extras=(target.astype(np.float64),))


def test_a_prompt_that_is_no_unicode_text_is_an_input_error():
    """A lone surrogate reaches the prompt in a 0-d "<U" array (msgpack's own strings are checked UTF-8, numpy's
    UCS-4 is not): validate let it pass and the tokenizer failed with UnicodeEncodeError, an InternalError that
    failed the batch it shared. Now the request check refuses it, named."""
    import msgpack

    from vlaperf.serve.protocol import unpackb

    w = get_workload("tiny")
    transform = ObservationTransform(w, get_config("tiny"))
    ucs4 = "a".encode("utf-32-le") + (0xD800).to_bytes(4, "little")  # as np.asarray(prompt) holds it, UCS-4
    prompt = unpackb(msgpack.packb({b"__ndarray__": True, b"data": ucs4, b"dtype": "<U2", b"shape": []},
                                   use_bin_type=True))
    assert prompt == "a\ud800"
    with pytest.raises(InputError, match=r"prompt: not valid text \(surrogates not allowed: '\\ud800' at character 1"):
        transform.validate(dict(make_example(w), prompt=prompt))
