"""Checkpoints on the Hugging Face Hub, named as LeRobot's `--policy.path` names them.

`--checkpoint`, `--norm-stats`, `--tokenizer` and `convert`'s IN take a local file or folder, or a model repo on the
Hub:

    lerobot/pi0_libero                          owner/name, where no local path of that name exists
    hf://lerobot/pi0_libero@<revision>          a branch, tag or commit (default: main), or refs/pr/<n>
    hf://lerobot/pi0_libero@feature%2Fx         a branch whose name holds a "/" (feature/x), its "/" written %2F
    hf://owner/name/assets/libero/norm_stats.json   one file or folder inside the repo

A local path always wins. Only the files the option reads are fetched (`WANTED`; LeRobot's policy_preprocessor.json
named as the file, with the statistics' file it names), through huggingface_hub into its
cache, so HF_HOME / HF_HUB_CACHE, HF_TOKEN (gated or private repos) and HF_HUB_OFFLINE=1 (the cache only) apply as
they do for LeRobot. The option then reads the cached file; result files record the repo and the commit it came from
(`origin`).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

PREFIX = "hf://"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # an owner's or a repo's name, as the Hub spells them
BARE_REPO = re.compile(rf"{_NAME}/{_NAME}")
_COMMIT = re.compile(r"[0-9a-f]{40}")

# What each option reads from a repo (or from a folder inside it), and so all that is fetched. A checkpoint repo of
# LeRobot's or of openpi's PyTorch layout holds a model.safetensors; LeRobot keeps its statistics in the
# preprocessor's files, openpi in norm_stats.json; PaliGemma's tokenizer repos name the sentencepiece model
# tokenizer.model.
WANTED = {
    "--checkpoint": ("model.safetensors", "config.json"),  # LeRobot's config: the chunk it was trained with
    "--norm-stats": ("norm_stats.json", "policy_preprocessor*.json", "policy_preprocessor*.safetensors"),
    "--tokenizer": ("tokenizer.model",),
    "IN": ("model.safetensors",),  # convert
}


class HubError(ValueError):
    """A Hub reference that cannot be read: the message names the option, the reference and what to do."""


@dataclass(frozen=True)
class HubRef:
    repo: str  # owner/name
    revision: str | None  # None: the repo's main branch
    path: str | None  # a file or folder inside the repo; None: the repo's root
    explicit: bool  # written with hf://; a bare owner/name is read from the Hub only where no local path exists


def parse(text: str) -> HubRef | None:
    """`text` as a Hub reference, or None where it is not one (then it is a local path, found or not).
    HubError for an hf:// reference that is malformed.

    hf://owner/name[@revision][/path]: the revision is one segment (a branch, tag or commit), or three where it
    starts with "refs/", the Hub's own refs (refs/pr/<n>, a pull request; refs/convert/<format>); what follows it is
    the path inside the repo. A branch whose name holds a "/" is written with it percent-encoded, as
    huggingface_hub's own hf:// paths write it: hf://owner/name@feature%2Fx/path is branch feature/x (huggingface_hub
    keeps its ref in the cache as refs/feature/x, as it keeps refs/pr/1; vlaperf names no folder after a revision)."""
    if text.startswith(PREFIX):
        parts = text[len(PREFIX):].split("/")
        name, at, revision = parts[1].partition("@") if len(parts) >= 2 else ("", "", "")
        rest = parts[2:]
        if revision == "refs":  # the Hub's refs, three segments: split at every "/", refs/pr/1 was "refs", path pr/1
            ref, rest = rest[:2], rest[2:]
            revision = "/".join(["refs", *ref]) if len(ref) == 2 and all(p not in ("", ".", "..") for p in ref) else ""
        else:
            # one segment, its "/" written %2F (a bare "/" would end it: what follows is the path). Decoded, each
            # part must still be a name: ".." would lead the cache's refs/<revision> out of its refs folder
            revision = unquote(revision)
            if revision and any(p in ("", ".", "..") for p in revision.split("/")):
                revision = ""
        inner = [p for p in rest if p]
        if not (re.fullmatch(_NAME, parts[0]) and re.fullmatch(_NAME, name)) or (at and not revision) \
                or any(p in (".", "..") for p in inner):
            raise HubError(f"{text!r}: expected hf://owner/name, hf://owner/name@revision or hf://owner/name/path "
                           "inside the repo (a revision is one segment, a \"/\" in it written %2F, or refs/pr/<n>)")
        return HubRef(f"{parts[0]}/{name}", revision or None, "/".join(inner) or None, explicit=True)
    if BARE_REPO.fullmatch(text) and ".." not in text:
        return HubRef(text, None, None, explicit=False)
    return None


def written_revision(revision: str) -> str:
    """`revision` as an hf:// reference writes it, which parse reads back as the same revision (a log line can be
    pasted back): the Hub's refs/<kind>/<name> as they are, any other "/" (branch feature/x) as %2F, and a "%" as %25,
    since parse decodes it."""
    if len(revision.split("/")) == 3 and revision.startswith("refs/"):
        return revision
    return revision.replace("%", "%25").replace("/", "%2F")


def resolve(text: str | None, option: str) -> str | None:
    """The local path `option` should read for `text`: `text` itself where it is a local path (found or not, so
    that the option's own error names it), else the Hub file or folder fetched into the cache. HubError says why a
    reference could not be fetched."""
    if not is_reference(text):
        return text
    try:
        ref = parse(text)
    except HubError as e:
        raise HubError(f"{option} {e}") from None
    try:
        import huggingface_hub  # noqa: F401  (optional: vlaperf[hub])
    except ImportError:
        where = "" if ref.explicit else "no such file or folder here, and "
        raise HubError(f"{option} {text}: {where}reading a Hugging Face Hub repo needs huggingface_hub "
                       "(pip install 'vlaperf[hub]')") from None
    return str(fetch(ref, option, text))


def fetch(ref: HubRef, option: str, text: str) -> Path:
    """Fetch what `option` reads of `ref` into the Hub's cache; the local file or folder."""
    wanted = WANTED[option]
    print(f"vlaperf: {option} {text}: {', '.join(wanted) if ref.path is None else ref.path} from the Hugging Face "
          f"Hub repo {ref.repo}{'@' + written_revision(ref.revision) if ref.revision else ''} (files in its cache "
          "are reused)",
          file=sys.stderr, flush=True)
    try:
        local = _download(ref, option, text)
    except HubError:
        raise
    except Exception as e:  # huggingface_hub's errors: not found, gated, offline and not cached, HTTP
        local = _from_cache(ref, option, text) if _unreachable(e) else None
        if local is None:
            raise HubError(f"{option} {text}: {explain(e, ref)}") from None
    where = origin(local)
    print(f"vlaperf: {option} {text}: {local}" + (f" (commit {where['revision'][:12]})" if where else ""),
          file=sys.stderr, flush=True)
    return local


def _download(ref: HubRef, option: str, text: str, local_files_only: bool = False) -> Path:
    from huggingface_hub import hf_hub_download, snapshot_download

    wanted = WANTED[option]
    if ref.path is not None and PurePosixPath(ref.path).suffix != "":  # one file
        local = Path(hf_hub_download(ref.repo, ref.path, revision=ref.revision, local_files_only=local_files_only))
        if option == "--norm-stats":
            _download_named_statistics(ref, local, option, text, local_files_only)
        if option == "--checkpoint":
            _download_config_beside(ref, local, local_files_only)
        return local
    if option == "--tokenizer" and ref.path is None:  # one file, which the repo must have
        return Path(hf_hub_download(ref.repo, wanted[0], revision=ref.revision, local_files_only=local_files_only))
    patterns = [p if ref.path is None else f"{ref.path}/{p}" for p in wanted]
    folder = Path(snapshot_download(ref.repo, revision=ref.revision, allow_patterns=patterns,
                                    local_files_only=local_files_only))
    local = folder / ref.path if ref.path else folder
    need = wanted[:1] if option in ("--checkpoint", "IN") else wanted  # the weights; else any of them
    if not any(next(local.glob(pattern), None) for pattern in need):
        commit = (origin(folder) or {}).get("revision", "")[:12]
        raise HubError(f"{option} {text}: the repo {ref.repo}{' (' + commit + ')' if commit else ''} has "
                       f"{'no' if len(need) == 1 else 'none of'} {', '.join(need)}"
                       f"{' in ' + ref.path if ref.path else ''}")
    # a tokenizer is one file: a folder inside the repo gives the file in it (the folder went to the tokenizer)
    return local / wanted[0] if option == "--tokenizer" else local


def _download_config_beside(ref: HubRef, weights: Path, local_files_only: bool) -> None:
    """LeRobot's config.json beside a model.safetensors named as the file (`hf://owner/name/model.safetensors`),
    from the same commit, where the repo has one: the chunk the checkpoint was trained with is there, and the repo
    form fetched it while the file form did not. An openpi repo has none: nothing to fetch then."""
    from huggingface_hub import hf_hub_download

    folder = PurePosixPath(ref.path).parent
    name = "config.json" if str(folder) == "." else f"{folder}/config.json"
    revision = (origin(weights) or {}).get("revision") or ref.revision
    try:
        hf_hub_download(ref.repo, name, revision=revision, local_files_only=local_files_only)
    except Exception:  # noqa: BLE001 - absent (openpi's layout), or not cached offline: the weights alone, as asked
        pass


def _download_named_statistics(ref: HubRef, local: Path, option: str, text: str, local_files_only: bool) -> None:
    """LeRobot's policy_preprocessor*.json, given as the file, names the statistics' file that
    vlaperf.normalize reads beside it: fetched too, from the same commit (else the cache holds the JSON alone and
    the statistics are "not readable"). Anything else is left as it is, for normalize's own error."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub import utils as errors

    if local.suffix != ".json":
        return
    try:
        doc = json.loads(local.read_text())
    except (OSError, ValueError):
        return
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list):
        return
    from vlaperf.normalize import NORMALIZER_STEP, statistics_file_name

    folder = PurePosixPath(ref.path).parent
    revision = (origin(local) or {}).get("revision") or ref.revision
    for step in steps:
        if isinstance(step, dict) and step.get("registry_name") == NORMALIZER_STEP \
                and (file_name := statistics_file_name(step)) is not None:
            name = str(folder / file_name)  # where normalize reads it: beside the JSON
            try:
                hf_hub_download(ref.repo, name, revision=revision, local_files_only=local_files_only)
            except errors.EntryNotFoundError as e:
                if isinstance(e, errors.LocalEntryNotFoundError):  # not cached and the Hub not asked: fetch's to say
                    raise
                raise HubError(f"{option} {text}: {ref.path} names its statistics {name!r}, which the repo {ref.repo} "
                               "does not have") from None


def _from_cache(ref: HubRef, option: str, text: str) -> Path | None:
    """What the cache holds, asked for without the Hub (some huggingface_hub versions ask the Hub for a pinned
    commit's file list even where the cache has the commit); None where it holds nothing."""
    try:
        return _download(ref, option, text, local_files_only=True)
    except HubError:
        raise
    except Exception:
        return None


def _unreachable(e: Exception) -> bool:
    """The Hub not asked (HF_HUB_OFFLINE) or not reached, rather than an answer from it."""
    from huggingface_hub import utils as errors

    return isinstance(e, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError, ConnectionError, TimeoutError))


def explain(e: Exception, ref: HubRef) -> str:
    """One line for a failed fetch, with what the user can do about it."""
    from huggingface_hub import constants
    from huggingface_hub import utils as errors  # (where huggingface_hub 0.24 to 2.x all export these)

    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    # owner/name without hf://: read from the Hub only because no local path of that name exists (a mistyped
    # `ckpt/model.safetensors` is such a name), which the message says wherever the Hub could not answer for it
    no_local = "" if ref.explicit else f"; no local path {ref.repo!r} exists either"
    if isinstance(e, errors.GatedRepoError):
        return (f"the repo {ref.repo} is gated: accept its terms on huggingface.co, then log in (`hf auth login` or "
                "HF_TOKEN)")
    if isinstance(e, errors.RepositoryNotFoundError):
        return (f"no model repo {ref.repo} on the Hugging Face Hub (or it is private: log in with `hf auth login` or "
                "HF_TOKEN)" + no_local)
    if isinstance(e, errors.RevisionNotFoundError):
        return f"the repo {ref.repo} has no revision {ref.revision!r}"
    if isinstance(e, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)):  # not cached; offline or unreached
        offline = constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE
        if offline:
            return f"HF_HUB_OFFLINE is set and the Hub's cache ({constants.HF_HUB_CACHE}) does not hold it{no_local}"
        return (f"the Hub could not be reached ({first}) and its cache ({constants.HF_HUB_CACHE}) does not hold "
                f"it{no_local}")
    if isinstance(e, errors.EntryNotFoundError):
        return f"the repo {ref.repo} has no file {ref.path or WANTED['--tokenizer'][0]!r}"
    return f"{type(e).__name__}: {first}"


def origin(path: str | Path) -> dict | None:
    """{"repo", "revision"} where `path` lies in the Hub's cache (.../models--owner--name/snapshots/<commit>/...),
    else None: what a result file records of a checkpoint fetched from the Hub."""
    parts = Path(path).parts
    for i in range(len(parts) - 2):
        if parts[i].startswith("models--") and parts[i + 1] == "snapshots" and _COMMIT.fullmatch(parts[i + 2]):
            owner_name = parts[i][len("models--"):].split("--", 1)
            if len(owner_name) == 2:
                return {"repo": "/".join(owner_name), "revision": parts[i + 2]}
    return None


# the parsed command line's attributes that may name a Hub repo, and their options
PATH_OPTIONS = (("checkpoint", "--checkpoint"), ("norm_stats", "--norm-stats"), ("tokenizer", "--tokenizer"),
                ("src", "IN"))


def is_reference(text) -> bool:
    """Whether an option's value would be read from the Hub: a string that is no local path and parses as a repo (a
    malformed hf:// one too: resolve names what is wrong with it)."""
    if not isinstance(text, str) or Path(text).exists():
        return False
    try:
        return parse(text) is not None
    except HubError:
        return True


def resolve_args(args) -> None:
    """The path options of a parsed command line, Hub references replaced by the fetched local paths (in place)."""
    for attr, option in PATH_OPTIONS:
        value = getattr(args, attr, None)
        if isinstance(value, str):
            setattr(args, attr, resolve(value, option))
