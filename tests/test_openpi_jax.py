"""openpi's JAX checkpoints (vlaperf.openpi_jax), checked against openpi's own JAX model.

The fixture (tests/data/openpi_jax/, made by benchmarks/openpi_jax_fixture.py) is openpi's JAX pi0 and
pi0.5 at a small size, and a pi0 LoRA fine-tune, every parameter random (the adapters too), saved by orbax
0.11.13 as openpi saves them (pi0 with nnx's `value` leaves, pi0.5 and the LoRA one without), with openpi's `sample_actions` on a fixed batch (a masked camera, two prompt
lengths) and fixed noise, computed in float32. vlaperf reads the folder through tensorstore alone, renames
it, and its reference model must give openpi's JAX actions.

Tolerance: float32 against float32 (JAX at "highest" matmul precision); the two differ in operation order
only: rel L2 1e-5, max abs 1e-4 (measured 5e-7, 2e-6 and, LoRA merged, 8e-7 rel L2 when the fixture was made).
"""

import builtins
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vlaperf.checkpoints import EMBED, LM_HEAD, CheckpointError, load_checkpoint, read_tensors
from vlaperf.cli import main
from vlaperf.compare.convert import convert_checkpoint
from vlaperf.inputs import Observation
from vlaperf.models.pi0 import GemmaConfig, Pi0Config, VisionConfig, build_model
from vlaperf.serve.server import checkpoint_metadata

pytest.importorskip("tensorstore")  # the dev extra installs it (pip install "vlaperf[openpi-jax]")
from vlaperf import openpi_jax  # noqa: E402

DATA = Path(__file__).parent / "data" / "openpi_jax"
KINDS = ("pi0", "pi05", "pi0_lora")


def fixture_config(kind: str) -> Pi0Config:
    c = json.loads((DATA / kind / "config.json").read_text())
    return Pi0Config(f"openpi-jax-{kind}", VisionConfig(**c["vision"]), GemmaConfig(**c["backbone"]),
                     GemmaConfig(**c["expert"]), pi05=c["pi05"], action_dim=c["action_dim"],
                     action_horizon=c["action_horizon"], max_token_len=c["max_token_len"])


def fixture_case(kind: str):
    e = np.load(DATA / kind / "expected.npz")
    images = torch.from_numpy(e["pixels"]).float().div(127.5).sub(1.0).permute(0, 1, 4, 2, 3).contiguous()
    obs = Observation(images, torch.from_numpy(e["image_mask"]), torch.from_numpy(e["tokens"]).long(),
                      torch.from_numpy(e["token_mask"]), torch.from_numpy(e["state"]))
    return obs, torch.from_numpy(e["noise"]), torch.from_numpy(e["actions"])


def actions_of(model, kind: str) -> torch.Tensor:
    obs, noise, _ = fixture_case(kind)
    steps = json.loads((DATA / kind / "config.json").read_text())["num_steps"]
    with torch.no_grad():
        return model.sample_actions(obs, noise, num_steps=steps)


@pytest.mark.parametrize("kind", KINDS)
def test_jax_checkpoint_gives_openpi_jax_actions(kind):
    model = build_model(fixture_config(kind), "cpu", torch.float32)
    report = load_checkpoint(model, DATA / kind)
    assert report["layout"] == "openpi-jax" and report["path"] == str(DATA / kind)  # the checkpoint, not params/
    assert checkpoint_metadata(model) == {"name": kind, "layout": "openpi-jax"}  # what a served model tells clients
    assert report["filled"] == [openpi_jax.EXPERT_LM_HEAD]
    assert report["lora_merged"] == (10 if kind == "pi0_lora" else 0)  # 5 adapted weights a Gemma, both Gemmas
    assert model.checkpoint["layout"] == "openpi-jax"
    _, _, expected = fixture_case(kind)
    got = actions_of(model, kind)
    rel = ((got - expected).norm() / expected.norm()).item()
    assert rel < 1e-5, rel
    assert (got - expected).abs().max().item() < 1e-4
    # the model's own random weights give other actions: the checkpoint is what matched
    fresh = actions_of(build_model(fixture_config(kind), "cpu", torch.float32), kind)
    assert ((fresh - expected).norm() / expected.norm()).item() > 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_engine_levers_on_a_jax_checkpoint_give_openpi_jax_actions(kind):
    """The engine's exact levers (no host syncs, the masked camera skipped, the prompts trimmed to the longer one,
    the static cache, SDPA, fused projections) on the loaded checkpoint: openpi's JAX actions, same tolerance."""
    from vlaperf.engine import Engine

    model = build_model(fixture_config(kind), "cpu", torch.float32)
    load_checkpoint(model, DATA / kind)
    obs, noise, expected = fixture_case(kind)
    got = Engine(model, "exact").sample_actions(obs, noise, num_steps=10)
    assert ((got - expected).norm() / expected.norm()).item() < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_params_folder_or_its_parent(kind):
    a, b = (build_model(fixture_config(kind), "cpu", torch.float32) for _ in range(2))
    load_checkpoint(a, DATA / kind)
    load_checkpoint(b, DATA / kind / "params", layout="openpi-jax")
    for (ka, ta), (kb, tb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka
    state = a.state_dict()
    assert torch.equal(state[LM_HEAD], state[EMBED])  # tied, as openpi's PyTorch model
    assert not state[openpi_jax.EXPERT_LM_HEAD].any()  # not in JAX: zeros


def test_a_training_step_folder_reads_its_params(tmp_path):
    """openpi's training checkpoints (orbax's CheckpointManager) keep the step's _CHECKPOINT_METADATA in the step
    folder, beside params/ and train_state/: that folder was taken for the params folder itself and refused as
    holding no arrays."""
    import shutil

    step = tmp_path / "29999"
    shutil.copytree(DATA / "pi0" / "params", step / "params")
    (step / "train_state").mkdir()
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    assert openpi_jax.params_folder(step) == step / "params"
    a, b = (build_model(fixture_config("pi0"), "cpu", torch.float32) for _ in range(2))
    assert load_checkpoint(a, step)["path"] == str(step)
    load_checkpoint(b, DATA / "pi0")
    for (ka, ta), (kb, tb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka


def test_read_params_names_without_root_and_value_keys():
    trained, released = openpi_jax.read_params(DATA / "pi0"), openpi_jax.read_params(DATA / "pi05")
    for params in (trained, released):
        assert not any(k.startswith("params/") or k.endswith("/value") for k in params)
        assert params["PaliGemma/llm/layers/attn/q_einsum/w"].shape == (2, 4, 64, 32)  # [L, N, D, h]
        assert params["PaliGemma/llm/layers/attn/q_einsum_1/w"].shape == (2, 4, 48, 32)
        assert params["PaliGemma/img/embedding/kernel"].dtype == torch.float32
    assert "state_proj/kernel" in trained and "time_mlp_in/kernel" in released
    assert "PaliGemma/llm/layers/pre_attention_norm_1/Dense_0/kernel" in released  # pi0.5's adaptive norms


def test_family_and_size_mismatches_are_refused():
    pi05_model = build_model(fixture_config("pi05"), "cpu", torch.float32)
    before = {k: v.clone() for k, v in pi05_model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"looks like pi0, the preset is pi0\.5"):
        load_checkpoint(pi05_model, DATA / "pi0")
    for k, v in pi05_model.state_dict().items():  # a refused file leaves the model as it was
        assert torch.equal(v, before[k]), k
    with pytest.raises(CheckpointError, match=r"(?s)preset 'tiny' \(37 wrong shape\).*layers\.0\.self_attn\.q_proj\.weight: "
                                              r"checkpoint has \[128, 48\], model expects \[64, 32\]"):
        load_checkpoint(build_model("tiny"), DATA / "pi0")


def test_renaming_errors_name_the_array():
    params = openpi_jax.read_params(DATA / "pi0")
    missing = {k: v for k, v in params.items() if k != "PaliGemma/llm/layers/mlp/linear"}
    with pytest.raises(CheckpointError, match=r"no array 'PaliGemma/llm/layers/mlp/linear'"):
        openpi_jax.to_openpi_names(missing)
    half = {**params, "PaliGemma/llm/layers/attn/q_einsum/lora_a": torch.zeros(2, 4, 64, 16)}
    with pytest.raises(CheckpointError, match=r"LoRA adapter 'PaliGemma/llm/layers/attn/q_einsum/lora_a' without "
                                              r"'PaliGemma/llm/layers/attn/q_einsum/lora_b'"):
        openpi_jax.to_openpi_names(half)
    odd = {**params, "PaliGemma/llm/layers/mlp/linear_lora_a": torch.zeros(2, 128, 4),
           "PaliGemma/llm/layers/mlp/linear_lora_b": torch.zeros(2, 5, 64)}
    with pytest.raises(CheckpointError, match=r"linear_lora_a' \[2, 128, 4\] and .*\[2, 5, 64\] do not multiply"):
        openpi_jax.to_openpi_names(odd)
    no_expert = {k: v for k, v in params.items() if "_1/" not in k}  # every expert array's name has it
    with pytest.raises(CheckpointError, match="pi0-FAST"):
        openpi_jax.to_openpi_names(no_expert)
    flat = {**params, "PaliGemma/llm/layers/attn/q_einsum/w": torch.zeros(2, 256, 32)}
    with pytest.raises(CheckpointError, match=r"q_einsum/w': 3 dims \[2, 256, 32\], expected 4"):
        openpi_jax.to_openpi_names(flat)
    named = openpi_jax.to_openpi_names(params)  # the untouched tree renames
    assert named["paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.o_proj.weight"].shape == (64, 128)


def test_not_a_jax_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not an openpi JAX checkpoint"):
        load_checkpoint(build_model("tiny"), tmp_path, layout="openpi-jax")
    with pytest.raises(CheckpointError, match="checkpoint not found"):  # auto: neither orbax nor safetensors
        load_checkpoint(build_model("tiny"), tmp_path)
    with pytest.raises(CheckpointError, match="unknown checkpoint layout 'jax'"):
        load_checkpoint(build_model("tiny"), tmp_path, layout="jax")


def test_without_tensorstore_the_error_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_tensorstore(name, *args, **kwargs):
        if name == "tensorstore":
            raise ImportError("No module named 'tensorstore'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorstore)
    with pytest.raises(CheckpointError, match=r"needs tensorstore: pip install \"vlaperf\[openpi-jax\]\""):
        openpi_jax.read_params(DATA / "pi0")


@pytest.mark.parametrize("layout", ("openpi", "lerobot"))
def test_convert_jax_checkpoint(tmp_path, layout):
    cfg = fixture_config("pi05")
    report = convert_checkpoint(DATA / "pi05", tmp_path / "out", "openpi-jax", layout, cfg)
    assert report["from"] == "openpi-jax" and report["filled"] == [openpi_jax.EXPERT_LM_HEAD]
    tensors = read_tensors(tmp_path / "out")
    assert len(tensors) == report["tensors_out"] and all(t.dtype == torch.float32 for t in tensors.values())
    direct, converted = (build_model(cfg, "cpu", torch.float32) for _ in range(2))
    load_checkpoint(direct, DATA / "pi05")
    assert load_checkpoint(converted, tmp_path / "out")["layout"] == layout
    assert torch.equal(actions_of(direct, "pi05"), actions_of(converted, "pi05"))


def test_cli_refuses_a_jax_checkpoint_of_another_model(tmp_path, capsys):
    assert main(["bench", "--workload", "tiny", "--device", "cpu", "--iters", "1", "--warmup", "0", "--no-progress",
                 "--checkpoint", str(DATA / "pi0")]) == 2
    assert "does not match model preset 'tiny'" in capsys.readouterr().err
    assert main(["convert", "--from", "openpi-jax", "--to", "openpi", "--preset", "pi0", str(tmp_path),
                 str(tmp_path / "out")]) == 2
    assert "not an openpi JAX checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("zarr3", (False, True))
def test_plain_file_store_bfloat16_and_zarr3(tmp_path, zarr3):
    """Checkpoints written without OCDBT (one folder an array) and with zarr v3 arrays, in bfloat16, as other
    orbax versions and settings write them: read to the same bits, each array by its own zarr version."""
    import tensorstore as ts

    folder = tmp_path / "params"
    folder.mkdir()
    (folder / "_CHECKPOINT_METADATA").write_text("{}")  # (no _METADATA: the driver comes from each array's own keys)
    values = torch.randn(3, 5).to(torch.bfloat16)
    bf16 = np.dtype(ts.bfloat16.numpy_dtype)
    array = values.view(torch.uint16).numpy().view(bf16)
    where = {"driver": "file", "path": str(folder / "params.state_proj.kernel.value") + "/"}
    spec = {"driver": "zarr3" if zarr3 else "zarr", "kvstore": where}
    ts.open(spec, create=True, dtype=ts.bfloat16, shape=array.shape).result().write(array).result()
    params = openpi_jax.read_params(tmp_path)  # the checkpoint folder: params/ is found
    assert list(params) == ["state_proj/kernel"]
    assert params["state_proj/kernel"].dtype == torch.bfloat16 and torch.equal(params["state_proj/kernel"], values)


def test_lora_merge_follows_openpis_modules():
    """merge_lora on hand-made adapters: attention einsums scaled by lora_scale (alpha / rank), the attention output's
    b summed over its heads (openpi's einsum leaves no head axis between a and b), the feed-forward's unscaled."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    L, N, D, H, F, R = 2, 3, 8, 4, 12, 2
    q, qa, qb = r(L, N, D, H), r(L, N, D, R), r(L, N, R, H)
    o, oa, ob = r(L, N, H, D), r(L, N, H, R), r(L, N, R, D)
    lin, la, lb = r(L, F, D), r(L, F, R), r(L, R, D)
    params = {"a/q_einsum/w": q, "a/q_einsum/lora_a": qa, "a/q_einsum/lora_b": qb,
              "a/attn_vec_einsum/w": o, "a/attn_vec_einsum/lora_a": oa, "a/attn_vec_einsum/lora_b": ob,
              "m/linear": lin, "m/linear_lora_a": la, "m/linear_lora_b": lb}
    merged = openpi_jax.merge_lora(params, lora_scale=0.5)
    assert sorted(merged) == ["a/attn_vec_einsum/w", "a/q_einsum/w", "m/linear"] and len(params) == 3
    torch.testing.assert_close(params["a/q_einsum/w"], q + 0.5 * qa @ qb)
    # x (B, T, N, H) through the LoRA path as openpi computes it: (sum over n, h of x a) then (sum over n of b)
    x = r(5, N, H)
    lora = torch.einsum("tnh,lnhr->ltr", x, oa)
    lora = torch.einsum("ltr,lnrd->ltd", lora, ob)
    torch.testing.assert_close(torch.einsum("tnh,lnhd->ltd", x, params["a/attn_vec_einsum/w"]),
                               torch.einsum("tnh,lnhd->ltd", x, o) + 0.5 * lora, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(params["m/linear"], lin + la @ lb)  # unscaled


def test_an_incomplete_copy_says_what_is_missing(tmp_path):
    """A params folder whose manifest.ocdbt was not copied said "the checkpoint holds no arrays" (they are there, in
    ocdbt.process_0/); one with none of orbax's marker files was "checkpoint not found: .../model.safetensors" with
    no word of the JAX layout. Both now say what they look like."""
    import shutil

    copy = tmp_path / "pi0"
    shutil.copytree(Path(__file__).parent / "data" / "openpi_jax" / "pi0", copy)
    (copy / "params" / "manifest.ocdbt").unlink()
    with pytest.raises(CheckpointError, match="manifest.ocdbt is missing .*the checkpoint is incomplete; copy it again"):
        load_checkpoint(build_model("tiny"), copy, layout="openpi-jax")
    for marker in ("_METADATA", "_CHECKPOINT_METADATA"):
        (copy / "params" / marker).unlink()
    with pytest.raises(CheckpointError, match="it looks like an openpi JAX checkpoint, but without orbax's"):
        load_checkpoint(build_model("tiny"), copy)


def test_a_complete_jax_checkpoint_read_as_safetensors_names_the_jax_layout(tmp_path, capsys):
    """`convert --from openpi` (or lerobot) on a complete JAX checkpoint said its params folder lacked orbax's
    marker files ("an incomplete copy?"), which it has: the layout is what is wrong, and that is now said."""
    for src in (DATA / "pi0", DATA / "pi0" / "params"):
        assert main(["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(src),
                     str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "it is an openpi JAX checkpoint: convert it with --from openpi-jax" in err, err
        assert "incomplete" not in err
    with pytest.raises(CheckpointError, match="it is an openpi JAX checkpoint: .*layout 'openpi-jax' or 'auto'"):
        load_checkpoint(build_model(fixture_config("pi0")), DATA / "pi0", layout="lerobot")


def test_renaming_refuses_what_it_cannot_place_and_leaves_the_callers_dict():
    """Each refusal names what is wrong: a stacked array with another layer count than q_einsum's, a SigLIP saved
    one block at a time (not scanned), arrays left over (the first 8 listed, then a count; the LoRA hint when one of
    them is an adapter); and the caller's tree is not emptied by the renaming."""
    params = openpi_jax.read_params(DATA / "pi0")
    n = len(params)
    openpi_jax.to_openpi_names(params)
    assert len(params) == n  # to_openpi_names pops from its own copy
    kv = "PaliGemma/llm/layers/attn/kv_einsum_1/w"
    with pytest.raises(CheckpointError, match=r"JAX array kv_einsum_1: 1 layers, q_einsum_1 has 2"):
        openpi_jax.to_openpi_names({**params, kv: params[kv][:1]})
    block = "PaliGemma/img/Transformer/encoderblock/"
    unscanned = {k.replace(block, "PaliGemma/img/Transformer/encoderblock_0/"): v for k, v in params.items()}
    with pytest.raises(CheckpointError, match="SigLIP is not stacked over layers"):
        openpi_jax.to_openpi_names(unscanned)
    extra = {f"extra/a{i}": torch.zeros(i + 1) for i in range(10)}
    with pytest.raises(CheckpointError) as e:
        openpi_jax.to_openpi_names({**params, **extra})
    listed = ", ".join(f"extra/a{i} [{i + 1}]" for i in range(8))
    assert str(e.value).endswith(f"does not have: {listed} and 2 more")
    with pytest.raises(CheckpointError) as e:
        openpi_jax.to_openpi_names({**params, **{f"extra/a{i}": torch.zeros(1) for i in range(8)}})
    assert str(e.value).endswith("extra/a7 [1]")  # exactly 8: all listed, no count
    with pytest.raises(CheckpointError, match=r"does not have \(LoRA adapters of an unknown form\): extra/a0 \[1\], "
                                              r"x/q_einsum/lora_c \[1\]"):
        openpi_jax.to_openpi_names({**params, "extra/a0": torch.zeros(1), "x/q_einsum/lora_c": torch.zeros(1)})


def test_a_params_folder_without_arrays_is_refused(tmp_path):
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "_CHECKPOINT_METADATA").write_text("{}")
    with pytest.raises(CheckpointError, match="the checkpoint holds no arrays"):
        openpi_jax.read_params(tmp_path)


def test_lora_merge_keeps_the_weights_dtype_and_the_expert_head_takes_the_embeddings():
    """A bfloat16 checkpoint stays bfloat16 once merged (the sum is taken in float32); the expert's LM head is filled
    as zeros in the embedding's dtype, and only where the checkpoint has none."""
    g = torch.Generator().manual_seed(1)
    w, a, b = (torch.randn(*s, generator=g) for s in ((6, 4), (6, 2), (2, 4)))
    params = {"m/linear": w.to(torch.bfloat16), "m/linear_lora_a": a, "m/linear_lora_b": b}
    openpi_jax.merge_lora(params)
    assert params["m/linear"].dtype == torch.bfloat16
    assert torch.equal(params["m/linear"], (w.to(torch.bfloat16).float() + a @ b).to(torch.bfloat16))
    head = openpi_jax.EXPERT_LM_HEAD
    named = {EMBED: torch.ones(5, 3, dtype=torch.bfloat16)}
    assert openpi_jax.fill_unused_heads(named, {head: torch.Size([5, 2])}) == [head]
    assert named[head].dtype == torch.bfloat16 and named[head].shape == (5, 2) and not named[head].any()
    own = {EMBED: named[EMBED], head: torch.ones(5, 2)}
    assert openpi_jax.fill_unused_heads(own, {head: torch.Size([5, 2])}) == [] and own[head].eq(1).all()
