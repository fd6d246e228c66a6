"""vlaperf against LeRobot 0.6 (vlaperf.compare.lerobot, `vlaperf compare`).

LeRobot 0.6 needs Python >= 3.12; where it cannot be imported the tests that build it skip
(`needs_lerobot`), and the rest check the plumbing that does not need it. Where it imports,
the `slow` tests build LeRobot's own pi0 / pi0.5 at a reduced size on the CPU (LeRobot's config
cannot shrink the model; vlaperf.compare.lerobot.Reduced patches its size lookup for the
constructor) and require float32 agreement to 1e-4 relative L2; the `gpu` tests do the same at
full size.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from vlaperf.checkpoints import EMBED, LM_HEAD
from vlaperf.compare import lerobot as lr
from vlaperf.cli import main
from vlaperf.inputs import random_observation
from vlaperf.models.pi0 import get_config
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
