"""Checkpoint loading and saving in openpi's and LeRobot's layouts."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vlaperf.checkpoints import EMBED, LM_HEAD, CheckpointError, load_checkpoint, read_tensors, save_checkpoint
from vlaperf.models.pi0 import build_model, get_config


def _assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
def test_round_trip_is_bit_exact(tmp_path, layout):
    src = build_model("tiny", seed=1)
    dst = build_model("tiny", seed=2)
    path = save_checkpoint(src, tmp_path / layout, layout=layout)
    report = load_checkpoint(dst, path.parent)  # a folder holding model.safetensors
    assert report["layout"] == layout
    _assert_same(src, dst)


def test_bf16_round_trip_keeps_dtypes(tmp_path):
    src = build_model("tiny", seed=1, dtype=torch.bfloat16)
    dst = build_model("tiny", seed=2, dtype=torch.bfloat16)
    load_checkpoint(dst, save_checkpoint(src, tmp_path / "m.safetensors"))
    _assert_same(src, dst)
    assert dst.backbone.layers[0].input_layernorm.weight.dtype == torch.float32


def test_openpi_file_stores_tied_embedding_once(tmp_path):
    path = save_checkpoint(build_model("tiny"), tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    assert LM_HEAD in keys and EMBED not in keys


def test_embedding_under_either_name_loads(tmp_path):
    src = build_model("tiny", seed=1)
    tensors = read_tensors(save_checkpoint(src, tmp_path / "a.safetensors"))
    tensors[EMBED] = tensors.pop(LM_HEAD)
    save_file(tensors, str(tmp_path / "b.safetensors"))
    dst = build_model("tiny", seed=2)
    load_checkpoint(dst, tmp_path / "b.safetensors")
    _assert_same(src, dst)


def _saved(tmp_path, model, edit):
    tensors = read_tensors(save_checkpoint(model, tmp_path / "x.safetensors"))
    edit(tensors)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    return tmp_path / "bad.safetensors"


def test_wrong_shape_names_key_and_both_shapes(tmp_path):
    key = "action_in_proj.weight"
    path = _saved(tmp_path, build_model("tiny"), lambda t: t.__setitem__(key, torch.zeros(7, 3)))
    with pytest.raises(CheckpointError, match=r"wrong shape for action_in_proj.weight: checkpoint has \[7, 3\], model expects \[32, 8\]"):
        load_checkpoint(build_model("tiny"), path)


def test_missing_key_is_named(tmp_path):
    key = "paligemma_with_expert.gemma_expert.model.norm.weight"
    path = _saved(tmp_path, build_model("tiny"), lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=f"missing tensor {key} \\(model expects shape \\[32\\]\\)"):
        load_checkpoint(build_model("tiny"), path)


def test_unexpected_key_is_named(tmp_path):
    path = _saved(tmp_path, build_model("tiny"), lambda t: t.__setitem__("lora_A.weight", torch.ones(2, 2)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor lora_A.weight with shape \[2, 2\]"):
        load_checkpoint(build_model("tiny"), path)


def test_pi0_checkpoint_into_pi05_model_fails_clearly(tmp_path):
    path = save_checkpoint(build_model("tiny"), tmp_path / "pi0.safetensors")
    with pytest.raises(CheckpointError, match="missing tensor time_mlp_in.weight"):
        load_checkpoint(build_model(get_config("tiny", pi05=True)), path)


def test_lerobot_legacy_time_mlp_names(tmp_path):
    src = build_model("tiny", seed=1)
    tensors = read_tensors(save_checkpoint(src, tmp_path / "a.safetensors", layout="lerobot"))
    for name in [k for k in tensors if k.startswith("model.action_time_mlp_")]:
        tensors[name.replace("model.action_time_mlp_", "model.time_mlp_")] = tensors.pop(name)
    save_file(tensors, str(tmp_path / "legacy.safetensors"))
    dst = build_model("tiny", seed=2)
    assert load_checkpoint(dst, tmp_path / "legacy.safetensors")["layout"] == "lerobot"
    _assert_same(src, dst)


def test_missing_file():
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(build_model("tiny"), "/nonexistent/model.safetensors")


def test_a_file_that_cannot_be_opened_is_a_named_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    """safetensors reports any failure to open a file (a permission denied, a root-squashed NFS mount, a device
    file) as an OSError without its filename, which the CLI re-raised as a bug: a traceback "No such file or
    directory" for a file that is there. Now a CheckpointError naming the file (with the OS's own reason where
    Python's open says it), exit code 2."""
    import vlaperf.checkpoints as checkpoints
    from vlaperf.cli import main

    path = save_checkpoint(build_model("tiny"), tmp_path / "a")

    def refuse(name, **kwargs):  # what safetensors 0.8 raises where its open(2) fails, whatever the errno
        raise FileNotFoundError(f"No such file or directory: {name!r}")

    monkeypatch.setattr(checkpoints, "safe_open", refuse)
    for call in (lambda: load_checkpoint(build_model("tiny"), path), lambda: checkpoints.check_readable(path)):
        with pytest.raises(CheckpointError, match=f"{path}: cannot read it"):
            call()
    assert main(["convert", "--from", "openpi", "--to", "lerobot", "--preset", "tiny", str(path),
                 str(tmp_path / "out")]) == 2
    assert f"{path}: cannot read it (No such file or directory" in capsys.readouterr().err


def test_both_embedding_names_the_embedding_wins(tmp_path):
    """LeRobot saves an untied LM head and embedding; its loader ends with the file's embedding."""
    src = build_model("tiny", seed=1)
    tensors = read_tensors(save_checkpoint(src, tmp_path / "a.safetensors"))
    tensors[EMBED] = tensors[LM_HEAD].clone()
    tensors[LM_HEAD] = torch.zeros_like(tensors[LM_HEAD])  # a stale, unused head
    save_file(tensors, str(tmp_path / "both.safetensors"))
    dst = build_model("tiny", seed=2)
    load_checkpoint(dst, tmp_path / "both.safetensors")
    _assert_same(src, dst)


def test_engine_built_before_a_load_refuses_to_run(tmp_path):
    """An engine copies the weights it is built from: after load_checkpoint it would run a mix of old and new
    weights, so it refuses, naming the cause; an engine built after the load runs the checkpoint's weights."""
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.workloads import get_workload

    w = get_workload("tiny")
    path = save_checkpoint(build_model("tiny", seed=1), tmp_path / "seed1")
    model = build_model("tiny", seed=0)
    stale = Engine(model, "for_loop,fuse_projections")
    load_checkpoint(model, path)
    obs, noise = random_observation(w, model.config), random_noise(w, model.config)
    with pytest.raises(RuntimeError, match="weights changed since this engine was built"):
        stale.sample_actions(obs, noise, 2)
    fresh = Engine(model, "for_loop,fuse_projections")
    torch.testing.assert_close(fresh.sample_actions(obs, noise, 2), model.sample_actions(obs, noise, 2))
    assert model.checkpoint == {"path": str(path), "layout": "openpi"}


def test_released_models_cannot_be_saved_or_loaded(tmp_path):
    from vlaperf.engine import Engine

    model = build_model("tiny")
    path = save_checkpoint(model, tmp_path / "ok")
    Engine(model, "fuse_projections").release_reference_weights()
    for action in (lambda: save_checkpoint(model, tmp_path / "out"), lambda: load_checkpoint(model, path)):
        with pytest.raises(CheckpointError, match="reference weights were released"):
            action()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.__setitem__("action_in_proj.weight", t["action_in_proj.weight"].long()),
     "wrong dtype for action_in_proj.weight: checkpoint has int64, model expects floating point"),
    (lambda t: t["action_in_proj.weight"].__setitem__((0, 0), float("nan")), "non-finite weights:\n  action_in_proj.weight: NaN or inf"),
])
def test_integer_and_non_finite_weights_are_refused_and_the_model_is_untouched(tmp_path, edit, message):
    tensors = read_tensors(save_checkpoint(build_model("tiny", seed=1), tmp_path / "a.safetensors"))
    edit(tensors)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    model = build_model("tiny", seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(model, tmp_path / "bad.safetensors")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and model.weights_version == 0


def test_overflow_in_the_models_dtype_is_refused(tmp_path):
    tensors = read_tensors(save_checkpoint(build_model("tiny", seed=1), tmp_path / "a.safetensors"))
    model = build_model("tiny", dtype=torch.float16)
    key = next(k for k, v in model.state_dict().items() if v.dtype == torch.float16 and v.dim() == 2)
    tensors[key] = tensors[key].float()
    tensors[key][0, 0] = 1e6  # finite in float32, inf in float16
    save_file(tensors, str(tmp_path / "big.safetensors"))
    with pytest.raises(CheckpointError, match=f"{key}: NaN or inf once cast to the model's torch.float16"):
        load_checkpoint(model, tmp_path / "big.safetensors")


def test_duplicate_time_mlp_names_are_refused(tmp_path):
    tensors = read_tensors(save_checkpoint(build_model("tiny", seed=1), tmp_path / "a.safetensors", layout="lerobot"))
    for name in [k for k in tensors if k.startswith("model.action_time_mlp_")]:
        tensors[name.replace("model.action_time_mlp_", "model.time_mlp_")] = tensors[name].clone()
    save_file(tensors, str(tmp_path / "both.safetensors"))
    with pytest.raises(CheckpointError, match="several keys of the checkpoint name the same tensor action_time_mlp_"):
        load_checkpoint(build_model("tiny"), tmp_path / "both.safetensors")


def test_bad_output_paths_are_named_and_leave_nothing_behind(tmp_path):
    import os
    import stat

    model = build_model("tiny")
    (tmp_path / "plainfile").write_text("x")
    (tmp_path / "dir.safetensors").mkdir()
    for out, message in ((tmp_path / "plainfile", "an existing file"), (tmp_path / "dir.safetensors", "a folder"),
                         ("", "output path: empty")):
        with pytest.raises(CheckpointError, match=message):
            save_checkpoint(model, out)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="cannot write"):
        save_checkpoint(model, blocker / "sub" / "m.safetensors")  # a parent that is a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "dir.safetensors", "plainfile"]
    old = os.umask(0o022)
    try:
        path = save_checkpoint(model, tmp_path / "new" / "deeper" / "m.safetensors")  # parents created
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and not list(path.parent.glob("*.partial"))


def test_a_write_that_fails_midway_leaves_nothing_behind_and_keeps_the_old_file(tmp_path, monkeypatch):
    """A disk that fills during the write: the half-written `.partial` file and the folders the write created are
    removed, an existing file at the destination is untouched, and the error names the path and the cause."""
    import errno
    import os

    import vlaperf.checkpoints as ckpt

    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a header")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    model = build_model("tiny")
    old = save_checkpoint(model, tmp_path / "keep" / "m.safetensors")
    before = old.read_bytes()
    monkeypatch.setattr(ckpt, "save_file", half_write)
    with pytest.raises(CheckpointError, match=r"cannot write .*m\.safetensors: No space left on device"):
        save_checkpoint(model, old)
    assert old.read_bytes() == before and sorted(p.name for p in old.parent.iterdir()) == ["m.safetensors"]
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint(model, tmp_path / "a" / "b" / "m.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]  # a/ and a/b/ were made by the write: gone

    def interrupted_write(tensors, filename, metadata=None):  # a Ctrl-C (or a MemoryError) half way: not an OSError
        with open(filename, "wb") as f:
            f.write(b"half a header")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save_file", interrupted_write)
    with pytest.raises(KeyboardInterrupt):  # itself, not turned into a CheckpointError
        save_checkpoint(model, tmp_path / "c" / "m.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]  # no .partial of gigabytes left, nor c/


def test_lerobot_files_with_stray_keys_and_the_wrong_layout_are_named(tmp_path):
    tensors = read_tensors(save_checkpoint(build_model("tiny"), tmp_path / "a.safetensors", layout="lerobot"))
    tensors["normalize_inputs.buffer_observation_state.mean"] = torch.zeros(8)  # older LeRobot files carried these
    save_file(tensors, str(tmp_path / "stray.safetensors"))
    with pytest.raises(CheckpointError, match="LeRobot checkpoint key 'normalize_inputs.buffer_observation_state.mean' lacks"):
        load_checkpoint(build_model("tiny"), tmp_path / "stray.safetensors")
    with pytest.raises(CheckpointError, match="load it with layout 'lerobot' or 'auto'"):
        load_checkpoint(build_model("tiny"), tmp_path / "a.safetensors", layout="openpi")


def test_an_engine_refuses_to_run_after_torchs_own_load_state_dict():
    """Weights swapped through torch's `model.load_state_dict` (not vlaperf's load_checkpoint) left an engine built
    before it mixing its fused copies of the old weights with the layers' new ones (actions 3.06 off with `best`,
    no error); the load now bumps the weights' version as load_checkpoint does."""
    from vlaperf.engine import Engine
    from vlaperf.inputs import random_noise, random_observation
    from vlaperf.workloads import get_workload

    w = get_workload("tiny")
    model = build_model("tiny", "cpu", torch.float32, seed=0)
    stale = Engine(model, "for_loop,fuse_projections")
    model.load_state_dict(build_model("tiny", "cpu", torch.float32, seed=1).state_dict())
    obs, noise = random_observation(w, model.config), random_noise(w, model.config)
    with pytest.raises(RuntimeError, match="weights changed since this engine was built"):
        stale.sample_actions(obs, noise, 2)
    fresh = Engine(model, "for_loop,fuse_projections")
    torch.testing.assert_close(fresh.sample_actions(obs, noise, 2), model.sample_actions(obs, noise, 2))


def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    """Path("") is ".": load_checkpoint(model, "") loaded whatever model.safetensors the current folder held, and
    load_checkpoint_io read its norm_stats.json (the CLI refused the empty string; the Python API did not)."""
    from vlaperf.policy import load_checkpoint_io

    model = build_model("tiny", seed=0)
    save_checkpoint(build_model("tiny", seed=1), tmp_path)
    (tmp_path / "norm_stats.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint path: empty \(an unset variable\?\)"):
        load_checkpoint(model, "")
    with pytest.raises(ValueError, match=r"norm stats path: empty"):
        load_checkpoint_io(None, "", model.config)
    with pytest.raises(ValueError, match=r"tokenizer path: empty"):
        load_checkpoint_io(" ", None, model.config)
    assert load_checkpoint(model, ".")["layout"] == "openpi"  # the folder named as itself still loads


def test_detect_layout_is_by_majority():
    """The layout is LeRobot's only when MOST keys carry "model." (one stray key does not flip an openpi file)."""
    from vlaperf.checkpoints import detect_layout
    assert detect_layout(["a.weight", "b.weight", "model.stray"]) == "openpi"
    assert detect_layout(["model.a", "model.b", "stray"]) == "lerobot"


def test_detect_layout_needs_more_than_half():
    """Exactly half the keys with "model." is not most of them: openpi's layout."""
    from vlaperf.checkpoints import detect_layout
    assert detect_layout(["model.a", "b.weight"]) == "openpi"
    assert detect_layout(["model.a", "model.b", "c.weight"]) == "lerobot"
    assert detect_layout([]) == "openpi"


def test_lerobot_pi05_round_trip_keeps_its_time_mlp_names(tmp_path):
    """pi0.5's time MLP is time_mlp_*; only a pi0 file's legacy time_mlp_* is renamed to action_time_mlp_*, so a
    LeRobot pi0.5 file loads as saved."""
    cfg = get_config("tiny", pi05=True)
    src, dst = build_model(cfg, seed=1), build_model(cfg, seed=2)
    path = save_checkpoint(src, tmp_path / "pi05.safetensors", layout="lerobot")
    assert any(k.startswith("model.time_mlp_") for k in read_tensors(path))
    assert load_checkpoint(dst, path)["layout"] == "lerobot"
    _assert_same(src, dst)


def test_a_file_of_the_other_family_is_named_as_such(tmp_path):
    """A pi0.5 file loaded into a pi0 preset (and the other way round) says which family the file looks like."""
    pi05 = save_checkpoint(build_model(get_config("tiny", pi05=True)), tmp_path / "pi05.safetensors")
    with pytest.raises(CheckpointError, match=r"preset 'tiny' \(the file looks like pi0.5, the preset is pi0\)"):
        load_checkpoint(build_model("tiny"), pi05)
    pi0 = save_checkpoint(build_model("tiny"), tmp_path / "pi0.safetensors")
    with pytest.raises(CheckpointError, match=r"\(the file looks like pi0, the preset is pi0.5\)"):
        load_checkpoint(build_model(get_config("tiny", pi05=True)), pi0)


def test_a_lerobot_file_of_the_other_family_is_named_as_such(tmp_path):
    """In LeRobot's layout a pi0.5 file's time_mlp_* is read as pi0's legacy name (action_time_mlp_*) on a pi0 preset,
    so the time MLP's name cannot say the family; the error still says the file looks like pi0.5."""
    pi05 = save_checkpoint(build_model(get_config("tiny", pi05=True)), tmp_path / "pi05.safetensors", layout="lerobot")
    with pytest.raises(CheckpointError, match=r"preset 'tiny' \(the file looks like pi0.5, the preset is pi0\)"):
        load_checkpoint(build_model("tiny"), pi05)
    pi0 = save_checkpoint(build_model("tiny"), tmp_path / "pi0.safetensors", layout="lerobot")
    with pytest.raises(CheckpointError, match=r"\(the file looks like pi0, the preset is pi0.5\)"):
        load_checkpoint(build_model(get_config("tiny", pi05=True)), pi0)


def test_check_readable_reads_the_header(tmp_path):
    """check_readable (a server's check before it builds a model) refuses a file that is no safetensors file, and
    takes a real one."""
    from vlaperf.checkpoints import check_readable

    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        check_readable(tmp_path)
    check_readable(save_checkpoint(build_model("tiny"), tmp_path / "ok"))


def test_every_wrongly_shaped_tensor_is_named_and_counted(tmp_path):
    """Each wrongly shaped tensor is listed, the first of them in sorted order too: a bias of shape [1] would
    otherwise broadcast into the model's [32] on copy, with no word."""
    def edit(t):
        t["action_in_proj.bias"] = torch.zeros(1)
        t["action_out_proj.bias"] = torch.zeros(3)

    path = _saved(tmp_path, build_model("tiny"), edit)
    with pytest.raises(CheckpointError, match=r"\(2 wrong shape\):\n  wrong shape for action_in_proj.bias: checkpoint "
                                              r"has \[1\], model expects \[32\]\n  wrong shape for action_out_proj.bias"):
        load_checkpoint(build_model("tiny"), path)


def test_long_problem_lists_are_cut_at_20_and_counted(tmp_path):
    """A file far from the model lists 20 problems and says how many more; so do non-finite weights."""
    from vlaperf.checkpoints import check_finite

    model = build_model("tiny")
    n = len(model.state_dict())
    path = _saved(tmp_path, model, lambda t: [t.pop(k) for k in list(t)[1:]])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(build_model("tiny"), path)
    lines = str(err.value).splitlines()
    assert len(lines) == 23 and lines[-2] == f"  ... and {n - 1 - 20} more"
    # what the counts mean, last: the file holds one of the preset's tensors
    assert lines[-1] == (f"(the file holds 1 of the preset's {n} tensors: a checkpoint of another preset, or not all "
                         "of one?)")
    bad = {f"w{i:02d}": torch.full((2,), float("nan")) for i in range(23)}
    with pytest.raises(CheckpointError, match=r"w19: NaN or inf\n  \.\.\. and 3 more$"):
        check_finite(bad)


def test_a_params_folder_without_orbax_markers_is_named(tmp_path):
    """A folder holding params/ but no model.safetensors looks like an incomplete openpi JAX checkpoint: said so."""
    (tmp_path / "params").mkdir()
    with pytest.raises(CheckpointError, match="it looks like an openpi JAX checkpoint, but without orbax's"):
        load_checkpoint(build_model("tiny"), tmp_path)


def test_read_model_tensors_keeps_the_files_dtypes_and_loads_nothing(tmp_path):
    """read_model_tensors (compare's one read for two runtimes): openpi names, the file's own dtypes (bfloat16 here,
    its float32 heads float32), both embedding names on one tensor, and the report load_checkpoint returns."""
    from vlaperf.checkpoints import read_model_tensors

    source = build_model("tiny", seed=5, dtype=torch.bfloat16)  # openpi's placement: heads and norms in float32
    path = save_checkpoint(source, tmp_path / "m", layout="lerobot")
    target = build_model("tiny", seed=6)  # float32: reading must not cast to it nor load into it
    before = {k: v.clone() for k, v in target.state_dict().items()}
    named, report = read_model_tensors(tmp_path / "m", {k: v.shape for k, v in target.state_dict().items()}, False)
    assert set(named) == set(source.state_dict()) and named[LM_HEAD] is named[EMBED]
    assert all(named[k].dtype == v.dtype and torch.equal(named[k], v) for k, v in source.state_dict().items())
    assert report == {"path": str(path), "layout": "lerobot", "tensors": len(named) - 1, "file_dtypes": ["torch.bfloat16", "torch.float32"]}
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert load_checkpoint(target, path) == report  # the same report, through the one read
    with pytest.raises(CheckpointError, match="unknown checkpoint layout 'safetensors'"):
        read_model_tensors(path, {}, False, layout="safetensors")


def test_lerobots_conventions_take_the_checkpoints_own_chunk(tmp_path, capsys):
    """LeRobot's chunk_size is each checkpoint's training choice (50 its default): --conventions lerobot:pi0 serves a
    checkpoint trained with 10 at 10, where it was refused ("trained with 10 actions a chunk") and the only way out
    was conventions "none", with openpi's image resize and prompt."""
    import argparse
    import json

    from vlaperf.cli import CliError, resolve_shape
    from vlaperf.workloads import get_workload

    folder = tmp_path / "ckpt"
    save_checkpoint(build_model("tiny", seed=1), folder, layout="lerobot")
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 10}))
    libero = get_workload("libero-pi0")  # 50 actions a chunk

    def args(**kw):
        return argparse.Namespace(**{"conventions": "lerobot:pi0", "action_horizon": None, "batch": None,
                                     "steps": None, "checkpoint": str(folder), **kw})

    workload, cfg = resolve_shape(args(), libero)
    assert workload.horizon == cfg.action_horizon == 10
    assert "10 actions a chunk, as the checkpoint was trained" in capsys.readouterr().err
    with pytest.raises(CliError, match=r"--action-horizon 20: the checkpoint was trained with 10 actions a chunk"):
        resolve_shape(args(action_horizon=20), libero)
    # no config.json (random weights): LeRobot's default, said where the workload's chunk differs
    workload, _ = resolve_shape(args(checkpoint=None), get_workload("tiny"))
    assert workload.horizon == 50 and "50 actions a chunk, LeRobot's default" in capsys.readouterr().err


def test_load_checkpoint_warns_where_lerobots_chunk_is_not_the_models_horizon(tmp_path):
    """The Python API's load: LeRobot's config.json says the chunk the checkpoint was trained with, which no tensor
    holds; a model of another action_horizon loads (strict on the tensors) with a warning naming both and the fix,
    and one of the trained horizon loads without it."""
    import json
    import warnings


    folder = tmp_path / "ckpt"
    save_checkpoint(build_model("tiny", seed=1), folder, layout="lerobot")
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 4}))
    with pytest.warns(UserWarning, match=r"trained with 4 actions a chunk \(chunk_size\); this model has "
                                         r"action_horizon 10.*get_config\(preset, action_horizon=4\)"):
        load_checkpoint(build_model("tiny"), folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(build_model(get_config("tiny", action_horizon=4)), folder)
        (folder / "config.json").unlink()  # openpi's files: no config.json, nothing to compare
        load_checkpoint(build_model("tiny"), folder)


def test_lerobots_config_sets_the_chunk_and_refuses_the_other_family(tmp_path, capsys):
    """The chunk a checkpoint was trained with is not in its weights; LeRobot's config.json beside them says it.
    The run takes it (a note where the workload's differs), an --action-horizon against it is exit 2, a pi0.5
    policy's folder on a pi0 workload is refused before the build, and another program's config.json is ignored."""
    import json

    from vlaperf.checkpoints import lerobot_config
    from vlaperf.cli import main

    folder = tmp_path / "ckpt"
    save_checkpoint(build_model("tiny", seed=1), folder, layout="lerobot")
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 5, "n_action_steps": 5}))
    assert lerobot_config(folder / "model.safetensors") == {"type": "pi0", "chunk_size": 5,
                                                            "path": str(folder / "config.json")}
    out = tmp_path / "b.json"
    bench = ["bench", "--workload", "tiny", "--checkpoint", str(folder), "--iters", "1", "--warmup", "0",
             "--no-progress"]
    assert main([*bench, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["workload"]["overrides"] == {"horizon": 5}
    said = capsys.readouterr()
    assert f"vlaperf: 5 actions a chunk, as the checkpoint was trained ({folder / 'config.json'}); workload tiny " \
           "has 10" in said.err
    assert f"weights: {folder / 'model.safetensors'} (lerobot layout)" in said.out  # the console says what it timed
    assert main([*bench, "--action-horizon", "5"]) == 0  # agreeing with it is fine
    assert main([*bench, "--action-horizon", "8"]) == 2
    assert ("--action-horizon 8: the checkpoint was trained with 5 actions a chunk (chunk_size in "
            f"{folder / 'config.json'})") in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps({"type": "pi05", "chunk_size": 10}))
    assert main(bench) == 2
    assert "--checkpoint: a LeRobot pi0.5 policy" in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": "50"}))
    assert main(bench) == 2
    assert "LeRobot's pi0 config with chunk_size '50'; expected a positive integer" in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps({"model_type": "paligemma", "chunk_size": 3}))  # not LeRobot's
    assert lerobot_config(folder) is None
    assert main(bench) == 0


def test_a_saved_checkpoint_keeps_the_embedding_inference_reads(tmp_path):
    """The file stores the tied embedding once, under the LM head's name: where the two were untied (torch's
    load_state_dict(assign=True) does that) and the embedding changed, the LM head's stale values were saved and a
    reload embedded tokens with them."""
    model = build_model("tiny", seed=1)
    head = model.paligemma_with_expert.paligemma.lm_head
    embed = model.paligemma_with_expert.paligemma.model.language_model.embed_tokens
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untied, as an assign=True load leaves it
    with torch.no_grad():
        embed.weight.add_(1.0)
    again = build_model("tiny", seed=2)
    load_checkpoint(again, save_checkpoint(model, tmp_path / "m"))
    assert torch.equal(again.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight, embed.weight)


def test_a_model_without_the_unused_heads_loads_its_own_file_and_a_full_one(tmp_path):
    """unused_heads=False (no LM heads: inference never reads them) could not load the file it saved (the tied
    alias came back as an unexpected key), nor openpi's full file; the heads are dropped by name, nothing else."""
    headless = get_config("tiny", unused_heads=False)
    sources = build_model(headless, seed=1), build_model("tiny", seed=2)
    for source, name in zip(sources, ("own", "full")):
        model = build_model(headless, seed=5)
        load_checkpoint(model, save_checkpoint(source, tmp_path / name))
        saved = source.state_dict()
        assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()), name
    full = tmp_path / "full" / "model.safetensors"
    tensors = read_tensors(full)
    tensors.pop("action_out_proj.bias")
    save_file(tensors, str(tmp_path / "short.safetensors"))
    with pytest.raises(CheckpointError, match="missing.*action_out_proj.bias"):  # still strict about the rest
        load_checkpoint(build_model(headless), tmp_path / "short.safetensors")


def test_a_file_of_another_model_is_named_as_such(tmp_path, capsys):
    """A safetensors file that holds no tensor of the preset (another model's) says so with its keys, instead of 20
    "missing" lines; convert's --from lerobot no longer calls it an openpi checkpoint."""
    from vlaperf.cli import main

    other = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(2, 2), "decoder.bias": torch.zeros(2)}, str(other))
    with pytest.raises(CheckpointError, match=r"^none of the checkpoint's 2 tensors is a parameter of preset 'tiny': "
                                              r"not a pi0-family checkpoint .*"
                                              r"\(its keys: decoder.bias, encoder.weight\)$"):
        load_checkpoint(build_model("tiny"), other)
    assert main(["convert", "--from", "lerobot", "--to", "openpi", "--preset", "tiny", str(other),
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "LeRobot checkpoint keys lack the 'model.' prefix: decoder.bias, encoder.weight" in err
    assert "looks like an openpi checkpoint" not in err


def test_a_hub_repo_written_with_a_trailing_slash_is_named(tmp_path, monkeypatch):
    """'lerobot/pi0_libero/' (a shell's completion adds the slash) is a local path, not found: the error says how a
    Hub repo is written; a path that is no repo name gets no such hint."""
    from vlaperf.checkpoints import checkpoint_file

    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"a Hugging Face Hub repo is named 'lerobot/pi0_libero', without the "
                                              r"trailing '/' \(or hf://lerobot/pi0_libero\)\)$"):
        checkpoint_file("lerobot/pi0_libero/")
    with pytest.raises(CheckpointError) as err:
        checkpoint_file("a/b/c/")
    assert "Hugging Face" not in str(err.value)
