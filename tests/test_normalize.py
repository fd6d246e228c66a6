"""openpi's normalization statistics (vlaperf/normalize.py), the PaliGemma tokenizer wrapper, and both
wired through the policy and `vlaperf serve`."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from vlaperf.inputs import ObservationTransform, PaligemmaTokenizer, make_example, state_prompt
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.normalize import EPS, NormStats, NormStatsError
from vlaperf.policy import Policy
from vlaperf.workloads import get_workload

TINY = get_workload("tiny")  # state 8, robot actions 7


def _stats(dims: dict[str, int], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for key, d in dims.items():
        q01 = rng.uniform(-3, -1, d)
        out[key] = {"mean": rng.normal(size=d).tolist(), "std": rng.uniform(0.5, 2.0, d).tolist(),
                    "q01": q01.tolist(), "q99": (q01 + rng.uniform(1, 4, d)).tolist()}
    return {"norm_stats": out}


def _write(tmp_path, doc, name="norm_stats.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


@pytest.mark.parametrize("quantile", [False, True], ids=["zscore", "quantile"])
def test_normalize_and_unnormalize_follow_openpis_formulas(tmp_path, quantile):
    doc = _stats({"state": 10, "actions": 5})  # longer state stats (cut to the array), shorter action stats
    _write(tmp_path, doc)
    ns = NormStats.load(tmp_path, quantile)  # the folder holding norm_stats.json
    st, ac = ({f: np.asarray(v) for f, v in doc["norm_stats"][k].items()} for k in ("state", "actions"))
    x = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    if quantile:
        want = (x - st["q01"][:8]) / (st["q99"][:8] - st["q01"][:8] + EPS) * 2 - 1
    else:
        want = (x - st["mean"][:8]) / (st["std"][:8] + EPS)
    np.testing.assert_allclose(ns.normalize_state(x), want, rtol=1e-5, atol=1e-5)
    y = np.random.default_rng(2).uniform(-1, 1, size=(4, 10, 7)).astype(np.float32)
    out = ns.unnormalize_actions(y)
    if quantile:
        head = (y[..., :5] + 1) / 2 * (ac["q99"] - ac["q01"] + EPS) + ac["q01"]
    else:
        head = y[..., :5] * (ac["std"] + EPS) + ac["mean"]
    np.testing.assert_allclose(out[..., :5], head, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[..., 5:], y[..., 5:])  # past the statistics: unchanged, as openpi
    assert out.dtype == np.float32 and ns.normalize_state(x).dtype == np.float32
    assert ns.describe().startswith("quantile" if quantile else "z-score")


@pytest.mark.parametrize("content,message", [
    (None, "cannot read the normalization statistics"),
    ("{not json", "not JSON"),
    ({"state": {}}, "expected openpi's layout, an object with 'norm_stats'"),
    ({"norm_stats": {"other": {}}}, "'norm_stats' has neither 'state' nor 'actions'"),
    ({"norm_stats": {"state": {"mean": [0.0]}}}, r"norm_stats.state.std: missing"),
    ({"norm_stats": {"state": {"mean": [0.0], "std": [1.0]}}}, r"norm_stats.state.q01: missing \(quantile"),
    ({"norm_stats": {"state": {"mean": [0, 1], "std": [1.0], "q01": [0, 0], "q99": [1, 1]}}}, "its lists differ in length"),
    ({"norm_stats": {"state": {"mean": [float("nan")], "std": [1.0], "q01": [0], "q99": [1]}}}, "finite numbers"),
    ({"norm_stats": {"state": {"mean": ["a"], "std": [1.0], "q01": [0], "q99": [1]}}}, "expected a list of numbers"),
    ({"norm_stats": {"state": {"mean": [0], "std": [-1.0], "q01": [0], "q99": [1]}}}, "std: negative values"),
    # q01 and q99 swapped on a dimension: quantile normalization would mirror it, silently
    ({"norm_stats": {"state": {"mean": [0, 0], "std": [1, 1], "q01": [0, 1], "q99": [1, 0]}}},
     r"norm_stats.state.q99: below q01 in dimension\(s\) \[1\]"),
])
def test_bad_statistics_files_are_named_errors(tmp_path, content, message):
    path = tmp_path / "missing.json" if content is None else _write(tmp_path, content)
    with pytest.raises(NormStatsError, match=message) as err:
        NormStats.load(path, quantile=True)
    assert str(path) in str(err.value)


def test_policy_normalizes_the_state_and_unnormalizes_the_actions(tmp_path):
    """With statistics, a call equals the plain policy fed the normalized state, its actions unnormalized."""
    model = build_model("tiny")
    noise = torch.randn(1, model.config.action_horizon, model.config.action_dim)
    ns = NormStats.load(_write(tmp_path, _stats({"state": 8, "actions": 7})), quantile=False)
    plain = Policy(model, model.sample_actions, TINY, noise=noise)
    normed = Policy(model, model.sample_actions, TINY, noise=noise, norm_stats=ns)
    ex = make_example(TINY, seed=4)
    pre = dict(ex, **{"observation/state": ns.normalize_state(np.asarray(ex["observation/state"], np.float32))})
    np.testing.assert_allclose(normed.infer(ex)["actions"], ns.unnormalize_actions(plain.infer(pre)["actions"]),
                               rtol=1e-5, atol=1e-5)
    short = NormStats.load(_write(tmp_path, _stats({"state": 5}), "short.json"), quantile=False)
    with pytest.raises(NormStatsError, match="'state' has 5 dimensions, the workload's state 8"):
        Policy(model, model.sample_actions, TINY, norm_stats=short)


def _sentencepiece_model(tmp_path) -> str:
    spm = pytest.importorskip("sentencepiece")
    text = tmp_path / "corpus.txt"
    words = "pick up the black bowl and place it on the plate open the drawer put the cream cheese in the basket"
    text.write_text("\n".join([words, "Task: State: Action:", *[" ".join(map(str, range(i, i + 20))) for i in range(0, 256, 20)]]))
    prefix = tmp_path / "tok"
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=120, model_type="bpe",
                                   bos_id=2, eos_id=1, pad_id=0, unk_id=3, user_defined_symbols=["\n"],
                                   remove_extra_whitespaces=False, minloglevel=2)
    return str(prefix) + ".model"


def test_paligemma_tokenizer_uses_openpis_prompt_conventions(tmp_path):
    """pi0: BOS, the cleaned task, the newline token; pi0.5: "Task: ..., State: <bins>;\\nAction: " with BOS.
    The transform hands pi0.5's normalized state to `encode_with_state`."""
    tok = PaligemmaTokenizer(_sentencepiece_model(tmp_path))
    sp = tok.sp
    assert tok.encode("  pick_up the bowl\n") == [sp.bos_id(), *sp.encode("pick up the bowl"), *sp.encode("\n")]
    state = np.linspace(-1.2, 1.2, 8)
    assert tok.encode_with_state("open the drawer", state) == sp.encode(
        f"Task: open the drawer, {state_prompt(state)}\nAction: ", add_bos=True)
    cfg = get_config("tiny", pi05=True)
    ns = NormStats.load(_write(tmp_path, _stats({"state": 8, "actions": 7})), quantile=True)
    tr = ObservationTransform(TINY, cfg, tok, norm_stats=ns)
    ex = make_example(TINY, seed=1)
    want = tok.encode_with_state(ex["prompt"], ns.normalize_state(np.asarray(ex["observation/state"], np.float32)))
    want = want[: TINY.prompt_slots]
    obs = tr(ex)
    assert obs.tokens[0, : len(want)].tolist() == want and int(obs.token_mask[0].sum()) == len(want)
    lerobot = PaligemmaTokenizer(tok.source, style="lerobot")  # LeRobot's pi0: the task as given, a newline at its end
    assert lerobot.encode("  pick_up the bowl") == sp.encode("  pick_up the bowl\n", add_bos=True)
    assert lerobot.encode("pick up\n") == sp.encode("pick up\n", add_bos=True)
    with pytest.raises(ValueError, match="style: expected 'openpi' or 'lerobot'"):
        PaligemmaTokenizer(tok.source, style="hf")
    with pytest.raises(FileNotFoundError, match="no such file"):
        PaligemmaTokenizer(tmp_path / "nope.model")
    bad = _write(tmp_path, "not a model", "bad.model")
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        PaligemmaTokenizer(bad)


def test_a_tokenizer_of_the_other_prompt_style_is_refused_by_the_conventions(tmp_path):
    """pi0's prompt is openpi's (the task cleaned) or LeRobot's (as given): a Policy given conventions and a
    tokenizer built for the other training said nothing and fed the model prompts it was not trained on."""
    from vlaperf.policy import load_checkpoint_io

    openpi_style = PaligemmaTokenizer(_sentencepiece_model(tmp_path))
    lerobot_style = PaligemmaTokenizer(openpi_style.source, style="lerobot")
    tiny50 = TINY.with_overrides(horizon=50)
    model = build_model(get_config("tiny", action_horizon=50))
    with pytest.raises(ValueError, match=r"tokenizer: builds pi0's prompt in openpi's style; conventions "
                                         r"'lerobot:pi0' were trained with lerobot's .*style='lerobot'"):
        Policy(model, model.sample_actions, tiny50, tokenizer=openpi_style, conventions="lerobot:pi0")
    with pytest.raises(ValueError, match="in lerobot's style; conventions 'openpi:pi0_libero'"):
        Policy(model, model.sample_actions, tiny50, tokenizer=lerobot_style, conventions="openpi:pi0_libero")
    Policy(model, model.sample_actions, tiny50, tokenizer=lerobot_style, conventions="lerobot:pi0")
    Policy(model, model.sample_actions, tiny50, tokenizer=lerobot_style)  # no conventions: the caller's choice
    tokenizer, _ = load_checkpoint_io(openpi_style.source, None, model.config, "lerobot:pi0")
    assert tokenizer.style == "lerobot"
    Policy(model, model.sample_actions, tiny50, tokenizer=tokenizer, conventions="lerobot:pi0")
    pi05 = build_model(get_config("tiny", pi05=True, action_horizon=50))  # pi0.5's prompt has one form
    Policy(pi05, pi05.sample_actions, tiny50, tokenizer=lerobot_style, conventions="lerobot:pi05")


def test_serve_checks_tokenizer_and_norm_stats_before_serving(tmp_path, capsys):
    from vlaperf.cli import main as run_cli

    bad = _write(tmp_path, {"norm_stats": {}})
    assert run_cli(["serve", "--device", "cpu", "--no-check", "--port", "0", "--norm-stats", str(bad)]) == 2
    assert "--norm-stats: " in capsys.readouterr().err
    assert run_cli(["serve", "--device", "cpu", "--no-check", "--port", "0", "--tokenizer", str(tmp_path / "x.model")]) == 2
    assert "--tokenizer: tokenizer model" in capsys.readouterr().err


def test_server_metadata_names_the_tokenizer_and_normalization(tmp_path):
    from vlaperf.serve.server import PolicyServer

    model = build_model("tiny")
    ns = NormStats.load(_write(tmp_path, _stats({"state": 8, "actions": 7})), quantile=False)
    server = PolicyServer(Policy(model, model.sample_actions, TINY, norm_stats=ns), port=0, warmup_batch_sizes=())
    meta = server._build_metadata()
    assert meta["tokenizer"] == "WordHashTokenizer" and meta["normalization"].startswith("z-score (mean/std) of state, actions")
    plain = PolicyServer(Policy(model, model.sample_actions, TINY), port=0, warmup_batch_sizes=())._build_metadata()
    assert plain["normalization"] is None


def test_serving_a_checkpoint_without_its_conventions_warns(capsys, tmp_path):
    from vlaperf.cli import main as run_cli
    from vlaperf.serve.commands import warn_unconverted_checkpoint

    warn_unconverted_checkpoint(None, None, None)  # random weights: nothing to warn about
    assert capsys.readouterr().err == ""
    warn_unconverted_checkpoint("model.safetensors", None, None, None)
    err = capsys.readouterr().err
    assert "without --tokenizer" in err and "without --norm-stats" in err and "without --conventions" in err
    warn_unconverted_checkpoint("model.safetensors", None, None, None, "droid", True)  # the ones that would fit
    assert "this workload's model and layout take openpi:pi05_droid, lerobot:pi05, lerobot0.4:pi05" in \
        capsys.readouterr().err
    warn_unconverted_checkpoint("model.safetensors", None, None, "none")  # chosen: no warning about conventions
    assert "--conventions" not in capsys.readouterr().err
    stats = tmp_path / "pi05_libero" / "assets" / "physical-intelligence" / "libero" / "norm_stats.json"  # openpi's
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    warn_unconverted_checkpoint(str(tmp_path / "pi05_libero"), object(), None, "none")
    assert f"this checkpoint folder has {stats}" in capsys.readouterr().err
    lerobot = tmp_path / "pi0_lerobot"  # LeRobot's folder: its config and its preprocessor's statistics
    lerobot.mkdir()
    (lerobot / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 50}))
    (lerobot / "policy_preprocessor.json").write_text("{}")
    warn_unconverted_checkpoint(str(lerobot / "model.safetensors"), object(), None, None, "libero", False)
    err = capsys.readouterr().err
    assert "conventions: this is a LeRobot checkpoint: lerobot:pi0 (docs/serving.md" in err
    assert f"(this LeRobot checkpoint folder has them: --norm-stats {lerobot})" in err
    # LeRobot's chunk is the checkpoint's own: one trained with 5 is as much a LeRobot checkpoint (lerobot:pi0 was
    # refused for it, and the warning named conventions that would be)
    (lerobot / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 5}))
    warn_unconverted_checkpoint(str(lerobot / "model.safetensors"), object(), None, None, "libero", False)
    assert "conventions: this is a LeRobot checkpoint: lerobot:pi0 (docs/serving.md" in capsys.readouterr().err
    assert run_cli(["serve", "--workload", "wam-tiny", "--device", "cpu", "--norm-stats", "x.json"]) == 2
    assert "--tokenizer / --norm-stats / --conventions / --action-horizon: the pi0 family's; wam-tiny" in \
        capsys.readouterr().err


def test_the_conventions_named_without_conventions_say_the_chunk_they_would_serve(capsys, tmp_path):
    """serve --workload tiny without --conventions named openpi:pi0_libero and lerobot:pi0 as what tiny takes,
    both trained with 50 actions a chunk: adding one serves 50 actions, not tiny's 10 (and refuses an
    --action-horizon 10). The warning says so; where the chunk served is theirs, it names them plainly."""
    from vlaperf.checkpoints import save_checkpoint
    from vlaperf.cli import build_parser, resolve_shape
    from vlaperf.serve.commands import _precheck_pi0

    ckpt = save_checkpoint(build_model(TINY.model_config()), tmp_path / "ckpt")
    serve = ["serve", "--checkpoint", str(ckpt), "--workload", "tiny", "--device", "cpu"]
    _precheck_pi0(build_parser().parse_args(serve), "tiny")
    err = " ".join(capsys.readouterr().err.split())
    assert ("this workload's model and layout take openpi:pi0_libero, lerobot:pi0, each with 50 actions a chunk, "
            "not the 10 served now") in err
    for name in ("openpi:pi0_libero", "lerobot:pi0"):  # what the words claim: either serves 50 actions a chunk
        workload, _ = resolve_shape(build_parser().parse_args([*serve, "--conventions", name]), TINY)
        assert (TINY.horizon, workload.horizon) == (10, 50)
    _precheck_pi0(build_parser().parse_args([*serve, "--action-horizon", "50"]), "tiny")
    err = " ".join(capsys.readouterr().err.split())
    assert "take openpi:pi0_libero, lerobot:pi0 (docs/serving.md" in err and "served now" not in err


@pytest.mark.parametrize("quantile", [False, True], ids=["mean_std", "quantiles"])
def test_lerobot_normalizer_files_use_lerobots_arithmetic(tmp_path, quantile):
    """LeRobot's preprocessor saves "<feature>.<stat>" tensors; its MEAN_STD adds eps 1e-8 when normalizing
    only, its QUANTILES use q99 - q01 as is. A folder with one such file is read too."""
    from safetensors.numpy import save_file

    doc = _stats({"state": 8, "actions": 7}, seed=3)["norm_stats"]
    flat = {f"{feature}.{stat}": np.asarray(v, np.float32) for key, feature in (("state", "observation.state"),
                                                                                 ("actions", "action"))
            for stat, v in doc[key].items()}
    flat["observation.images.image.mean"] = np.zeros((3, 1, 1), np.float32)  # visual stats: not ours
    save_file(flat, str(tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    ns = NormStats.load(tmp_path, quantile)
    assert ns.convention == "lerobot" and "lerobot's arithmetic" in ns.describe()
    st = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in doc["state"].items()}
    ac = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in doc["actions"].items()}
    x = np.random.default_rng(5).normal(size=(2, 8))
    y = np.random.default_rng(6).uniform(-1, 1, size=(2, 10, 7))
    if quantile:
        want_x = 2.0 * (x - st["q01"]) / (st["q99"] - st["q01"]) - 1.0
        want_y = (y + 1.0) * (ac["q99"] - ac["q01"]) / 2.0 + ac["q01"]
    else:
        want_x = (x - st["mean"]) / (st["std"] + 1e-8)
        want_y = y * ac["std"] + ac["mean"]
    np.testing.assert_allclose(ns.normalize_state(x), want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ns.unnormalize_actions(y), want_y, rtol=1e-5, atol=1e-5)
    save_file({"other.mean": np.zeros(3, np.float32)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(NormStatsError, match="no 'observation.state.\\*' or 'action.\\*' statistics"):
        NormStats.load(tmp_path / "x.safetensors", quantile)


def _lerobot_folder(tmp_path, seed=3, steps=None, norm_map=None, eps=None):
    """A LeRobot checkpoint folder: the pre- and postprocessor's statistics files (the same statistics under
    two names) and, with `steps`/`norm_map`, the preprocessor's pipeline JSON."""
    from safetensors.numpy import save_file

    doc = _stats({"state": 8, "actions": 7}, seed=seed)["norm_stats"]
    flat = {f"{feature}.{stat}": np.asarray(v, np.float32) for key, feature in (("state", "observation.state"),
                                                                                 ("actions", "action"))
            for stat, v in doc[key].items()}
    save_file(flat, str(tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"))
    save_file({k: v * 0 for k, v in flat.items()},
              str(tmp_path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    if steps is not None or norm_map is not None:
        config = {"features": {}, "norm_map": norm_map or {}}
        if eps is not None:
            config["eps"] = eps
        pipeline = {"name": "policy_preprocessor", "steps": (steps or []) + [
            {"registry_name": "normalizer_processor", "config": config,
             "state_file": "policy_preprocessor_step_2_normalizer_processor.safetensors"}]}
        (tmp_path / "policy_preprocessor.json").write_text(json.dumps(pipeline))
    return doc


def test_lerobot_folder_takes_the_normalizer_not_the_unnormalizer(tmp_path):
    """A saved LeRobot checkpoint holds "*_normalizer_processor" and "*_unnormalizer_processor" files; the
    folder is read as the normalizer's (the unnormalizer's name ends the same way)."""
    doc = _lerobot_folder(tmp_path)
    ns = NormStats.load(tmp_path, quantile=False)
    assert ns.source.endswith("policy_preprocessor_step_2_normalizer_processor.safetensors")
    np.testing.assert_allclose(ns.state.mean, np.asarray(doc["state"]["mean"], np.float32))


def test_lerobot_pipeline_json_given_as_a_file_is_read_as_its_folder(tmp_path):
    """--norm-stats .../policy_preprocessor.json (the file that names the statistics, as a Hub path
    hf://owner/name/policy_preprocessor.json names it too) was read as openpi's norm_stats.json and refused as
    "expected openpi's layout"; it is the pipeline, read as its folder is."""
    _lerobot_folder(tmp_path, norm_map={"STATE": "MEAN_STD", "ACTION": "IDENTITY"}, eps=1e-3)
    folder, file = NormStats.load(tmp_path, quantile=True), NormStats.load(tmp_path / "policy_preprocessor.json", True)
    assert file == dataclasses.replace(folder, state=file.state) and file.actions is None and file.lerobot_eps == 1e-3
    np.testing.assert_array_equal(file.state.mean, folder.state.mean)


def test_lerobot_pipeline_json_gives_the_modes_and_eps(tmp_path):
    """policy_preprocessor.json's normalizer step: its norm_map replaces the model's default mode per feature
    type, its eps is used; modes vlaperf lacks are refused, naming the file."""
    doc = _lerobot_folder(tmp_path, norm_map={"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "IDENTITY"},
                          eps=1e-3)
    ns = NormStats.load(tmp_path, quantile=True)  # a pi0.5 fine-tuned with MEAN_STD on the state
    st = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in doc["state"].items()}
    x = np.random.default_rng(1).normal(size=8)
    np.testing.assert_allclose(ns.normalize_state(x), (x - st["mean"]) / (st["std"] + 1e-3), rtol=1e-5)
    y = np.random.default_rng(2).normal(size=(1, 4, 7)).astype(np.float32)
    np.testing.assert_array_equal(ns.unnormalize_actions(y), y)  # ACTION: IDENTITY
    assert ns.mode("state") == "MEAN_STD" and ns.actions is None
    assert "z-score (mean/std) of state" in ns.describe() and "policy_preprocessor.json" in ns.describe()
    _lerobot_folder(tmp_path, norm_map={"STATE": "MIN_MAX", "ACTION": "MEAN_STD"})
    with pytest.raises(NormStatsError, match="norm_map.STATE is 'MIN_MAX'; vlaperf applies MEAN_STD, QUANTILES"):
        NormStats.load(tmp_path, quantile=False)
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"steps": []}))
    with pytest.raises(NormStatsError, match="expected one 'normalizer_processor' step"):
        NormStats.load(tmp_path, quantile=False)


def test_resize_with_pad_matches_openpis_pil_resize():
    """openpi resizes camera images with PIL's (antialiased) bilinear filter, sides rounded down: within one
    level of 255 (rounding), for shrinking and growing images of several aspect ratios."""
    Image = pytest.importorskip("PIL.Image")
    from vlaperf.inputs import resize_with_pad

    rng = np.random.default_rng(0)
    for H, W in [(480, 640), (480, 848), (300, 100), (120, 160)]:
        a = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        ours = resize_with_pad(torch.from_numpy(a), 224).permute(1, 2, 0).numpy().astype(int)
        ratio = max(W / 224, H / 224)
        h, w = int(H / ratio), int(W / ratio)
        want = Image.new("RGB", (224, 224), 0)
        want.paste(Image.fromarray(a).resize((w, h), resample=Image.BILINEAR), ((224 - w) // 2, (224 - h) // 2))
        diff = np.abs(ours - np.asarray(want).astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.2, (H, W, diff.mean())


def test_lerobot_norm_map_leaves_unnamed_types_as_they_are(tmp_path):
    """LeRobot leaves a feature type its norm_map does not name unnormalized (IDENTITY); a norm_map that is
    no object is refused."""
    _lerobot_folder(tmp_path, norm_map={"STATE": "MEAN_STD"})
    ns = NormStats.load(tmp_path, quantile=True)
    assert ns.mode("state") == "MEAN_STD" and ns.actions is None
    y = np.ones((1, 3, 7), np.float32)
    np.testing.assert_array_equal(ns.unnormalize_actions(y), y)
    doc = json.loads((tmp_path / "policy_preprocessor.json").read_text())
    doc["steps"][-1]["config"]["norm_map"] = ["STATE"]
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(doc))
    with pytest.raises(NormStatsError, match="config.norm_map: expected an object"):
        NormStats.load(tmp_path, quantile=True)


def test_serve_refuses_short_state_statistics_before_building(tmp_path, capsys, monkeypatch):
    """Statistics with fewer state dims than the workload's are refused as --norm-stats, before the model is
    built (it was a traceback after the build and the check)."""
    from vlaperf.cli import main as run_cli

    monkeypatch.setattr("vlaperf.cli.setup", lambda args: pytest.fail("the model was built"))
    short = _write(tmp_path, _stats({"state": 5, "actions": 7}))
    assert run_cli(["serve", "--device", "cpu", "--port", "0", "--norm-stats", str(short)]) == 2
    assert "--norm-stats: " in (err := capsys.readouterr().err) and "'state' has 5 dimensions" in err, err


def test_a_statistic_the_mode_does_not_read_may_be_nan(tmp_path):
    """z-score reads mean and std only: a NaN in q01 (a dataset whose quantiles were never computed) does not
    refuse the file; under quantiles it does, naming the field."""
    doc = _stats({"state": 8, "actions": 7})
    doc["norm_stats"]["state"]["q01"][0] = float("nan")
    path = _write(tmp_path, doc)
    assert NormStats.load(path, quantile=False).state.q01 is None
    with pytest.raises(NormStatsError, match="norm_stats.state.q01: expected a non-empty list of finite numbers, got "
                                             "non-finite values"):
        NormStats.load(path, quantile=True)


def test_numbers_written_as_strings_or_booleans_are_refused(tmp_path):
    """numpy turned ["0.1", "0.2"] and [true, false] into numbers, so such a file was read without a word: refused,
    naming the file, the key path and the value, as a boolean eps is. A statistic the mode never reads is skipped, as
    a NaN in it is; a LeRobot file's boolean tensor is refused the same way, under its own key."""
    from safetensors.numpy import save_file

    for stat, value, got in (("mean", ["0.1"] * 8, "'0.1' at index 0"), ("std", [1.0] * 7 + [True], "True at index 7")):
        doc = _stats({"state": 8, "actions": 7})
        doc["norm_stats"]["state"][stat] = value
        path = _write(tmp_path, doc)
        with pytest.raises(NormStatsError) as err:
            NormStats.load(path, quantile=False)
        assert str(err.value) == f"{path}: norm_stats.state.{stat}: expected a list of numbers, got {got}"
    doc = _stats({"state": 8, "actions": 7})
    doc["norm_stats"]["actions"]["q99"] = [str(v) for v in doc["norm_stats"]["actions"]["q99"]]
    path = _write(tmp_path, doc)
    assert NormStats.load(path, quantile=False).actions.q99 is None  # z-score: q99 is never read
    with pytest.raises(NormStatsError, match=r"norm_stats\.actions\.q99: expected a list of numbers, got '"):
        NormStats.load(path, quantile=True)

    lerobot = tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"
    save_file({"observation.state.mean": np.zeros(8, np.float32), "observation.state.std": np.ones(8, bool)},
              str(lerobot))
    with pytest.raises(NormStatsError, match=r"observation\.state\.std: expected a list of numbers, got True at "
                                             r"index 0$"):
        NormStats.load(lerobot, quantile=False)


def test_lerobot_file_errors_name_lerobots_own_keys(tmp_path):
    """A LeRobot normalizer file keeps its statistics as "observation.state.q01", "action.std", ...: its errors name
    those keys, not openpi's JSON fields ("norm_stats.state.q01" is in no such file)."""
    from safetensors.numpy import save_file

    path = tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"
    flat = {"observation.state.mean": np.zeros(8, np.float32), "observation.state.std": np.ones(8, np.float32),
            "action.mean": np.zeros(7, np.float32), "action.std": np.ones(7, np.float32)}
    save_file(flat, str(path))
    with pytest.raises(NormStatsError, match=r"observation\.state\.q01: missing \(quantile"):
        NormStats.load(path, quantile=True)  # MEAN_STD statistics (no quantiles) given to a pi0.5
    save_file({**flat, "action.std": -np.ones(7, np.float32)}, str(path))
    with pytest.raises(NormStatsError, match=r"action\.std: negative values"):
        NormStats.load(path, quantile=False)
    save_file({**flat, "observation.state.mean": np.zeros(5, np.float32),
               "observation.state.std": np.ones(5, np.float32)}, str(path))
    with pytest.raises(NormStatsError, match=r"'observation\.state' has 5 dimensions, the workload's state 8"):
        NormStats.load(path, quantile=False).check_dims(8)


ARM = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos", "extra.pos",
       "Gripper.pos"]


@pytest.mark.parametrize("config, mask", [
    ({"enabled": True, "exclude_joints": ["gripper"], "action_names": ARM}, [True] * 6 + [False]),
    ({"enabled": True, "exclude_joints": ["gripper"], "action_names": None}, [True] * 7),  # no names: all
    ({"enabled": True, "exclude_joints": [], "action_names": ARM}, [True] * 7),
    ({"enabled": True, "exclude_joints": ["wrist", "pan"], "action_names": ARM[:5]},
     [False, True, True, False, False, True, True]),  # names shorter than the actions: the rest relative
    ({"enabled": False, "exclude_joints": ["gripper"], "action_names": ARM}, None),
])
def test_lerobot_relative_actions_get_the_state_back(tmp_path, config, mask):
    """LeRobot's relative_actions_processor (use_relative_actions): trained on action - raw state on the dims
    whose names hold none of exclude_joints (case-insensitive); the policy adds the raw state back after
    unnormalizing, as LeRobot's AbsoluteActionsProcessorStep does."""
    _lerobot_folder(tmp_path, steps=[{"registry_name": "relative_actions_processor", "config": config}],
                    norm_map={"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    ns = NormStats.load(tmp_path, quantile=False)
    if mask is None:
        assert ns.relative_actions is None
        return
    assert list(ns.relative_actions.mask(7)) == mask
    assert "actions relative to the state, added back" in ns.describe()
    w = get_workload("tiny")
    model = build_model("tiny")
    noise = torch.randn(1, w.horizon, model.config.action_dim, generator=torch.Generator().manual_seed(0))
    plain_ns = dataclasses.replace(ns, relative_actions=None)
    ex = make_example(w, seed=3)
    got = Policy(model, model.sample_actions, w, noise=noise, norm_stats=ns).infer(ex)["actions"]
    want = Policy(model, model.sample_actions, w, noise=noise, norm_stats=plain_ns).infer(ex)["actions"]
    state = np.asarray(ex["observation/state"], np.float64)[:7]
    np.testing.assert_allclose(got, want + np.where(mask, state, 0.0), rtol=1e-5, atol=1e-5)
    # openpi's pi0_libero adds the state back too: both would add it twice; openpi's other conventions are not a
    # LeRobot checkpoint's either (ALOHA's space would change which state is added)
    tiny50 = dataclasses.replace(w, horizon=50)
    with pytest.raises(ValueError, match="conventions 'openpi:pi0_libero' do too"):
        Policy(build_model(tiny50.model_config()), None, tiny50, norm_stats=ns, conventions="openpi:pi0_libero")
    from vlaperf.conventions import get_conventions
    from vlaperf.policy import served_conventions

    with pytest.raises(ValueError, match="conventions 'openpi:pi0_aloha_sim' are openpi's"):
        served_conventions(get_conventions("openpi:pi0_aloha_sim"), ns, tiny50)
    assert served_conventions(get_conventions("lerobot:pi0"), ns, w).delta_action_mask == tuple(mask)


def test_lerobot_relative_actions_config_is_checked(tmp_path, capsys, monkeypatch):
    """A malformed relative-actions step is refused naming its field; `serve` refuses relative actions with
    conventions that add the state back too, before the model is built."""
    from vlaperf.cli import main as run_cli

    _lerobot_folder(tmp_path, steps=[{"registry_name": "relative_actions_processor",
                                      "config": {"enabled": True, "exclude_joints": ["gripper"]}}],
                    norm_map={"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    monkeypatch.setattr("vlaperf.cli.setup", lambda args: pytest.fail("the model was built"))
    assert run_cli(["serve", "--device", "cpu", "--port", "0", "--norm-stats", str(tmp_path),
                    "--conventions", "openpi:pi0_libero"]) == 2
    err = capsys.readouterr().err
    assert "--norm-stats: " in err and "conventions 'openpi:pi0_libero' do too" in err, err
    _lerobot_folder(tmp_path, steps=[{"registry_name": "relative_actions_processor",
                                      "config": {"enabled": True, "exclude_joints": "gripper"}}],
                    norm_map={"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    with pytest.raises(NormStatsError, match="relative_actions_processor's config.exclude_joints: expected a list of "
                                             "strings, got 'gripper'"):
        NormStats.load(tmp_path, quantile=False)
    for steps, message in [
        ([{"registry_name": "relative_actions_processor", "config": {"enabled": "false"}}], "a true/false 'enabled'"),
        ([{"registry_name": "relative_actions_processor", "config": {"enabled": False}},
          {"registry_name": "relative_actions_processor", "config": {"enabled": True}}], "at most one"),
    ]:
        _lerobot_folder(tmp_path, steps=steps, norm_map={"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
        with pytest.raises(NormStatsError, match=message):
            NormStats.load(tmp_path, quantile=False)


class _StateTok:
    vocab_size = 1024

    def __init__(self):
        self.states = []

    def encode(self, text):
        return [2, 300, 108]

    def encode_with_state(self, task, state):
        self.states.append(np.array(state))
        return [2, 300, 108]


def test_pi05_prompt_state_is_normalized():
    """Pi0.5's prompt carries the NORMALIZED state (as openpi discretises it), not the raw one."""
    from vlaperf.inputs import ObservationTransform, make_example
    from vlaperf.normalize import ArrayStats, NormStats
    w = get_workload("libero-pi05")
    d = w.state_dim
    ns = NormStats(ArrayStats(np.full(d, 0.5), np.full(d, 0.25), np.full(d, -2.0), np.full(d, 3.0)), None, quantile=True)
    tok = _StateTok()
    tr = ObservationTransform(w, w.model_config(), tok, norm_stats=ns)
    ex = make_example(w, seed=0)
    tr.host_arrays(ex)
    np.testing.assert_allclose(tok.states[0][:d], ns.normalize_state64(ex["observation/state"]))


def test_pi05_prompt_state_bins_the_clients_float64_values():
    """The state is binned from the float64 values the client sent, as openpi does: a value just below a bin's edge
    that float32 rounds onto the edge stays in the lower bin (a float32 copy moved it up one)."""
    w = get_workload("libero-pi05")
    edge = np.linspace(-1.0, 1.0, 257)[130]  # 0.015625, exact in float32
    below = edge - 1e-12
    assert np.float32(below) == edge and state_prompt(np.array([below])) == "State: 129;"
    tok = _StateTok()
    tr = ObservationTransform(w, w.model_config(), tok)  # no statistics: the state is binned as sent
    ex = make_example(w, seed=0)
    ex["observation/state"] = np.full(w.state_dim, below)
    tr.host_arrays(ex)
    assert tok.states[0].dtype == np.float64 and state_prompt(tok.states[0][:1]) == "State: 129;"
    assert tr.host_arrays(ex).states[0].dtype == np.float32  # the model's own state input stays float32


def test_openpi_zscore_eps():
    """Openpi's z-score has eps = 1e-6 added to std, both ways."""
    from vlaperf.normalize import ArrayStats, NormStats
    mean, std = np.array([0.5, -1.0, 2.0]), np.array([0.25, 1.0, 3.0])
    ns = NormStats(ArrayStats(mean, std), ArrayStats(mean, std), quantile=False)
    x = np.array([1.0, 2.0, -3.0])
    np.testing.assert_allclose(ns.normalize_state64(x), (x - mean) / (std + 1e-6), rtol=1e-12)
    a = np.array([[[1.0, 2.0, -3.0]]], np.float32)
    np.testing.assert_allclose(ns.unnormalize_actions(a)[0, 0], (a[0, 0] * (std + 1e-6) + mean).astype(np.float32), rtol=0)


@pytest.mark.parametrize("convention", ["openpi", "lerobot"])
def test_quantile_span_eps(convention):
    """Quantile span: openpi adds eps everywhere; LeRobot uses q99 - q01 as it is, eps only where it is 0."""
    from vlaperf.normalize import ArrayStats, NormStats
    q01, q99 = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 4.0, 2.0])  # the last dim constant: span 0
    st = ArrayStats(np.zeros(3), np.ones(3), q01, q99)
    ns = NormStats(st, None, quantile=True, convention=convention)
    x = np.array([0.5, 1.0, 2.0])
    span = q99 - q01
    span = np.where(span == 0, 1e-8, span) if convention == "lerobot" else span + 1e-6
    np.testing.assert_allclose(ns.normalize_state64(x), (x - q01) / span * 2 - 1, rtol=1e-12)


def test_longer_state_stats_are_accepted():
    """State statistics longer than the robot's state are cut to it (openpi), not refused."""
    from vlaperf.normalize import ArrayStats, NormStats
    ns = NormStats(ArrayStats(np.zeros(10), np.ones(10)), None, quantile=False)
    ns.check_dims(8)  # must not raise
    np.testing.assert_allclose(ns.normalize_state64(np.ones(8)), np.ones(8) / (1 + 1e-6))


def test_zero_std_is_accepted(tmp_path):
    """A zero std (a constant dimension) is a valid statistic; only a negative one is refused."""
    import json
    from vlaperf.normalize import NormStats, NormStatsError
    doc = {"norm_stats": {"state": {"mean": [0.0, 1.0], "std": [0.0, 1.0]}}}
    (tmp_path / "norm_stats.json").write_text(json.dumps(doc))
    ns = NormStats.load(tmp_path / "norm_stats.json", quantile=False)
    assert ns.state.std.tolist() == [0.0, 1.0]
    doc["norm_stats"]["state"]["std"] = [-1.0, 1.0]
    (tmp_path / "norm_stats.json").write_text(json.dumps(doc))
    with pytest.raises(NormStatsError, match="negative"):
        NormStats.load(tmp_path / "norm_stats.json", quantile=False)


@pytest.mark.parametrize("convention", ["openpi", "lerobot"])
def test_unnormalize_eps_follows_each_convention(convention):
    """Unnormalizing: openpi adds eps 1e-6 to std and to the quantile span; LeRobot multiplies by std as it is and
    by the span as it is (eps only where the span is 0). A constant dimension (std 0, span 0) shows the eps."""
    from vlaperf.normalize import ArrayStats, NormStats

    mean, std = np.array([0.5, -1.0, 2.0]), np.array([0.25, 0.0, 3.0])
    q01, q99 = np.array([-1.0, 2.0, 0.0]), np.array([1.0, 2.0, 4.0])
    a = np.array([[[0.5, 1.0, -0.25]]], np.float32)
    eps = 1e-6 if convention == "openpi" else 0.0
    zscore = NormStats(None, ArrayStats(mean, std), quantile=False, convention=convention)
    np.testing.assert_array_equal(zscore.unnormalize_actions(a), (a * (std + eps) + mean).astype(np.float32))
    span = q99 - q01
    span = span + 1e-6 if convention == "openpi" else np.where(span == 0, 1e-8, span)
    quantile = NormStats(None, ArrayStats(mean, std, q01, q99), quantile=True, convention=convention)
    np.testing.assert_array_equal(quantile.unnormalize_actions(a), ((a + 1.0) / 2.0 * span + q01).astype(np.float32))


def test_empty_statistics_are_refused(tmp_path):
    """An empty list is no statistic: refused naming it (with 0 dimensions the actions would pass through
    unnormalized, with no word)."""
    doc = {"norm_stats": {"actions": {"mean": [], "std": []}}}
    with pytest.raises(NormStatsError, match=r"norm_stats.actions.mean: expected a non-empty list of finite numbers, "
                                             r"got shape \(0,\)"):
        NormStats.load(_write(tmp_path, doc), quantile=False)


def test_a_folder_of_two_normalizer_files_is_not_read_as_either(tmp_path):
    """A folder with two "*_normalizer_processor" files (two pipelines) is ambiguous: it is not read as the first
    of them; the error names the norm_stats.json it looked for instead."""
    _lerobot_folder(tmp_path)
    other = tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"
    (tmp_path / "policy_preprocessor_step_1_normalizer_processor.safetensors").write_bytes(other.read_bytes())
    with pytest.raises(NormStatsError, match="norm_stats.json: cannot read the normalization statistics"):
        NormStats.load(tmp_path, quantile=False)


def test_relative_actions_are_refused_with_any_openpi_conventions():
    """A LeRobot pipeline's relative actions with openpi's conventions, even ones with absolute actions and no
    ALOHA space (openpi:pi05_libero), are refused; so is a state shorter than the actions it is added to."""
    from vlaperf.conventions import get_conventions
    from vlaperf.normalize import ArrayStats, RelativeActions
    from vlaperf.policy import served_conventions

    ns = NormStats(ArrayStats(np.zeros(8), np.ones(8)), None, quantile=True, source="stats.safetensors",
                   relative_actions=RelativeActions())
    w = get_workload("libero-pi05")
    with pytest.raises(ValueError, match="stats.safetensors: the pipeline makes the actions relative to the state, "
                                         "and conventions 'openpi:pi05_libero' are openpi's"):
        served_conventions(get_conventions("openpi:pi05_libero"), ns, w)
    assert served_conventions(get_conventions("lerobot:pi05"), ns, w).delta_action_mask == (True,) * 7
    short = dataclasses.replace(w, state_dim=5)
    with pytest.raises(ValueError, match="stats.safetensors: relative actions need a state of at least the 7 action "
                                         "dims; the workload's state has 5"):
        served_conventions(get_conventions("lerobot:pi05"), ns, short)


def test_a_mode_the_pipeline_names_needs_its_statistics(tmp_path):
    """policy_preprocessor.json names ACTION: MEAN_STD but the normalizer file holds no action.* statistics:
    refused naming the key (the actions would otherwise leave unnormalized)."""
    from safetensors.numpy import save_file

    _lerobot_folder(tmp_path, norm_map={"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    stats = tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"
    save_file({"observation.state.mean": np.zeros(8, np.float32), "observation.state.std": np.ones(8, np.float32)},
              str(stats))
    with pytest.raises(NormStatsError, match=r"no 'action.\*' statistics, which its MEAN_STD needs"):
        NormStats.load(tmp_path, quantile=False)


def test_lerobot_quantile_span_takes_the_pipelines_eps():
    """A constant dimension's zero span is replaced by the pipeline's eps (policy_preprocessor.json), not 1e-8."""
    from vlaperf.normalize import ArrayStats

    st = ArrayStats(np.zeros(2), np.ones(2), np.array([0.0, 1.0]), np.array([2.0, 1.0]))
    ns = NormStats(st, None, quantile=True, convention="lerobot", lerobot_eps=1e-3)
    np.testing.assert_allclose(ns.normalize_state64(np.array([1.0, 1.002])), [0.0, 0.002 / 1e-3 * 2 - 1], rtol=1e-12)


def test_lerobot_pipeline_eps_and_steps_are_checked(tmp_path):
    """eps must be a number in [0, 1) (a JSON false is no 0); two normalizer steps are ambiguous; the
    statistics' file is looked up beside the pipeline by its name (LeRobot saves it so)."""
    for eps in (False, 1, -0.1):
        _lerobot_folder(tmp_path, norm_map={"STATE": "MEAN_STD"}, eps=eps)
        with pytest.raises(NormStatsError, match=rf"policy_preprocessor.json: eps: expected a number in \[0, 1\), "
                                                 rf"got {eps!r}"):
            NormStats.load(tmp_path, quantile=False)
    _lerobot_folder(tmp_path, norm_map={"STATE": "MEAN_STD"})
    doc = json.loads((tmp_path / "policy_preprocessor.json").read_text())
    step = doc["steps"][-1]
    step["state_file"] = "elsewhere/" + step["state_file"]
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(doc))
    assert NormStats.load(tmp_path, quantile=False).source.startswith(str(tmp_path / step["state_file"].split("/")[1]))
    doc["steps"].append(step)
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(doc))
    with pytest.raises(NormStatsError, match="expected one 'normalizer_processor' step with a 'state_file', found 2"):
        NormStats.load(tmp_path, quantile=False)
    del step["state_file"]  # one normalizer step that names no statistics, as a base model's pipeline may
    doc["steps"] = doc["steps"][:-1]
    doc["steps"][-1] = step
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(doc))
    with pytest.raises(NormStatsError, match="step has no 'state_file': this folder holds no statistics"):
        NormStats.load(tmp_path, quantile=False)


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path):
    """load_checkpoint_io refuses a tokenizer with more ids than the model's embedding (an id past it would fail
    later, on CUDA as a device-side assert); one of exactly the model's size is taken."""
    from types import SimpleNamespace

    from vlaperf.policy import load_checkpoint_io

    model_file = _sentencepiece_model(tmp_path)  # 120 ids
    config = lambda vocab: SimpleNamespace(backbone=SimpleNamespace(vocab_size=vocab), pi05=False)  # noqa: E731
    assert load_checkpoint_io(model_file, None, config(120))[0].vocab_size == 120
    with pytest.raises(ValueError, match=r"tok.model'?: 120 ids, more than the model's vocabulary \(119\)"):
        load_checkpoint_io(model_file, None, config(119))
