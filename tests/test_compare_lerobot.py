"""vlaperf against LeRobot 0.6 (vlaperf.compare.lerobot, `vlaperf compare`).

LeRobot 0.6 needs Python >= 3.12; where it cannot be imported the tests that build it skip
(`needs_lerobot`), and the rest check the plumbing that does not need it. Where it imports,
the `slow` tests build LeRobot's own pi0 / pi0.5 at a reduced size on the CPU (LeRobot's config
cannot shrink the model; vlaperf.compare.lerobot.Reduced patches its size lookup for the
constructor) and require float32 agreement to 1e-4 relative L2; the `gpu` tests do the same at
full size.
"""

import dataclasses
import json
import os
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from vlaperf.checkpoints import EMBED, LM_HEAD
from vlaperf.compare import lerobot as lr
from vlaperf.cli import main
from vlaperf.inputs import Observation, random_observation
from vlaperf.models.pi0 import Pi0Model, build_model, get_config
from vlaperf.workloads import get_workload

HAVE_LEROBOT = lr.lerobot_available()
needs_lerobot = pytest.mark.skipif(not HAVE_LEROBOT, reason=lr.LEROBOT_MISSING)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cli(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ------------------------------------------------------------- without LeRobot


@pytest.mark.skipif(HAVE_LEROBOT, reason="LeRobot is importable here")
def test_compare_without_lerobot_exits_2_with_the_message(capsys):
    assert _cli(["compare", "--workload", "tiny", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlaperf compare: error: LeRobot 0.6 is not importable here (needs Python >= 3.12 and "
                          "`pip install lerobot==0.6.1`")


def test_compare_when_lerobot_import_fails_exits_2(monkeypatch, capsys):
    def unavailable(pi05):
        raise lr.LeRobotUnavailable(f"{lr.LEROBOT_MISSING}: ModuleNotFoundError: No module named 'lerobot'")

    monkeypatch.setattr(lr, "import_lerobot", unavailable)
    assert _cli(["compare", "--workload", "libero-pi05", "--device", "cpu"]) == 2
    assert lr.LEROBOT_MISSING in capsys.readouterr().err


def test_import_lerobot_wraps_any_failure(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lerobot", None)  # makes `import lerobot...` fail
    for name in [m for m in sys.modules if m.startswith("lerobot.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(lr.LeRobotUnavailable, match="LeRobot 0.6 is not importable here"):
        lr.import_lerobot(pi05=False)
    assert not lr.lerobot_available()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workload", "nope"], "invalid choice: 'nope'"),
        (["--against", "openpi"], "invalid choice: 'openpi'"),
        (["--iters", "0"], "expected an integer >= 1, got 0"),
        (["--lerobot-compile", "fast"], "invalid choice: 'fast'"),
    ],
)
def test_compare_bad_arguments_exit_2(args, message, capsys):
    assert _cli(["compare", "--device", "cpu", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("levers, message", [
    ("bogus", "--levers 'bogus': unknown lever 'bogus'"),
    ("for_loop,cuda_graph", "--levers 'for_loop,cuda_graph': cuda_graph needs a CUDA device; this run is on cpu"),
])
def test_compare_refuses_bad_levers_before_lerobot_and_the_models(monkeypatch, levers, message, capsys):
    """A typo in --levers, or a lever this device cannot run, is refused before LeRobot is imported and the two
    models are built (tens of seconds at full size); it was refused by the engine, after both."""
    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: pytest.fail("LeRobot imported before --levers was checked"))
    assert _cli(["compare", "--device", "cpu", "--levers", levers]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_compare_cuda_unavailable_is_a_clear_error(capsys):
    assert _cli(["compare", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_matching_config_full_and_reduced():
    full = lr.matching_config(get_workload("libero-pi0"))
    assert full == get_config("pi0")
    pi05 = lr.matching_config(get_workload("libero-pi05"))
    assert pi05.pi05 and pi05.action_horizon == 10 and pi05.backbone == get_config("pi05").backbone
    with pytest.raises(ValueError, match="compare it with reduced=True"):
        lr.matching_config(get_workload("libero-shallow6"))
    small = lr.matching_config(get_workload("tiny"), lr.Reduced())
    assert (small.backbone.width, small.backbone.num_heads, small.backbone.vocab_size) == (2048, 8, 257152)
    assert (small.vision.mlp_dim, small.vision.image_size, small.action_dim, small.action_horizon) == (4304, 56, 8, 10)
    assert small.expert.depth == small.backbone.depth == 2 and not small.pi05
    assert lr.matching_config(get_workload("libero-pi05"), lr.Reduced()).pi05


def test_reduced_sizes_lerobot_cannot_build_are_refused():
    cfg = lr.matching_config(get_workload("tiny"), lr.Reduced())
    bad = get_config("tiny")  # width 64, 4 heads, vocab 1024: LeRobot hard-codes 2048, 8, 257152
    with pytest.raises(ValueError, match="PaliGemma width 64 \\(LeRobot needs 2048\\); query heads 4"):
        with lr._sizes(SimpleNamespace(), bad, reduced=True):
            pass
    with lr._sizes(SimpleNamespace(), cfg, reduced=False):  # full size: nothing patched
        pass


def test_small_vision_mapping_only_touches_paligemma():
    calls = []
    base = {"paligemma": lambda **kw: calls.append(kw) or "pg", "gemma": "gemma-factory"}
    mapping = lr._SmallVision(base, {"hidden_size": 64})
    assert mapping["gemma"] == "gemma-factory"
    assert mapping["paligemma"]() == "pg" and calls == [{"vision_config": {"hidden_size": 64}}]


def test_state_names_and_inputs():
    state = {"model." + EMBED: torch.zeros(2), "model." + LM_HEAD: torch.ones(2), "model.action_in_proj.weight": torch.ones(1),
             "stray": torch.ones(1)}
    named = lr.lerobot_state_to_model_names(state)
    assert torch.equal(named[LM_HEAD], named[EMBED]) and torch.equal(named[EMBED], torch.zeros(2))  # embedding wins
    assert "action_in_proj.weight" in named and "stray" in named  # strays left for the strict load to report
    obs = random_observation(get_workload("tiny"), get_config("tiny"), seed=1)
    images, masks, tokens, token_mask, state_in = lr.lerobot_inputs(obs, pi05=False)
    assert len(images) == len(masks) == 3 and images[0].shape == (1, 3, 56, 56) and masks[2].dtype == torch.bool
    assert torch.equal(tokens, obs.tokens) and state_in.dtype == torch.float32
    assert len(lr.lerobot_inputs(obs, pi05=True)) == 4  # pi0.5: the state goes into the prompt, not the model


@pytest.mark.parametrize("workload,preset", [("libero-pi0", "pi0"), ("libero-pi05", "pi05")])
def test_matching_config_full_size_takes_the_workloads_action_shapes(workload, preset):
    full = lr.matching_config(dataclasses.replace(get_workload(workload), horizon=43, action_dim=14))
    assert full == dataclasses.replace(get_config(preset), action_horizon=43, action_dim=14)


def test_matching_config_reduced_sizes_follow_reduced_and_the_workload():
    r = lr.Reduced(depth=3, head_dim=16, backbone_mlp=96, expert_width=48, expert_mlp=80, vision_width=32, vision_depth=2,
                   vision_heads=4)
    small = lr.matching_config(get_workload("libero-pi05"), r)
    assert small.name == "lerobot-reduced-pi05" and lr.matching_config(get_workload("tiny"), r).name == "lerobot-reduced-pi0"
    b, e, v = small.backbone, small.expert, small.vision
    assert (b.width, b.depth, b.mlp_dim, b.num_heads, b.num_kv_heads, b.head_dim) == (2048, 3, 96, 8, 1, 16)
    assert (e.width, e.depth, e.mlp_dim, e.num_heads, e.num_kv_heads, e.head_dim) == (48, 3, 80, 8, 1, 16)
    assert (v.width, v.depth, v.num_heads, v.mlp_dim, v.image_size) == (32, 2, 4, 4304, 224)
    assert (small.action_horizon, small.action_dim, small.max_token_len) == (10, 32, 200)  # libero-pi05's prompt slots


def test_lerobot_dtype_names():
    assert lr._lerobot_dtype(torch.bfloat16) == "bfloat16" and lr._lerobot_dtype(torch.float32) == "float32"
    with pytest.raises(ValueError, match="bfloat16 or float32, not torch.float16"):
        lr._lerobot_dtype(torch.float16)


def _fake_lerobot_modules(monkeypatch, broken: Exception | None = None):
    """LeRobot's pi0 / pi0.5 packages as module objects in sys.modules (LeRobot itself is not installed here);
    with `broken`, reading their contents raises it, as an import under Python < 3.12 raises a SyntaxError."""
    classes = {}

    class Module(ModuleType):
        def __getattr__(self, name):
            if broken is not None and not name.startswith("__"):
                raise broken
            raise AttributeError(name)

    for kind, cls in (("pi0", "PI0"), ("pi05", "PI05")):
        conf, modeling = Module(f"lerobot.policies.{kind}.configuration_{kind}"), Module(f"lerobot.policies.{kind}.modeling_{kind}")
        if broken is None:
            conf.__dict__[f"{cls}Config"] = classes[f"{cls}Config"] = type(f"{cls}Config", (), {})
            modeling.__dict__[f"{cls}Policy"] = classes[f"{cls}Policy"] = type(f"{cls}Policy", (), {})
        package = Module(f"lerobot.policies.{kind}")
        package.__dict__.update({f"configuration_{kind}": conf, f"modeling_{kind}": modeling})
        for m in (package, conf, modeling):
            monkeypatch.setitem(sys.modules, m.__name__, m)
    for name in ("lerobot", "lerobot.policies"):
        monkeypatch.setitem(sys.modules, name, Module(name))
    return classes


@pytest.mark.skipif(HAVE_LEROBOT, reason="LeRobot is importable here")
def test_import_lerobot_picks_the_kinds_classes(monkeypatch):
    classes = _fake_lerobot_modules(monkeypatch)
    pi0, pi05 = lr.import_lerobot(pi05=False), lr.import_lerobot(pi05=True)
    assert (pi0.config_cls, pi0.policy_cls) == (classes["PI0Config"], classes["PI0Policy"])
    assert (pi05.config_cls, pi05.policy_cls) == (classes["PI05Config"], classes["PI05Policy"])
    assert pi05.modeling is sys.modules["lerobot.policies.pi05.modeling_pi05"]
    assert lr.lerobot_available()


@pytest.mark.skipif(HAVE_LEROBOT, reason="LeRobot is importable here")
def test_import_lerobot_wraps_a_syntax_error_and_names_it(monkeypatch):
    # LeRobot 0.6 under Python < 3.12 fails with a SyntaxError, not an ImportError
    _fake_lerobot_modules(monkeypatch, broken=SyntaxError("invalid syntax (modeling_pi0.py, line 12)"))
    with pytest.raises(lr.LeRobotUnavailable, match=r"is not importable here .*: SyntaxError: invalid syntax \(modeling_pi0.py"):
        lr.import_lerobot(pi05=False)
    assert not lr.lerobot_available()


def test_build_lerobot_config_and_reduced_sizes(monkeypatch):
    own = lambda variant: "LeRobot's own " + variant  # noqa: E731
    modeling = SimpleNamespace(GemmaConfig=lambda **kw: kw, get_gemma_config=own,
                               CONFIG_MAPPING={"paligemma": lambda **kw: kw, "siglip": "siglip"})

    class Policy:  # PI0Policy: records its config and what LeRobot's constructor reads from its module
        def __init__(self, config):
            self.config, self.eval_called = config, False
            self.gemma = {v: modeling.get_gemma_config(v) for v in ("gemma_2b", "gemma_300m")}
            self.paligemma = modeling.CONFIG_MAPPING["paligemma"](text_config="t")

        def eval(self):
            self.eval_called = True
            return self

    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: SimpleNamespace(config_cls=lambda **kw: kw, policy_cls=Policy,
                                                                            modeling=modeling))
    cfg = lr.matching_config(get_workload("tiny"), lr.Reduced())
    policy = lr.build_lerobot(cfg, "cpu", torch.float32, steps=3, reduced=True)
    assert policy.eval_called
    assert policy.config == {"dtype": "float32", "device": "cpu", "chunk_size": 10, "n_action_steps": 10, "max_state_dim": 8,
                             "max_action_dim": 8, "num_inference_steps": 3, "image_resolution": (56, 56),
                             "tokenizer_max_length": 16, "compile_model": False}
    assert policy.gemma == {
        "gemma_2b": {"width": 2048, "depth": 2, "mlp_dim": 256, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32},
        "gemma_300m": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32}}
    assert policy.paligemma == {"text_config": "t", "vision_config": {
        "model_type": "siglip_vision_model", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 4304, "patch_size": cfg.vision.patch_size, "image_size": 56, "layer_norm_eps": cfg.vision.eps,
        "vision_use_head": False}}
    assert modeling.get_gemma_config is own and isinstance(modeling.CONFIG_MAPPING, dict)  # patched for the constructor only
    full = lr.build_lerobot(get_config("pi0"), "cpu", torch.bfloat16, reduced=False)
    assert full.gemma == {"gemma_2b": "LeRobot's own gemma_2b", "gemma_300m": "LeRobot's own gemma_300m"}
    assert full.config["dtype"] == "bfloat16" and full.config["image_resolution"] == (224, 224)
    assert lr.build_lerobot(get_config("pi0"), "meta", torch.float32).config["device"] == "meta"


@pytest.mark.parametrize("field,changes,named", [
    ("vision", {"mlp_dim": 4300}, "SigLIP MLP width 4300 (LeRobot needs 4304)"),
    ("backbone", {"vocab_size": 1024}, "vocabulary 1024 (LeRobot needs 257152)"),
])
def test_each_size_lerobot_hard_codes_is_checked(field, changes, named):
    cfg = lr.matching_config(get_workload("tiny"), lr.Reduced())
    bad = dataclasses.replace(cfg, **{field: dataclasses.replace(getattr(cfg, field), **changes)})
    with pytest.raises(ValueError) as e:
        with lr._sizes(SimpleNamespace(), bad, reduced=True):
            pass
    assert str(e.value) == "LeRobot cannot build this reduced size: " + named


# ---------------------------------------------------- with a stand-in for LeRobot


class _StandInCore(Pi0Model):
    """LeRobot's core model (`policy.model`, openpi's PI0Pytorch port): its module names are vlaperf's (openpi's),
    one to one, and its `sample_actions` takes LeRobot's positional inputs. `offset` is added to its actions."""

    def __init__(self, cfg, offset=0.0):
        super().__init__(cfg)
        self.offset, self.calls = offset, []

    def sample_actions(self, images, img_masks, lang_tokens, lang_masks, state=None, *, noise, num_steps):
        assert (state is None) == self.config.pi05  # pi0.5: the state is in the prompt
        assert all(img.dtype == torch.float32 for img in images) and len(images) == len(img_masks) == 3
        self.calls.append({"num_steps": num_steps, "precision": torch.get_float32_matmul_precision()})
        B = lang_tokens.shape[0]
        obs = Observation(images=torch.stack(images, 1), image_mask=torch.stack(img_masks, 1), tokens=lang_tokens,
                          token_mask=lang_masks, state=torch.zeros(B, self.config.action_dim) if state is None else state)
        return Pi0Model.sample_actions(self, obs, noise, num_steps) + self.offset


class _StandInPolicy(torch.nn.Module):
    """LeRobot's PI0Policy at vlaperf's tiny size: `model` holds the core; the LM head is a separate parameter (LeRobot's
    transformers-5 model unties it from the embedding)."""

    def __init__(self, cfg, offset=0.0):
        super().__init__()
        self.model = _StandInCore(cfg, offset)
        pg = self.model.paligemma_with_expert.paligemma
        pg.lm_head.weight = torch.nn.Parameter(pg.model.language_model.embed_tokens.weight.detach().clone())


@pytest.fixture
def stand_in(monkeypatch):
    """LeRobot replaced by _StandInPolicy at the tiny size (the reduced LeRobot model holds a 257152 x 2048 embedding):
    returns the list of builds, each with the arguments compare_lerobot gave."""
    builds = _Builds()

    def build(cfg, device, dtype, steps=10, reduced=False):
        policy = _StandInPolicy(cfg, offset=builds.offset).to(device)
        builds.append(SimpleNamespace(cfg=cfg, device=device, dtype=dtype, steps=steps, reduced=reduced, policy=policy))
        return policy

    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: SimpleNamespace())
    monkeypatch.setattr(lr, "matching_config", lambda wl, reduced=None: get_config("tiny", pi05=wl.preset == "pi05"))
    monkeypatch.setattr(lr, "build_lerobot", build)
    # the stand-in has no version, also where the real LeRobot is installed (the GPU machine: its 0.6.1 was read)
    monkeypatch.setattr(lr, "lerobot_version", lambda: None)
    return builds


class _Builds(list):
    offset = 0.0  # added to the stand-in's actions


def test_randomize_lerobot_gives_vlaperfs_weights_and_keeps_the_head_untied():
    policy = _StandInPolicy(get_config("tiny"))
    lr.randomize_lerobot_(policy, seed=3)
    pg = policy.model.paligemma_with_expert.paligemma
    assert pg.lm_head.weight is not pg.model.language_model.embed_tokens.weight
    assert pg.lm_head.weight.data_ptr() != pg.model.language_model.embed_tokens.weight.data_ptr()
    ours, theirs = build_model("tiny", seed=3).state_dict(), policy.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_compare_lerobot_against_the_stand_in(stand_in, monkeypatch):
    run = lr.compare_lerobot("tiny", device="cpu", steps=2, reduced=True, seed=4)
    (build,) = stand_in
    assert build.reduced and build.steps == 2 and build.dtype == torch.float32  # the CPU's default
    assert run.result["passed"] and run.result["reduced"] and run.reduced and run.steps == 2
    ref = run.result["equivalence"]["reference"]
    assert ref["max_abs"] == 0.0 and run.result["equivalence"]["best"]["rel_l2"] < 1e-4
    assert build.policy.model.calls == [{"num_steps": 2, "precision": torch.get_float32_matmul_precision()}]
    assert run.levers == "best" and run.result["levers"] == {"spec": "best", "label": run.engine.name}
    assert run.result["levers"]["label"].startswith("for_loop+")
    assert (run.result["model"], run.result["dtype"], run.result["device"], run.result["seed"]) == ("tiny", "float32", "cpu", 4)
    assert set(run.result["actions"]) == {"lerobot", "vlaperf_reference", "vlaperf_best"}
    ours, built = run.model.state_dict(), build_model("tiny", seed=4).state_dict()  # LeRobot's weights: vlaperf's init
    assert ours.keys() == built.keys() and all(torch.equal(v, built[k]) for k, v in ours.items())

    custom, seen = lr.Reduced(depth=1), []
    monkeypatch.setattr(lr, "matching_config", lambda wl, reduced=None: seen.append(reduced) or get_config("tiny"))
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=custom, levers="reference")
    assert seen == [custom] and run.levers is None and run.engine is None and set(run.result["equivalence"]) == {"reference"}


def test_compare_lerobot_fails_where_lerobot_differs(stand_in, monkeypatch):
    stand_in.offset = 0.5
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers=None)
    assert not run.result["passed"] and not run.result["equivalence"]["reference"]["passed"]
    assert torch.equal(run.result["actions"]["lerobot"], run.result["actions"]["vlaperf_reference"] + 0.5)

    # the reference agrees, the engine variant does not: the comparison fails
    stand_in.offset = 0.0
    engine = SimpleNamespace(name="off_by_one", sample_actions=lambda obs, noise, steps: torch.ones(1, 10, 8))
    monkeypatch.setattr(lr, "comparison_engine", lambda model, levers: engine)
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers="off")
    eq = run.result["equivalence"]
    assert eq["reference"]["passed"] and not eq["off"]["passed"] and not run.result["passed"]
    assert run.result["levers"] == {"spec": "off", "label": "off_by_one"} and run.engine is engine


def test_compare_lerobot_on_a_checkpoint_loads_the_file_into_both_sides(stand_in, tmp_path):
    """compare_lerobot(checkpoint=...): both models hold the file's weights (not seed's random init), each in its own
    dtypes: LeRobot's float32 parameters keep the file's float32 values where vlaperf's bfloat16 ones round them."""
    from vlaperf.checkpoints import save_checkpoint

    source = build_model("tiny", seed=9)
    path = save_checkpoint(source, tmp_path / "ckpt", layout="lerobot")
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, seed=4, levers=None, checkpoint=tmp_path / "ckpt")
    assert run.result["passed"] and run.result["equivalence"]["reference"]["max_abs"] == 0.0
    assert run.result["weights"] == {"source": "checkpoint", "path": str(path), "layout": "lerobot",
                                     "tensors": len(source.state_dict()) - 1, "file_dtypes": ["torch.float32"]}
    assert run.model.checkpoint == {"path": str(path), "layout": "lerobot"}
    file_state = source.state_dict()
    theirs = stand_in[0].policy.model.state_dict()
    assert all(torch.equal(v, file_state[k]) for k, v in run.model.state_dict().items())
    assert all(torch.equal(v, file_state[EMBED if k == LM_HEAD else k]) for k, v in theirs.items())
    assert not torch.equal(file_state[EMBED], build_model("tiny", seed=4).state_dict()[EMBED])  # seed 4 seeded inputs only

    run = lr.compare_lerobot("tiny", device="cpu", dtype=torch.bfloat16, steps=1, reduced=True, levers=None,
                             checkpoint=path)
    q = "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"
    assert run.model.state_dict()[q].dtype == torch.bfloat16
    assert torch.equal(stand_in[1].policy.model.state_dict()[q], file_state[q])  # float32, not through bfloat16
    assert not torch.equal(run.model.state_dict()[q].float(), file_state[q])
    assert lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, seed=4, levers=None).result["weights"] == \
        {"source": "random", "seed": 4}


def test_compare_lerobot_refuses_a_checkpoint_of_another_model(stand_in, tmp_path):
    from vlaperf.checkpoints import CheckpointError, save_checkpoint

    save_checkpoint(build_model(get_config("tiny", pi05=True)), tmp_path / "pi05.safetensors")
    with pytest.raises(CheckpointError, match=r"the file looks like pi0.5, the preset is pi0"):
        lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers=None, checkpoint=tmp_path / "pi05.safetensors")


def test_load_into_lerobot_is_strict_both_ways():
    from vlaperf.checkpoints import CheckpointError

    policy = _StandInPolicy(get_config("tiny"))
    named = dict(build_model("tiny", seed=2).state_dict())
    with pytest.raises(CheckpointError, match=r"LeRobot's \['model.action_out_proj.bias'\] have no tensor in it"):
        lr.load_into_lerobot_(policy, {k: v for k, v in named.items() if k != "action_out_proj.bias"})
    with pytest.raises(CheckpointError, match=r"its \['extra.weight'\] no place in LeRobot's model"):
        lr.load_into_lerobot_(policy, {**named, "extra.weight": torch.ones(1)})
    with pytest.raises(CheckpointError, match=r"model.action_out_proj.bias: the checkpoint's action_out_proj.bias has shape \(3,\)"):
        lr.load_into_lerobot_(policy, {**named, "action_out_proj.bias": torch.ones(3)})
    named[EMBED] = named[EMBED] + 1.0  # the embedding wins over the file's LM head, as in LeRobot's loader
    lr.load_into_lerobot_(policy, named)
    pg = policy.model.paligemma_with_expert.paligemma
    assert torch.equal(pg.lm_head.weight, named[EMBED]) and torch.equal(pg.model.language_model.embed_tokens.weight, named[EMBED])


def test_time_lerobot_against_the_stand_in(stand_in, monkeypatch):
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers="for_loop")
    before = torch.get_float32_matmul_precision()
    modes = []
    # "compiled" = LeRobot's own call, 0.25 off: its actions are checked against LeRobot eager's
    monkeypatch.setattr(torch, "compile", lambda fn, mode: modes.append(mode) or (lambda *a, **kw: fn(*a, **kw) + 0.25))
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile="reduce-overhead", progress=False)
    assert torch.get_float32_matmul_precision() == before and modes == ["reduce-overhead"]
    calls = run.policy.model.calls
    assert calls[1]["precision"] == "high" and calls[-1]["precision"] == "high"
    # comparison, compile, eager (first call + 2 rounds), "compiled" (first call + 2 rounds, each timed call after an
    # untimed one of its own: it is not an eager row)
    assert len(calls) == 1 + 1 + (1 + 2) + (1 + 2 * 2)
    assert timing["settled"] == ["lerobot_compiled", "vlaperf_for_loop"]
    lc = timing["lerobot_compile"]
    assert lc["mode"] == "reduce-overhead" and lc["vs_eager"]["max_abs"] == pytest.approx(0.25) and lc["compile_s"] > 0
    assert set(timing["summary"]) == {"lerobot", "lerobot_compiled", "vlaperf_reference", "vlaperf_for_loop"}
    inter = timing["interleaved"]
    assert inter["baseline"] == "lerobot" and inter["iters"] == 2 and inter["warmup"] == 1
    for name, s in timing["summary"].items():
        assert s["speedup_vs_lerobot_wall"] == inter["ratios"][name]["wall_ms"]["speedup"]
        assert s["significant"] == inter["ratios"][name]["wall_ms"]["significant"]
        assert s["first_call_s"] > 0
        assert s["cuda_event_ms_median"] is None and s["speedup_vs_lerobot_event"] is None  # CPU: no events
    assert timing["summary"]["lerobot"]["speedup_vs_lerobot_wall"] == 1.0 and not timing["summary"]["lerobot"]["significant"]


def test_time_lerobot_first_calls_are_the_processes_first_not_the_warm_up(stand_in, monkeypatch):
    """The comparison makes each path's first call (the engine's compile and capture); the timing's warm-up then
    starts warm. The summary's first_call_s must be that first call, and LeRobot compiled's its compile."""
    import time

    # a second: a warm call of the stand-ins stays far below it on a loaded 2-core machine (0.3 s did not, once)
    SLOW_S = 1.0
    calls = []

    def slow_first_engine(model, levers):  # an engine whose first call compiles: 1 s, then fast
        def sample_actions(obs, noise, steps):
            calls.append(steps)
            if len(calls) == 1:
                time.sleep(SLOW_S)
            return model.sample_actions(obs, noise, steps)
        return SimpleNamespace(name="slow_first", sample_actions=sample_actions)

    monkeypatch.setattr(lr, "comparison_engine", slow_first_engine)
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers="slow")
    assert set(run.result["first_call_s"]) == {"lerobot", "vlaperf_reference", "vlaperf_slow"}
    assert run.result["first_call_s"]["vlaperf_slow"] >= SLOW_S

    def compile_(fn, mode):  # LeRobot's compile: 1 s in its first call
        def compiled(*a, **kw):
            if not compiled.done:
                time.sleep(SLOW_S)
                compiled.done = True
            return fn(*a, **kw)
        compiled.done = False
        return compiled

    monkeypatch.setattr(torch, "compile", compile_)
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile="default", progress=False)
    summary, warm_up = timing["summary"], timing["interleaved"]["variants"]
    assert summary["vlaperf_slow"]["first_call_s"] == run.result["first_call_s"]["vlaperf_slow"] >= SLOW_S
    assert warm_up["vlaperf_slow"]["first_call_s"] < SLOW_S  # the warm-up's first call was a warm one
    assert summary["lerobot_compiled"]["first_call_s"] == timing["lerobot_compile"]["compile_s"] >= SLOW_S
    assert summary["lerobot"]["first_call_s"] == run.result["first_call_s"]["lerobot"]


def test_time_lerobot_reports_a_failed_compile_and_leaves_it_out(stand_in, monkeypatch):
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers=None)
    modeling = run.policy.model

    def broken(*args, **kwargs):
        raise RuntimeError("inductor: no C++ compiler")

    monkeypatch.setattr(torch, "compile", lambda fn, mode: broken)
    torch.set_float32_matmul_precision("highest")
    timing = lr.time_lerobot(run, warmup=1, iters=2, progress=False)
    assert torch.get_float32_matmul_precision() == "highest"
    assert timing["lerobot_compile"] == {"mode": "max-autotune", "compile_error": "RuntimeError: inductor: no C++ compiler"}
    assert set(timing["summary"]) == {"lerobot", "vlaperf_reference"} and len(modeling.calls) == 1 + (1 + 2)
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile=None, progress=False)
    assert timing["lerobot_compile"] == {"mode": None}


def test_cli_compare_against_the_stand_in_writes_result(stand_in, tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["compare", "--device", "cpu", "--warmup", "1", "--iters", "2", "--steps", "1", "--lerobot-compile", "none",
            "--json", str(out), "--no-progress"]
    assert _cli(argv) == 0  # no --workload on the CPU: tiny, which LeRobot builds reduced
    (build,) = stand_in
    assert build.reduced and build.steps == 1
    r = json.loads(out.read_text())
    assert r["command"] == "compare" and r["workload"] == {"id": "tiny", "overrides": {"steps": 1}}
    assert r["compare"]["passed"] and r["compare"]["reduced"] and "actions" not in r["compare"]
    assert r["variant"]["label"] == r["compare"]["levers"]["label"] and r["variant"]["levers"][0] == "for_loop"
    assert set(r["timing"]["summary"]) == {"lerobot", "vlaperf_reference", "vlaperf_best"}
    assert r["timing"]["lerobot_compile"] == {"mode": None} and r["timing"]["interleaved"]["iters"] == 2
    stdout = capsys.readouterr().out
    assert "speedup" in stdout and f"wrote {out}" in stdout and "(version unknown)" in stdout

    assert _cli(argv + ["--no-timing"]) == 0
    assert json.loads(out.read_text())["timing"] is None


def test_cli_compare_on_a_checkpoint_records_it(stand_in, tmp_path, capsys):
    from vlaperf.checkpoints import save_checkpoint

    path = save_checkpoint(build_model("tiny", seed=9), tmp_path / "model.safetensors")
    out = tmp_path / "c.json"
    assert _cli(["compare", "--device", "cpu", "--steps", "1", "--no-timing", "--checkpoint", str(tmp_path),
                 "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["variant"]["checkpoint"] == {"path": str(path), "layout": "openpi"}
    assert r["compare"]["weights"]["source"] == "checkpoint" and r["compare"]["passed"]

    save_checkpoint(build_model(get_config("tiny", pi05=True)), tmp_path / "pi05.safetensors")
    assert _cli(["compare", "--device", "cpu", "--steps", "1", "--no-timing", "--checkpoint",
                 str(tmp_path / "pi05.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "vlaperf compare: error: --checkpoint: checkpoint does not match model preset 'tiny' (the file looks like pi0.5" in err
    assert "(tiny is compared at a reduced size, which no released checkpoint has" in err


@pytest.mark.parametrize("make,message", [
    (lambda d: d / "absent.safetensors", "--checkpoint: "),
    (lambda d: (d / "bad.safetensors").write_bytes(b"not safetensors") and d / "bad.safetensors",
     "not a readable safetensors file"),
    (lambda d: "", "--checkpoint: expected a path, got an empty string"),
])
def test_cli_compare_names_a_bad_checkpoint_before_lerobot(monkeypatch, tmp_path, capsys, make, message):
    def not_reached(pi05):
        raise AssertionError("LeRobot imported before the checkpoint was checked")

    monkeypatch.setattr(lr, "import_lerobot", not_reached)
    assert _cli(["compare", "--device", "cpu", "--checkpoint", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_compare_not_equivalent_exits_1_without_timing(stand_in, capsys):
    stand_in.offset = 1.0
    assert _cli(["compare", "--workload", "tiny", "--device", "cpu", "--steps", "1", "--levers", "reference", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "latency" not in out and "vlaperf (reference) is not equivalent to LeRobot: rel_l2 " in err
    assert err.rstrip().endswith("> 0.0001; timing not reported")


@pytest.mark.parametrize("args,pi05,reduced,note", [
    ([], False, True, False),  # CPU default: tiny, a size LeRobot builds only reduced
    (["--workload", "libero-pi05"], True, False, True),
    (["--workload", "libero-pi0", "--reduced"], False, True, False),
    (["--workload", "libero-shallow6"], False, True, False),
])
def test_cli_compare_asks_lerobot_for_the_workloads_kind_and_size(monkeypatch, capsys, args, pi05, reduced, note):
    seen = {}

    def compare(workload, **kw):
        seen.update(kw, workload=workload)
        raise ValueError("LeRobot cannot build this reduced size: stop here")

    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: seen.setdefault("pi05", pi05))
    monkeypatch.setattr(lr, "compare_lerobot", compare)
    assert _cli(["compare", "--device", "cpu", "--levers", "for_loop", "--seed", "5", *args]) == 2
    err = capsys.readouterr().err
    assert "vlaperf compare: error: LeRobot cannot build this reduced size: stop here" in err
    assert (seen["pi05"], seen["reduced"], seen["levers"], seen["seed"], seen["dtype"]) == (pi05, reduced, "for_loop", 5, torch.float32)
    assert ("at full size on the CPU" in err) == note


def test_cli_compare_keeps_its_compiles_in_the_compile_cache(monkeypatch, tmp_path, capsys):
    """--compile-cache DIR, as bench's: applied before anything is built, so LeRobot's max-autotune compile and
    best's land in DIR; a path that is a file is refused naming the option."""
    from vlaperf.engine.compile import CACHE_ENV

    for var in CACHE_ENV.values():  # restored after the test
        monkeypatch.setenv(var, "unset-by-test")
    seen = {}

    def compare(workload, **kw):
        seen.update({sub: os.environ.get(var) for sub, var in CACHE_ENV.items()})
        raise ValueError("stop here")

    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: None)
    monkeypatch.setattr(lr, "compare_lerobot", compare)
    cache = tmp_path / "cache"
    assert _cli(["compare", "--device", "cpu", "--compile-cache", str(cache)]) == 2
    assert seen == {"triton": str(cache / "triton"), "inductor": str(cache / "inductor")}
    (tmp_path / "file").write_text("x")
    assert _cli(["compare", "--device", "cpu", "--compile-cache", str(tmp_path / "file")]) == 2
    assert "is a file; expected a directory" in capsys.readouterr().err


def _metrics(rel, passed, worst=1):
    return {"max_abs": 2 * rel, "rel_l2": rel, "tolerance": 1e-4, "passed": passed, "worst_dim": worst,
            "per_dim": {"max_abs": [0.0, 0.25], "rel_l2": [0.0, 0.75]}}


def _table_rows(text, first):
    """The cells of the rich table rows whose first cell is `first`."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if "│" in line]
    return [r for r in rows if r and r[0] == first]


def test_cli_compare_names_the_worst_variant_nan_included(monkeypatch, capsys):
    result = {"passed": False, "model": "tiny", "dtype": "float32", "device": "cpu", "steps": 4, "lerobot_version": "0.6.1",
              "equivalence": {"reference": _metrics(0.5, False), "best": _metrics(float("nan"), False, worst=None),
                              "for_loop": _metrics(0.25, False)},
              "as_shipped": ["LeRobot forces eager attention"], "actions": {}}
    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: None)
    monkeypatch.setattr(lr, "compare_lerobot", lambda *a, **kw: SimpleNamespace(result=result))
    monkeypatch.setattr(lr, "time_lerobot", lambda *a, **kw: pytest.fail("timed although not equivalent"))
    assert _cli(["compare", "--workload", "tiny", "--device", "cpu"]) == 1
    out, err = capsys.readouterr()
    assert "vlaperf (best) is not equivalent to LeRobot: rel_l2 nan > 0.0001; timing not reported" in err
    assert _table_rows(out, "reference") == [["reference", "1", "0.5", "1 (0.75)", "1e-04", "NO"]]
    assert _table_rows(out, "best")[0][3] == "-" and "vs LeRobot 0.6.1" in out and "as shipped: LeRobot forces eager" in out


def test_print_compare_marks_noise_and_missing_figures(capsys):
    from vlaperf.compare.commands import print_compare

    compared = {"model": "pi0", "dtype": "bfloat16", "device": "cuda", "steps": 10, "lerobot_version": None,
                "equivalence": {"reference": _metrics(5e-5, True)}, "as_shipped": ["a", "b"]}

    def s(ms, speedup, significant, event=None):
        return {"wall_ms_median": ms, "cuda_event_ms_median": event, "speedup_vs_lerobot_wall": speedup,
                "speedup_vs_lerobot_event": None if event is None else speedup, "significant": significant,
                "first_call_s": 1.5}

    timing = {"summary": {"lerobot": s(200.0, 1.0, False, event=199.0), "vlaperf_reference": s(198.0, 1.01, False),
                          "vlaperf_best": s(20.0, 10.0, True, event=19.5)},
              "lerobot_compile": {"mode": "max-autotune", "compile_error": "RuntimeError: boom"}}
    print_compare(compared, timing, "libero-pi0")
    out = capsys.readouterr().out
    assert "(version unknown)" in out and _table_rows(out, "reference")[0][-1] == "yes" and "as shipped: a; b" in out
    assert _table_rows(out, "lerobot") == [["lerobot", "200.00", "199.00", "1.00x", "1.00x", "1.50"]]
    assert _table_rows(out, "vlaperf_reference") == [["vlaperf_reference", "198.00", "-", "1.01x (n.s.)", "-", "1.50"]]
    assert _table_rows(out, "vlaperf_best")[0][3] == "10.00x"
    assert "LeRobot compiled (max-autotune) left out: RuntimeError: boom" in out
    # a compiled row whose actions failed their check against eager is said to time another computation
    timing["lerobot_compile"] = {"mode": "default", "compile_s": 30.0, "vs_eager": _metrics(0.2, False)}
    print_compare(compared, timing, "libero-pi0")
    out = " ".join(capsys.readouterr().out.split())
    assert "LeRobot compiled (default) is NOT equivalent to LeRobot eager: rel L2 2.00e-01 > 1e-04" in out
    timing["lerobot_compile"]["vs_eager"] = _metrics(5e-5, True)
    print_compare(compared, timing, "libero-pi0")
    assert "LeRobot compiled" not in capsys.readouterr().out


# ------------------------------------------------------------ with LeRobot (CPU)


def _check(run, tol=1e-4):
    for name, m in run.result["equivalence"].items():
        assert m["rel_l2"] < tol, (name, m["rel_l2"], m["max_abs"])
        assert max(m["per_dim"]["rel_l2"]) < 10 * tol, (name, m["per_dim"]["rel_l2"])


@needs_lerobot
@pytest.mark.slow
@pytest.mark.parametrize("workload", ["tiny", "libero-pi05"])
def test_reduced_lerobot_equals_vlaperf_fp32(workload):
    run = lr.compare_lerobot(workload, device="cpu", dtype=torch.float32, reduced=True, seed=3)
    assert run.result["reduced"] and run.result["passed"]
    _check(run)
    # LeRobot's layout as shipped: LM head and embedding are two tensors (equal values here)
    pg = run.policy.model.paligemma_with_expert.paligemma
    assert pg.lm_head.weight is not pg.model.language_model.embed_tokens.weight
    assert torch.equal(pg.lm_head.weight, pg.model.language_model.embed_tokens.weight)


@needs_lerobot
@pytest.mark.slow
def test_reduced_lerobot_bf16_as_shipped_within_bf16_tolerance():
    run = lr.compare_lerobot("tiny", device="cpu", dtype=torch.bfloat16, reduced=True)
    assert run.result["passed"] and run.result["equivalence"]["reference"]["tolerance"] == 3e-2
    params = dict(run.policy.model.named_parameters())
    assert params["paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"].dtype == torch.float32
    assert run.model.vision.encoder.layers[0].mlp.fc1.weight.dtype == torch.bfloat16  # openpi's layout


@needs_lerobot
@pytest.mark.slow
def test_lerobot_saved_file_converts_to_its_runtime_weights(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_model

    from vlaperf.checkpoints import load_checkpoint
    from vlaperf.compare.convert import convert_checkpoint
    from vlaperf.models.pi0 import Pi0Model

    cfg = lr.matching_config(get_workload("tiny"), lr.Reduced())
    policy = lr.build_lerobot(cfg, "cpu", torch.float32, reduced=True)  # transformers' init: LM head != embedding
    save_model(policy, str(tmp_path / "model.safetensors"))  # what LeRobot's save_pretrained writes
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"model." + EMBED, "model." + LM_HEAD} <= keys  # LeRobot 0.6.1 stores both
    report = convert_checkpoint(tmp_path, tmp_path / "openpi", "lerobot", "openpi", cfg)
    assert report["lm_head_differed"] and report["embedding_from"] == "model." + EMBED
    ours = Pi0Model(cfg)
    load_checkpoint(ours, tmp_path / "openpi")
    runtime = lr.vlaperf_from_lerobot(policy, cfg, torch.float32)
    a, b = runtime.state_dict(), ours.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_lerobot
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compare_on_a_lerobot_saved_checkpoint(tmp_path, dtype):
    """compare_lerobot(checkpoint=...) with LeRobot's own model and a file LeRobot wrote (transformers' init: its LM
    head differs from the embedding): LeRobot's parameters hold the file's values in LeRobot's own dtypes (float32
    SigLIP under bfloat16), its LM head the embedding, and vlaperf agrees within the dtype's tolerance."""
    from safetensors.torch import load_file, save_model

    cfg = lr.matching_config(get_workload("tiny"), lr.Reduced())
    save_model(lr.build_lerobot(cfg, "cpu", torch.float32, reduced=True), str(tmp_path / "model.safetensors"))
    run = lr.compare_lerobot("tiny", device="cpu", dtype=dtype, reduced=True, levers=None, checkpoint=tmp_path)
    assert run.result["passed"], run.result["equivalence"]
    assert run.result["weights"]["source"] == "checkpoint" and run.result["weights"]["layout"] == "lerobot"
    saved = load_file(str(tmp_path / "model.safetensors"))
    for key, value in run.policy.state_dict().items():
        want = saved["model." + EMBED] if key == "model." + LM_HEAD else saved[key]
        assert torch.equal(value, want.to(value.dtype)), key
    fc1 = "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    assert run.policy.state_dict()[fc1].dtype == torch.float32  # LeRobot's layout as shipped, also under bfloat16


@needs_lerobot
@pytest.mark.slow
def test_cli_compare_tiny_writes_result(tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["compare", "--workload", "tiny", "--device", "cpu", "--warmup", "1", "--iters", "2",
            "--lerobot-compile", "none", "--json", str(out), "--no-progress"]
    assert _cli(argv) == 0
    r = json.loads(out.read_text())
    assert r["command"] == "compare" and r["compare"]["passed"] and r["compare"]["reduced"]
    assert set(r["timing"]["summary"]) == {"lerobot", "vlaperf_reference", "vlaperf_best"}
    assert "speedup" in capsys.readouterr().out


# ------------------------------------------------------------ with LeRobot (GPU)


@needs_lerobot
@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["libero-pi0", "libero-pi05"])
def test_full_size_lerobot_equals_vlaperf_fp32(workload):
    run = lr.compare_lerobot(workload, device="cuda", dtype=torch.float32)
    assert not run.result["reduced"]
    _check(run)


@needs_lerobot
@needs_cuda
@pytest.mark.gpu
def test_full_size_lerobot_bf16_as_shipped():
    run = lr.compare_lerobot("libero-pi0", device="cuda", dtype=torch.bfloat16)
    assert run.result["passed"], run.result["equivalence"]
