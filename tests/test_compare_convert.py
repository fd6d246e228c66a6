"""Checkpoint conversion between openpi's and LeRobot's layouts (vlaperf.compare.convert)."""

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vlaperf.checkpoints import EMBED, LM_HEAD, CheckpointError, load_checkpoint, read_tensors, save_checkpoint
from vlaperf.cli import main
from vlaperf.compare.convert import convert_checkpoint, convert_tensors, expected_shapes, from_model_names
from vlaperf.models.pi0 import build_model, get_config

TINY_PI05 = get_config("tiny", pi05=True)
CONFIGS = {"pi0": get_config("tiny"), "pi05": TINY_PI05}


def _same_files(a, b):
    ta, tb = read_tensors(a), read_tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k


def _same_models(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _keys(path):
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_openpi_lerobot_openpi_round_trip_is_bit_exact(tmp_path, kind, dtype):
    cfg = CONFIGS[kind]
    src = save_checkpoint(build_model(cfg, dtype=dtype, seed=1), tmp_path / "openpi")
    r1 = convert_checkpoint(src, tmp_path / "lerobot", "openpi", "lerobot", cfg)
    r2 = convert_checkpoint(tmp_path / "lerobot", tmp_path / "back", "lerobot", "openpi", cfg)
    _same_files(src, r2["dst"])
    assert r1["tensors_in"] == r1["tensors_out"] == r2["tensors_out"] == len(read_tensors(src))
    assert r1["renamed"] == [] and r1["lm_head_differed"] is None
    # dtypes as stored: bf16 models hold float32 norms and heads, and the file keeps them
    assert set(r1["dtypes"]) == ({"float32"} if dtype == torch.float32 else {"bfloat16", "float32"})


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_converted_files_load_strictly_into_vlaperf(tmp_path, kind):
    cfg = CONFIGS[kind]
    src_model = build_model(cfg, seed=1)
    src = save_checkpoint(src_model, tmp_path / "openpi")
    convert_checkpoint(src, tmp_path / "lr.safetensors", "openpi", "lerobot", cfg)
    dst = build_model(cfg, seed=2)
    assert load_checkpoint(dst, tmp_path / "lr.safetensors")["layout"] == "lerobot"
    _same_models(src_model, dst)
    convert_checkpoint(tmp_path / "lr.safetensors", tmp_path / "op", "lerobot", "openpi", cfg)
    dst = build_model(cfg, seed=3)
    assert load_checkpoint(dst, tmp_path / "op")["layout"] == "openpi"
    _same_models(src_model, dst)


def test_lerobot_layout_names_pi05_and_pi0(tmp_path):
    for kind, own, other in [("pi05", "time_mlp_", "action_time_mlp_"), ("pi0", "action_time_mlp_", None)]:
        cfg = CONFIGS[kind]
        out = convert_checkpoint(save_checkpoint(build_model(cfg), tmp_path / kind), tmp_path / f"{kind}-lr", "openpi", "lerobot", cfg)
        keys = _keys(out["dst"])
        assert all(k.startswith("model.") for k in keys)
        assert {f"model.{own}in.weight", f"model.{own}in.bias", f"model.{own}out.weight", f"model.{own}out.bias"} <= keys
        if kind == "pi05":
            assert not any(k.startswith(f"model.{other}") or k.startswith("model.state_proj") for k in keys)
            assert "model.paligemma_with_expert.gemma_expert.model.norm.dense.weight" in keys
        # the tied embedding is stored once, under the LM head's name (as openpi's file)
        assert "model." + LM_HEAD in keys and "model." + EMBED not in keys


def test_full_presets_key_counts_on_meta():
    # openpi's PI0Pytorch.state_dict(): 778 keys for pi0, 813 for pi05 (tied embedding under both names)
    assert len(expected_shapes("pi0")) == 778 and len(expected_shapes("pi05")) == 813
    assert expected_shapes("pi0")[LM_HEAD] == torch.Size([257152, 2048])


def _lerobot_file(tmp_path, cfg, edit):
    src = save_checkpoint(build_model(cfg, seed=1), tmp_path / "src", layout="lerobot")
    tensors = read_tensors(src)
    edit(tensors)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    return tmp_path / "bad.safetensors"


def test_missing_key_is_named(tmp_path):
    key = "paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    bad = _lerobot_file(tmp_path, CONFIGS["pi0"], lambda t: t.pop("model." + key))
    with pytest.raises(CheckpointError, match=f"missing tensor {key} \\(model expects shape \\[64, 32\\]\\)"):
        convert_checkpoint(bad, tmp_path / "out", "lerobot", "openpi", CONFIGS["pi0"])
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_wrong_shape_names_key_and_both_shapes(tmp_path):
    bad = _lerobot_file(tmp_path, CONFIGS["pi0"], lambda t: t.__setitem__("model.action_out_proj.weight", torch.zeros(8, 31)))
    with pytest.raises(CheckpointError, match=r"wrong shape for action_out_proj.weight: checkpoint has \[8, 31\], model expects \[8, 32\]"):
        convert_checkpoint(bad, tmp_path / "out", "lerobot", "openpi", CONFIGS["pi0"])


def test_stray_key_is_named(tmp_path):
    bad = _lerobot_file(tmp_path, CONFIGS["pi0"], lambda t: t.__setitem__("model.lora_B.weight", torch.ones(3, 2)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor lora_B.weight with shape \[3, 2\]"):
        convert_checkpoint(bad, tmp_path / "out", "lerobot", "openpi", CONFIGS["pi0"])


def test_pi0_file_as_pi05_fails_naming_keys(tmp_path):
    src = save_checkpoint(build_model(CONFIGS["pi0"]), tmp_path / "pi0")
    with pytest.raises(CheckpointError) as e:
        convert_checkpoint(src, tmp_path / "out", "openpi", "lerobot", TINY_PI05)
    msg = str(e.value)
    assert "(the file looks like pi0, the preset is pi0.5)" in msg
    assert "missing tensor paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight (model expects shape [96, 32])" in msg
    assert "... and" in msg  # long lists are cut, with a count


def test_wrong_source_layout_is_explained(tmp_path):
    openpi_file = save_checkpoint(build_model("tiny"), tmp_path / "o")
    lerobot_file = save_checkpoint(build_model("tiny"), tmp_path / "l", layout="lerobot")
    with pytest.raises(CheckpointError, match="looks like an openpi checkpoint, convert with --from openpi"):
        convert_checkpoint(openpi_file, tmp_path / "x", "lerobot", "openpi", "tiny")
    with pytest.raises(CheckpointError, match=r"(\d+) of its \1 keys start with 'model.': this looks like a LeRobot "
                                              "checkpoint"):
        convert_checkpoint(lerobot_file, tmp_path / "y", "openpi", "lerobot", "tiny")


def test_lerobot_file_with_both_embedding_names_keeps_the_embedding(tmp_path):
    # LeRobot 0.6.1's save_pretrained stores the embedding and the (untied) LM head; after
    # LeRobot fine-tuning only the embedding is trained. The embedding must win.
    model = build_model("tiny", seed=1)
    trained = torch.randn_like(model.backbone.embed_tokens.weight)

    def both(t):
        t["model." + EMBED] = trained
    bad = _lerobot_file(tmp_path, CONFIGS["pi0"], both)
    report = convert_checkpoint(bad, tmp_path / "op", "lerobot", "openpi", "tiny")
    assert report["lm_head_differed"] is True and report["embedding_from"] == "model." + EMBED
    out = read_tensors(report["dst"])
    assert EMBED not in out and torch.equal(out[LM_HEAD], trained)
    dst = build_model("tiny", seed=2)
    load_checkpoint(dst, report["dst"])
    assert torch.equal(dst.backbone.embed_tokens.weight, trained)


def test_embedding_only_file_is_accepted(tmp_path):
    def rename(t):
        t["model." + EMBED] = t.pop("model." + LM_HEAD)
    src = _lerobot_file(tmp_path, CONFIGS["pi0"], rename)
    report = convert_checkpoint(src, tmp_path / "op", "lerobot", "openpi", "tiny")
    assert report["embedding_from"] == "model." + EMBED and report["lm_head_differed"] is None
    assert LM_HEAD in _keys(report["dst"])


def test_legacy_time_mlp_names_are_renamed_and_reported(tmp_path):
    def legacy(t):
        for k in [k for k in t if k.startswith("model.action_time_mlp_")]:
            t[k.replace("model.action_time_mlp_", "model.time_mlp_")] = t.pop(k)
    src = _lerobot_file(tmp_path, CONFIGS["pi0"], legacy)
    report = convert_checkpoint(src, tmp_path / "op", "lerobot", "openpi", "tiny")
    assert ["model.time_mlp_in.weight", "action_time_mlp_in.weight"] in report["renamed"] and len(report["renamed"]) == 4
    _same_files(save_checkpoint(build_model("tiny", seed=1), tmp_path / "ref"), report["dst"])


def test_two_keys_for_one_tensor_is_an_error(tmp_path):
    def dup(t):
        t["model.time_mlp_in.weight"] = t["model.action_time_mlp_in.weight"].clone()
    src = _lerobot_file(tmp_path, CONFIGS["pi0"], dup)
    with pytest.raises(CheckpointError, match="model.action_time_mlp_in.weight and model.time_mlp_in.weight -> action_time_mlp_in.weight"):
        convert_checkpoint(src, tmp_path / "op", "lerobot", "openpi", "tiny")


def test_refuses_to_overwrite_its_input(tmp_path):
    src = save_checkpoint(build_model("tiny"), tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match="refusing to overwrite the input"):
        convert_checkpoint(src, src, "openpi", "openpi", "tiny")


def test_in_memory_conversion_keeps_tensor_objects_values():
    tensors = {k: v.clone() for k, v in build_model("tiny").state_dict().items() if k != EMBED}
    out, report = convert_tensors(tensors, "openpi", "lerobot", "tiny")
    assert report["tensors_out"] == len(tensors) and all(torch.equal(out["model." + k], v) for k, v in tensors.items())
    with pytest.raises(CheckpointError, match="unknown checkpoint layout 'hf'"):
        convert_tensors(tensors, "openpi", "hf", "tiny")
    with pytest.raises(CheckpointError, match="unknown model preset 'pi1'"):
        convert_tensors(tensors, "openpi", "lerobot", "pi1")


# ---------------------------------------------------------------------------- CLI


def _cli(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_cli_convert_round_trip(tmp_path, capsys):
    src = save_checkpoint(build_model("tiny", seed=4), tmp_path / "openpi")
    assert _cli(["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(src.parent), str(tmp_path / "lr")]) == 0
    assert "-> " in capsys.readouterr().out
    assert _cli(["convert", "--from", "lerobot", "--to", "openpi", "--preset", "tiny", str(tmp_path / "lr"),
                 str(tmp_path / "back.safetensors")]) == 0
    _same_files(src, tmp_path / "back.safetensors")


@pytest.mark.parametrize(
    "args,message",
    [
        # a tiny file is not pi0: the counts first, then the wrong shapes (the telling ones) before the missing names
        (["--from", "openpi", "--to", "lerobot", "--preset", "pi0"], "(90 wrong shape, 688 missing):\n  wrong shape for"),
        (["--from", "lerobot", "--to", "openpi", "--preset", "tiny"], "lack the 'model.' prefix"),
        (["--from", "openpi", "--to", "lerobot", "--preset", "tiny", "--in", "/nonexistent"], "checkpoint not found"),
        (["--from", "jax", "--to", "lerobot", "--preset", "tiny"], "invalid choice: 'jax'"),
        (["--from", "openpi", "--to", "lerobot", "--preset", "pi1"], "invalid choice: 'pi1'"),
        (["--to", "lerobot", "--preset", "tiny"], "the following arguments are required: --from"),
    ],
)
def test_cli_convert_errors_exit_2(tmp_path, capsys, args, message):
    src = save_checkpoint(build_model("tiny"), tmp_path / "openpi")
    if "--in" in args:
        i = args.index("--in")
        src, args = Path(args[i + 1]), args[:i]
    assert _cli(["convert", *args, str(src), str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_an_existing_output_is_replaced_only_with_force(tmp_path, capsys):
    """convert wrote over an existing checkpoint without a word (a repeated command could replace another model's
    file); it now refuses, exit code 2, and --force (overwrite=True) replaces it."""
    cfg = get_config("tiny")
    src = save_checkpoint(build_model(cfg, seed=0), tmp_path / "src")
    other = save_checkpoint(build_model(cfg, seed=1), tmp_path / "other.safetensors")
    before = read_tensors(other)
    argv = ["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(src), str(other)]
    assert main(argv) == 2
    assert "other.safetensors exists: give another output path, or replace it with --force" in capsys.readouterr().err
    assert all(torch.equal(before[k], v) for k, v in read_tensors(other).items())  # untouched
    assert main(argv + ["--force"]) == 0
    assert any(k.startswith("model.") for k in read_tensors(other))  # now the converted, LeRobot-layout file


def test_a_file_with_nan_or_inf_weights_is_not_converted(tmp_path, capsys):
    """convert wrote a NaN weight into its output, a file vlaperf's own loader then refused; it now refuses at
    once, names each tensor, exit code 2, and writes nothing."""
    cfg = get_config("tiny")
    tensors = read_tensors(save_checkpoint(build_model(cfg, seed=0), tmp_path / "src"))
    tensors["action_in_proj.weight"][0, 0] = float("nan")
    tensors["action_out_proj.bias"][1] = float("-inf")
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError, match="non-finite weights:\n  action_in_proj.weight: NaN or inf\n"
                                              "  action_out_proj.bias: NaN or inf"):
        convert_checkpoint(tmp_path / "bad.safetensors", tmp_path / "out.safetensors", "openpi", "lerobot", cfg)
    argv = ["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(tmp_path / "bad.safetensors"),
            str(tmp_path / "out.safetensors")]
    assert main(argv) == 2
    assert "action_in_proj.weight: NaN or inf" in capsys.readouterr().err
    assert not (tmp_path / "out.safetensors").exists()


# ------------------------------------------------------------------- report details


def _tensors(cfg="tiny", prefix=""):
    """A model's tensors as a file of openpi's layout holds them (the tied embedding once, as the LM head), with `prefix`."""
    return {prefix + k: v for k, v in build_model(cfg, seed=1).state_dict().items() if k != EMBED}


def test_an_empty_checkpoint_is_refused():
    with pytest.raises(CheckpointError, match="^the checkpoint holds no tensors$"):
        convert_tensors({}, "openpi", "lerobot", "tiny")


@pytest.mark.parametrize("strays,listed", [(5, "a0.w, a1.w, a2.w, a3.w, a4.w"), (7, "a0.w, a1.w, a2.w, a3.w, a4.w and 2 more")])
def test_a_few_unprefixed_keys_of_a_lerobot_file_are_listed_without_the_openpi_hint(strays, listed):
    tensors = _tensors(prefix="model.") | {f"a{i}.w": torch.zeros(1) for i in range(strays)}
    with pytest.raises(CheckpointError) as e:
        convert_tensors(tensors, "lerobot", "openpi", "tiny")
    assert str(e.value) == f"LeRobot checkpoint keys lack the 'model.' prefix: {listed}"


def test_an_openpi_file_with_one_prefixed_key_gets_no_openpi_hint():
    # most keys unprefixed, but not all: not plainly an openpi file, so the hint to convert --from openpi is not given
    tensors = _tensors() | {"model.extra": torch.zeros(1)}
    with pytest.raises(CheckpointError) as e:
        convert_tensors(tensors, "lerobot", "openpi", "tiny")
    first = sorted(_tensors())[:5]
    assert str(e.value) == (f"LeRobot checkpoint keys lack the 'model.' prefix: {', '.join(first)} and "
                            f"{len(_tensors()) - 5} more")


def test_report_names_where_the_embedding_came_from_and_counts():
    model = build_model("tiny", seed=1)
    params = sum(p.numel() for p in model.parameters())  # the tied embedding counted once
    out, report = convert_tensors(_tensors(), "openpi", "lerobot", "tiny")
    assert report["embedding_from"] == LM_HEAD and report["lm_head_differed"] is None
    assert report["numel"] == params and report["tensors_in"] == report["tensors_out"] == len(out)
    _, report = convert_tensors(out, "lerobot", "openpi", "tiny")
    assert report["embedding_from"] == "model." + LM_HEAD and report["renamed"] == []

    both = {"model." + k: v for k, v in model.state_dict().items()}  # LeRobot's file: embedding and head, equal here
    _, report = convert_tensors(both, "lerobot", "openpi", "tiny")
    assert report["embedding_from"] == "model." + EMBED and report["lm_head_differed"] is False
    assert report["tensors_in"] == len(both) == report["tensors_out"] + 1 and report["numel"] == params
    assert report["preset"] == "tiny" and report["from"] == "lerobot" and report["to"] == "openpi"


def test_from_model_names_keeps_an_untied_embedding():
    t, u = torch.ones(2, 3), torch.zeros(4)
    assert set(from_model_names({EMBED: t, "a.weight": u}, "lerobot")) == {"model." + EMBED, "model.a.weight"}
    assert set(from_model_names({EMBED: t, LM_HEAD: t, "a.weight": u}, "openpi")) == {LM_HEAD, "a.weight"}


def test_converted_file_records_its_provenance(tmp_path):
    src = save_checkpoint(build_model("tiny", seed=1), tmp_path / "openpi")
    report = convert_checkpoint(src.parent, tmp_path / "lr", "openpi", "lerobot", "tiny")
    assert report["src"] == str(src) and report["dst"] == str(tmp_path / "lr" / "model.safetensors")
    with safe_open(report["dst"], "pt") as f:
        assert f.metadata() == {"format": "pt", "layout": "lerobot", "converted_from": "openpi", "preset": "tiny"}


def test_cli_convert_prints_renames_and_the_lm_head_note(tmp_path, capsys):
    def legacy_and_trained(t):
        for k in [k for k in t if k.startswith("model.action_time_mlp_")]:
            t[k.replace("model.action_time_mlp_", "model.time_mlp_")] = t.pop(k)
        t["model." + EMBED] = torch.randn_like(t["model." + LM_HEAD])
    src = _lerobot_file(tmp_path, CONFIGS["pi0"], legacy_and_trained)
    n = len(read_tensors(src))
    assert _cli(["convert", "--from", "lerobot", "--to", "openpi", "--preset", "tiny", str(src), str(tmp_path / "op")]) == 0
    out = capsys.readouterr().out
    assert f"({'lerobot'}, {n} tensors) -> {tmp_path / 'op' / 'model.safetensors'} (openpi, {n - 1} tensors, float32, preset tiny)" in out
    assert "  renamed model.time_mlp_in.weight -> action_time_mlp_in.weight\n" in out and out.count("  renamed ") == 4
    assert f"the embedding (model.{EMBED}) was kept, as LeRobot's loader does" in out

    bf16 = save_checkpoint(build_model("tiny", dtype=torch.bfloat16), tmp_path / "bf16")
    assert _cli(["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(bf16), str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert "tensors, bfloat16/float32, preset tiny)" in out and "renamed" not in out and "note:" not in out


def test_jax_conversion_refuses_early_records_provenance_and_prints_the_filled_heads(tmp_path, capsys):
    pytest.importorskip("tensorstore")  # reads openpi's JAX checkpoints (the dev extra installs it)
    import json
    from types import SimpleNamespace

    from vlaperf import openpi_jax
    from vlaperf.compare.commands import cmd_convert
    from vlaperf.models.pi0 import GemmaConfig, Pi0Config, VisionConfig

    data = Path(__file__).parent / "data" / "openpi_jax" / "pi05"  # tests/test_openpi_jax.py's fixture
    c = json.loads((data / "config.json").read_text())
    cfg = Pi0Config("openpi-jax-pi05", VisionConfig(**c["vision"]), GemmaConfig(**c["backbone"]), GemmaConfig(**c["expert"]),
                    pi05=c["pi05"], action_dim=c["action_dim"], action_horizon=c["action_horizon"],
                    max_token_len=c["max_token_len"])
    with pytest.raises(CheckpointError, match="unknown checkpoint layout 'hf'"):  # before the (long) read of IN
        convert_checkpoint(tmp_path, tmp_path / "x", "openpi-jax", "hf", cfg)
    existing = tmp_path / "old.safetensors"
    existing.write_bytes(b"another model")
    with pytest.raises(CheckpointError, match="old.safetensors exists: give another output path"):
        convert_checkpoint(data, existing, "openpi-jax", "lerobot", cfg)
    assert existing.read_bytes() == b"another model"

    args = SimpleNamespace(src=str(data), dst=str(tmp_path / "out"), from_layout="openpi-jax", to_layout="openpi", preset=cfg,
                           force=False)
    assert cmd_convert(args) == 0
    out = capsys.readouterr().out
    assert f"  {openpi_jax.EXPERT_LM_HEAD}: not in openpi's JAX model (inference never reads it): written as zeros" in out
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "layout": "openpi", "converted_from": "openpi-jax", "preset": "openpi-jax-pi05"}
