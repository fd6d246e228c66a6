"""Hub references for --checkpoint, --norm-stats, --tokenizer and convert's IN (vlaperf.hub).

No network here: the end-to-end tests lay out a repo in the Hub's cache format (models--owner--name/refs/main and
snapshots/<commit>/) and run vlaperf in a subprocess with HF_HUB_OFFLINE=1, so huggingface_hub reads that cache.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlaperf.hub import HubError, HubRef, origin, parse, resolve, written_revision

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_parse_reads_repo_ids_and_leaves_paths_alone():
    assert parse("lerobot/pi0_libero") == HubRef("lerobot/pi0_libero", None, None, explicit=False)
    assert parse("hf://lerobot/pi0_libero") == HubRef("lerobot/pi0_libero", None, None, explicit=True)
    assert parse("hf://o/n@v1.0/assets/libero/norm_stats.json") == \
        HubRef("o/n", "v1.0", "assets/libero/norm_stats.json", explicit=True)
    assert parse(f"hf://o/n@{COMMIT}") == HubRef("o/n", COMMIT, None, explicit=True)
    # local paths, found or not: the option's own error names them
    for path in ("model.safetensors", "./o/n", "/abs/o", "a/b/c", "../o", "o/..", "ckpt/", "-o/n"):
        assert parse(path) is None, path
    for bad in ("hf://", "hf://lerobot", "hf://lerobot/", "hf://o/n@", "hf://o/n/../x", "hf://o/n o"):
        with pytest.raises(HubError, match="expected hf://owner/name, hf://owner/name@revision"):
            parse(bad)


def test_a_revision_of_the_hubs_refs_takes_three_segments():
    """refs/pr/<n> (a pull request) and refs/convert/<format> are Hub revisions: split at every "/", hf://o/n@refs/pr/1
    was revision "refs" and path "pr/1". Such a revision is three segments, and what follows is the path."""
    assert parse("hf://o/n@refs/pr/1") == HubRef("o/n", "refs/pr/1", None, explicit=True)
    assert parse("hf://o/n@refs/pr/12/assets/libero/norm_stats.json") == \
        HubRef("o/n", "refs/pr/12", "assets/libero/norm_stats.json", explicit=True)
    assert parse("hf://o/n@refs/convert/parquet/") == HubRef("o/n", "refs/convert/parquet", None, explicit=True)
    assert parse("hf://o/n@v1.0/refs/pr/1") == HubRef("o/n", "v1.0", "refs/pr/1", explicit=True)  # a path, after one
    for bad in ("hf://o/n@refs", "hf://o/n@refs/", "hf://o/n@refs/pr", "hf://o/n@refs/pr/", "hf://o/n@refs//1",
                "hf://o/n@refs/pr/..", "hf://o/n@refs/../x"):
        with pytest.raises(HubError, match=r"expected hf://owner/name, .*\(a revision is one segment, a \"/\" in it "
                                           r"written %2F, or refs/pr/<n>\)"):
            parse(bad)


def test_a_branch_whose_name_holds_a_slash_is_written_percent_encoded():
    """A branch "feature/x" could not be named: hf://o/n@feature/x is branch "feature" and path "x". Its "/" is
    written %2F, as huggingface_hub's own hf:// paths write it (and a Hub ref so quoted reads the same); decoded, a
    revision is still refused where a part of it is empty, "." or "..", which would lead out of the cache's refs."""
    assert parse("hf://o/n@feature%2Fx") == HubRef("o/n", "feature/x", None, explicit=True)
    assert parse("hf://o/n@feature%2fx%2Fy/assets/norm_stats.json") == \
        HubRef("o/n", "feature/x/y", "assets/norm_stats.json", explicit=True)
    assert parse("hf://o/n@refs%2Fpr%2F3/a.json") == HubRef("o/n", "refs/pr/3", "a.json", explicit=True)
    assert parse("hf://o/n@feature/x") == HubRef("o/n", "feature", "x", explicit=True)  # unencoded: a path, as before
    for bad in ("hf://o/n@%2F", "hf://o/n@feature%2F", "hf://o/n@%2Fx", "hf://o/n@a%2F%2Fb", "hf://o/n@..",
                "hf://o/n@.", "hf://o/n@..%2F..%2Fx", "hf://o/n@a%2F..%2F..", "hf://o/n@%2E%2E"):
        with pytest.raises(HubError, match=r"a \"/\" in it written %2F"):
            parse(bad)


def test_a_revision_is_written_as_a_reference_writes_it():
    """The fetch log's revision reads back as the same one: a branch's "/" as %2F (and "%" as %25, which parse
    decodes), the Hub's refs/pr/<n> as it is."""
    for revision, written in (("feature/x", "feature%2Fx"), ("refs/pr/1", "refs/pr/1"), ("v1.0", "v1.0"),
                              ("50%off/a", "50%25off%2Fa"), ("refs/a/b/c", "refs%2Fa%2Fb%2Fc"), (COMMIT, COMMIT)):
        assert written_revision(revision) == written
        assert parse(f"hf://o/n@{written}/path") == HubRef("o/n", revision, "path", explicit=True)


def test_a_local_path_wins_over_a_repo_of_that_name(tmp_path, monkeypatch):
    (tmp_path / "lerobot" / "pi0_libero").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # nothing may be fetched
    assert resolve("lerobot/pi0_libero", "--checkpoint") == "lerobot/pi0_libero"
    assert resolve("missing/model.safetensors.d/x", "--checkpoint") == "missing/model.safetensors.d/x"
    assert resolve(None, "--checkpoint") is None


def test_without_huggingface_hub_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(HubError) as e:
        resolve("lerobot/pi0_libero", "--checkpoint")
    assert str(e.value) == ("--checkpoint lerobot/pi0_libero: no such file or folder here, and reading a Hugging Face "
                            "Hub repo needs huggingface_hub (pip install 'vlaperf[hub]')")
    with pytest.raises(HubError, match=r"^--norm-stats hf://o/n: reading a Hugging Face Hub repo needs"):
        resolve("hf://o/n", "--norm-stats")
    with pytest.raises(HubError, match=r"^--tokenizer 'hf://o': expected hf://owner/name"):
        resolve("hf://o", "--tokenizer")


def test_origin_reads_the_repo_and_commit_of_a_cached_file(tmp_path):
    cached = tmp_path / "hub" / "models--lerobot--pi0_libero" / "snapshots" / COMMIT / "model.safetensors"
    assert origin(cached) == {"repo": "lerobot/pi0_libero", "revision": COMMIT}
    assert origin(cached.parent) == {"repo": "lerobot/pi0_libero", "revision": COMMIT}
    assert origin(tmp_path / "model.safetensors") is None
    assert origin(tmp_path / "models--x--y" / "snapshots" / "main" / "model.safetensors") is None  # not a commit


def test_serving_a_hub_checkpoint_without_statistics_names_the_repo(tmp_path, capsys):
    from vlaperf.serve.commands import warn_unconverted_checkpoint

    folder = tmp_path / "models--lerobot--pi0_libero" / "snapshots" / COMMIT
    folder.mkdir(parents=True)
    warn_unconverted_checkpoint(str(folder / "model.safetensors"), object(), None, "openpi:pi0_libero")
    assert "a LeRobot repo keeps them beside its weights: --norm-stats lerobot/pi0_libero" in capsys.readouterr().err


# ---------------------------------------------------------------------------- through huggingface_hub, offline


def _cached_repo(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """`repo` at COMMIT in the Hub's cache layout, its main branch pointing there; the snapshot folder."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(data)
    return snapshot


def _offline_env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def lerobot_repo(tmp_path):
    """A tiny LeRobot checkpoint repo in a Hub cache: weights, the preprocessor's statistics, a tokenizer file."""
    pytest.importorskip("huggingface_hub")
    from vlaperf.checkpoints import save_checkpoint
    from vlaperf.models.pi0 import build_model

    cache = tmp_path / "cache"
    weights = tmp_path / "w"
    save_checkpoint(build_model("tiny", seed=3), weights, layout="lerobot")
    snapshot = _cached_repo(cache, "acme/pi0_tiny", {
        "model.safetensors": (weights / "model.safetensors").read_bytes(),
        "config.json": json.dumps({"type": "pi0", "chunk_size": 5}).encode(),  # LeRobot's: the chunk trained with
        "tokenizer.model": b"not parsed here",
        "assets/libero/norm_stats.json": json.dumps({"norm_stats": {"state": {"mean": [0.0] * 8, "std": [1.0] * 8}}})
        .encode()})
    return cache, snapshot


def test_each_option_resolves_to_the_cached_file(lerobot_repo):
    cache, snapshot = lerobot_repo
    script = ("import json, vlaperf.hub as h; print(json.dumps([h.resolve(t, o) for t, o in ["
              "('acme/pi0_tiny', '--checkpoint'), ('hf://acme/pi0_tiny@" + COMMIT + "', '--checkpoint'), "
              "('acme/pi0_tiny', '--tokenizer'), ('hf://acme/pi0_tiny/assets/libero', '--norm-stats'), "
              "('hf://acme/pi0_tiny/assets/libero/norm_stats.json', '--norm-stats')]]))")
    run = subprocess.run([sys.executable, "-c", script], env=_offline_env(cache), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [str(snapshot), str(snapshot), str(snapshot / "tokenizer.model"),
                                      str(snapshot / "assets" / "libero"),
                                      str(snapshot / "assets" / "libero" / "norm_stats.json")]
    assert f"vlaperf: --checkpoint acme/pi0_tiny: {snapshot} (commit {COMMIT[:12]})" in run.stderr
    # what the option reads is missing: said, not a folder handed on without it (the statistics are under assets/
    # here, and a repo of a config alone has no weights)
    _cached_repo(cache, "acme/config_only", {"config.json": b"{}"})
    for ref, option, said in (
            ("acme/pi0_tiny", "--norm-stats", f"the repo acme/pi0_tiny ({COMMIT[:12]}) has none of norm_stats.json, "
                                              "policy_preprocessor*.json, policy_preprocessor*.safetensors"),
            ("acme/config_only", "--checkpoint",
             f"the repo acme/config_only ({COMMIT[:12]}) has no model.safetensors")):
        run = subprocess.run([sys.executable, "-c", f"import vlaperf.hub as h; h.resolve({ref!r}, {option!r})"],
                             env=_offline_env(cache), capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and f"HubError: {option} {ref}: {said}" in run.stderr, run.stderr


def test_a_pull_requests_revision_reads_its_commit(lerobot_repo):
    """hf://owner/name@refs/pr/1/path: the pull request's commit (the cache's refs/refs/pr/1), the path inside it."""
    cache, _ = lerobot_repo
    pr_commit = "f" * 40
    root = cache / "models--acme--pi0_tiny"
    (root / "refs" / "refs" / "pr").mkdir(parents=True)
    (root / "refs" / "refs" / "pr" / "1").write_text(pr_commit)
    stats = root / "snapshots" / pr_commit / "assets" / "libero" / "norm_stats.json"
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    script = "import vlaperf.hub as h; print(h.resolve('hf://acme/pi0_tiny@refs/pr/1/assets/libero/norm_stats.json', " \
             "'--norm-stats'))"
    run = subprocess.run([sys.executable, "-c", script], env=_offline_env(cache), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(stats)


def test_a_branch_whose_name_holds_a_slash_reads_its_commit(lerobot_repo):
    """hf://owner/name@feature%2Fx: branch feature/x, whose ref huggingface_hub keeps in the cache as refs/feature/x
    (as refs/pr/1 above); a file and a folder of that commit, each through its own download call."""
    cache, _ = lerobot_repo
    branch_commit = "e" * 40
    root = cache / "models--acme--pi0_tiny"
    (root / "refs" / "feature").mkdir(parents=True)
    (root / "refs" / "feature" / "x").write_text(branch_commit)
    stats = root / "snapshots" / branch_commit / "assets" / "libero" / "norm_stats.json"
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    script = ("import json, vlaperf.hub as h; print(json.dumps([h.resolve(t, '--norm-stats') for t in ["
              "'hf://acme/pi0_tiny@feature%2Fx/assets/libero/norm_stats.json', 'hf://acme/pi0_tiny@feature%2Fx/assets/"
              "libero']]))")
    run = subprocess.run([sys.executable, "-c", script], env=_offline_env(cache), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [str(stats), str(stats.parent)]
    # as the reference writes it (feature/x would be branch "feature" and path "x")
    assert "from the Hugging Face Hub repo acme/pi0_tiny@feature%2Fx (files" in run.stderr


def test_bench_and_convert_read_a_hub_checkpoint(lerobot_repo, tmp_path):
    """The CLI end to end: the weights and LeRobot's config come from the cached repo, and the result file records
    its repo and commit; a repo the cache lacks is exit 2 with the option, the reference and the reason."""
    cache, snapshot = lerobot_repo
    env = _offline_env(cache)
    cli = [sys.executable, "-m", "vlaperf.cli"]
    out = tmp_path / "bench.json"
    bench = [*cli, "bench", "--workload", "tiny", "--checkpoint", "acme/pi0_tiny", "--iters", "2", "--warmup", "0",
             "--no-progress", "--json", str(out)]
    run = subprocess.run(bench, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["variant"]["checkpoint"] == {
        "path": str(snapshot / "model.safetensors"), "layout": "lerobot",
        "hub": {"repo": "acme/pi0_tiny", "revision": COMMIT}}
    assert result["workload"]["overrides"] == {"horizon": 5}  # the repo's config.json came with the weights
    run = subprocess.run([*cli, "convert", "--from", "lerobot", "--to", "openpi", "--preset", "tiny",
                          "hf://acme/pi0_tiny", str(tmp_path / "openpi")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"converted {snapshot / 'model.safetensors'} (lerobot" in run.stdout
    assert (tmp_path / "openpi" / "model.safetensors").is_file()
    run = subprocess.run([*cli, "bench", "--workload", "tiny", "--checkpoint", "acme/other", "--iters", "1"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    # a bare owner/name is read from the Hub because no local path has that name: a mistyped local path reads so too
    assert (f"vlaperf bench: error: --checkpoint acme/other: HF_HUB_OFFLINE is set and the Hub's cache ({cache}) "
            "does not hold it; no local path 'acme/other' exists either") in run.stderr


def test_a_lerobot_pipeline_given_as_the_file_brings_the_statistics_it_names(tmp_path, monkeypatch):
    """--norm-stats hf://owner/name/[folder/]policy_preprocessor.json fetched that JSON alone, so the statistics'
    file it names (which normalize reads beside it) was missing from the cache: "not a readable safetensors file".
    It is fetched too, from the same commit. The Hub here is a stand-in for hf_hub_download that writes into a
    cache snapshot only the files it is asked for."""
    hub = pytest.importorskip("huggingface_hub")
    import numpy as np
    from safetensors.numpy import save_file

    from vlaperf.normalize import NormStats

    stats = tmp_path / "stats.safetensors"
    save_file({f"{feature}.{stat}": np.full(n, value, np.float32) for feature, n in (("observation.state", 8),
                                                                                      ("action", 7))
               for stat, value in (("mean", 0.5), ("std", 2.0))}, str(stats))
    state_file = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    pipeline = json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "normalizer_processor", "state_file": state_file,
         "config": {"norm_map": {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"}}}]}).encode()
    remote = {"policy_preprocessor.json": pipeline, state_file: stats.read_bytes(),
              "sub/policy_preprocessor.json": pipeline, f"sub/{state_file}": stats.read_bytes()}
    snapshot = tmp_path / "hub" / "models--acme--pi0_tiny" / "snapshots" / COMMIT
    asked = []

    def download(repo, filename, revision=None, local_files_only=False):
        asked.append((repo, filename, revision))
        (snapshot / filename).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / filename).write_bytes(remote[filename])
        return str(snapshot / filename)

    monkeypatch.setattr(hub, "hf_hub_download", download)
    for folder in ("", "sub/"):
        path = resolve(f"hf://acme/pi0_tiny/{folder}policy_preprocessor.json", "--norm-stats")
        assert path == str(snapshot / folder / "policy_preprocessor.json")
        assert asked[-1] == ("acme/pi0_tiny", f"{folder}{state_file}", COMMIT)  # the commit the JSON came from
        ns = NormStats.load(path, quantile=False)
        assert ns.source == f"{snapshot / folder / state_file} (policy_preprocessor.json)"
        np.testing.assert_array_equal(ns.state.mean, np.full(8, 0.5, np.float32))
    del remote[f"sub/{state_file}"]  # a repo without the file its pipeline names: said, naming both

    def not_found(*args, **kwargs):
        try:
            return download(*args, **kwargs)
        except KeyError:
            e = hub.utils.EntryNotFoundError.__new__(hub.utils.EntryNotFoundError)
            Exception.__init__(e, "404")
            raise e from None

    monkeypatch.setattr(hub, "hf_hub_download", not_found)
    with pytest.raises(HubError, match=rf"^--norm-stats hf://acme/pi0_tiny/sub/policy_preprocessor.json: "
                                       rf"sub/policy_preprocessor.json names its statistics 'sub/{state_file}', "
                                       "which the repo acme/pi0_tiny does not have$"):
        resolve("hf://acme/pi0_tiny/sub/policy_preprocessor.json", "--norm-stats")


def test_each_hub_failure_says_what_to_do():
    """huggingface_hub's errors, one line each (built without a response: no network here)."""
    errors = pytest.importorskip("huggingface_hub.utils")
    from vlaperf.hub import explain

    def error(cls):
        e = cls.__new__(cls)
        Exception.__init__(e, "from the Hub")
        return e

    bare, pinned = HubRef("o/n", None, None, explicit=False), HubRef("o/n", "v9", None, explicit=True)
    assert explain(error(errors.GatedRepoError), bare) == (
        "the repo o/n is gated: accept its terms on huggingface.co, then log in (`hf auth login` or HF_TOKEN)")
    assert explain(error(errors.RepositoryNotFoundError), bare).endswith("HF_TOKEN); no local path 'o/n' exists either")
    assert explain(error(errors.RepositoryNotFoundError), pinned) == (
        "no model repo o/n on the Hugging Face Hub (or it is private: log in with `hf auth login` or HF_TOKEN)")
    assert explain(error(errors.RevisionNotFoundError), pinned) == "the repo o/n has no revision 'v9'"
    assert explain(RuntimeError("first line\nsecond"), bare) == "RuntimeError: first line"


@pytest.mark.parametrize("argv, error", [
    (["bench", "--workload", "libero-pio"], "unknown workload 'libero-pio' (did you mean 'libero-pi0'?)"),
    (["serve", "--workload", "nope"], "unknown workload 'nope'"),
    (["bench", "--workload", "tiny", "--levers", "cuda_graph"], "cuda_graph needs a CUDA device"),
    (["breakdown", "--workload", "tiny", "--levers", "for_loop,nonsense"], "unknown lever 'nonsense'"),
    (["bench", "--workload", "tiny", "--levers", "best;graph"], "'best;graph' holds several variants"),
    (["bench", "--workload", "tiny", "--device", "cuda:7"], "--device cuda"),
])
def test_what_a_command_refuses_anyway_is_refused_before_the_download(argv, error, monkeypatch, capsys):
    """pi0's model.safetensors is 7 GB: a misspelt workload or lever, or a GPU this machine lacks, is named before
    the Hub is asked for anything."""
    import vlaperf.hub as hub
    from vlaperf.cli import main

    if "cuda:7" in argv:
        import torch

        if torch.cuda.device_count() > 7:
            pytest.skip("this machine has a cuda:7")

    def fetch(*args):
        raise AssertionError("fetched before the command's own checks")

    monkeypatch.setattr(hub, "fetch", fetch)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # resolve would say so, not fetch, were it reached
    assert main([*argv, "--checkpoint", "acme/pi0_tiny"]) == 2
    assert error in capsys.readouterr().err


def test_convert_and_compare_refuse_what_they_would_anyway_before_the_download(tmp_path, monkeypatch, capsys):
    """convert to an OUT that exists (without --force), convert of an openpi JAX folder named on the Hub, and compare
    where LeRobot is not importable were each refused only after the Hub's weights came down (7 GB for pi0)."""
    import vlaperf.hub as hub
    from vlaperf.cli import main
    from vlaperf.compare import lerobot

    def fetch(*args):
        raise AssertionError("fetched before the command's own checks")

    monkeypatch.setattr(hub, "fetch", fetch)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"")
    convert = ["convert", "--from", "lerobot", "--to", "openpi", "--preset", "tiny", "acme/pi0_tiny"]
    assert main([*convert, str(out)]) == 2
    assert f"{out} exists: give another output path, or replace it with --force" in capsys.readouterr().err
    assert main(["convert", "--from", "openpi-jax", "--to", "openpi", "--preset", "tiny", "acme/pi05_libero",
                 str(tmp_path / "new")]) == 2
    assert "IN: an openpi JAX checkpoint is a folder (params/ and assets/), which is not fetched" in \
        capsys.readouterr().err

    def missing(pi05):
        raise lerobot.LeRobotUnavailable(lerobot.LEROBOT_MISSING)

    monkeypatch.setattr(lerobot, "import_lerobot", missing)
    assert main(["compare", "--workload", "tiny", "--device", "cpu", "--checkpoint", "acme/pi0_tiny"]) == 2
    assert lerobot.LEROBOT_MISSING in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["bench", "--workload", "tiny", "--levers", "exact"],
    ["serve", "--workload", "tiny"],  # serve's own default, "serve", is no lever list
    ["check", "--workload", "tiny", "--levers", "all"],  # a command of ';' lists checks its levers itself
    ["bench", "--workload", "wam-tiny", "--levers", "best"],  # the world-action levers: its own checks
])
def test_a_command_line_that_passes_the_checks_goes_on_to_the_hub(argv, monkeypatch, capsys):
    import vlaperf.hub as hub
    from vlaperf.cli import main

    def fetch(ref, option, text):
        raise HubError(f"{option} {text}: reached the Hub")

    import types

    monkeypatch.setattr(hub, "fetch", fetch)
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.ModuleType("huggingface_hub"))  # installed or not here
    assert main([*argv, "--checkpoint", "acme/pi0_tiny"]) == 2
    assert "--checkpoint acme/pi0_tiny: reached the Hub" in capsys.readouterr().err


def test_a_checkpoint_named_as_its_file_brings_lerobots_config_beside_it(tmp_path, monkeypatch):
    """--checkpoint hf://owner/name/model.safetensors fetched the weights alone, so the chunk LeRobot's config.json
    says was silently not taken on a fresh cache (the repo form fetched it). It comes along now, from the weights'
    commit; an openpi repo without one gives the weights alone."""
    hub = pytest.importorskip("huggingface_hub")
    snapshot = tmp_path / "hub" / "models--acme--pi0_tiny" / "snapshots" / COMMIT
    remote = {"model.safetensors": b"weights", "config.json": b'{"type": "pi0", "chunk_size": 5}',
              "sub/model.safetensors": b"weights"}
    asked = []

    def download(repo, filename, revision=None, local_files_only=False):
        asked.append((filename, revision))
        if filename not in remote:
            e = hub.utils.EntryNotFoundError.__new__(hub.utils.EntryNotFoundError)
            Exception.__init__(e, "404")
            raise e
        (snapshot / filename).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / filename).write_bytes(remote[filename])
        return str(snapshot / filename)

    monkeypatch.setattr(hub, "hf_hub_download", download)
    assert resolve("hf://acme/pi0_tiny/model.safetensors", "--checkpoint") == str(snapshot / "model.safetensors")
    assert asked == [("model.safetensors", None), ("config.json", COMMIT)] and (snapshot / "config.json").is_file()
    assert resolve("hf://acme/pi0_tiny/sub/model.safetensors", "--checkpoint") == str(snapshot / "sub" /
                                                                                     "model.safetensors")
    assert asked[-1] == ("sub/config.json", COMMIT)  # none there: the weights alone, no error


def test_a_tokenizer_named_by_its_folder_is_the_file_in_it(tmp_path):
    """--tokenizer hf://owner/name/folder fetched folder/tokenizer.model and handed the folder to the tokenizer,
    which said 'no such file'; the repo form gave the file."""
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "cache"
    snapshot = _cached_repo(cache, "acme/tok", {"sub/tokenizer.model": b"not parsed here"})
    script = "import vlaperf.hub as h; print(h.resolve('hf://acme/tok/sub', '--tokenizer'))"
    run = subprocess.run([sys.executable, "-c", script], env=_offline_env(cache), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(snapshot / "sub" / "tokenizer.model")
