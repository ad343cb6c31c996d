"""A hub id: the local Hugging Face cache first, the Hub only when needed (its commit, one call),
and its download into the target folder (download_hub)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from draftline.runtime.atomic import atomic_dir
from draftline.stages.target_model.checks import check_target_folder, verify_target
from draftline.stages.target_model.folder import write_chat_template, write_provenance
from draftline.stages.target_model.spec import PROVENANCE_FILE, TARGET_ROOT, TargetError, TargetSpec

log = logging.getLogger(__name__)

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolve_hub(repo_id: str, revision: str | None, name: str, chat_template: str | None,
                 root: Path) -> TargetSpec:
    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is not None:
        _check_snapshot(snapshot, repo_id, revision, has_template_override=chat_template is not None)
        # Used in place (it may be hundreds of GB); only a template override needs a view.
        folder, needs_rule = (snapshot, False) if chat_template is None else (TARGET_ROOT / name, True)
        return TargetSpec("hub", name, folder, repo_id, needs_rule, chat_template, revision,
                          snapshot.name, snapshot)
    # Not cached: the target rule downloads it, pinned to the commit resolved now, so the
    # identity planned here is the content the rule fetches.
    commit = _downloaded_commit(root / TARGET_ROOT / name, repo_id, revision) or _hub_commit(repo_id, revision)
    return TargetSpec("hub", name, TARGET_ROOT / name, repo_id, True, chat_template, revision, commit)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _download_hint(repo_id: str, revision: str | None) -> str:
    return (
        f"download it on a machine with network (`hf download {repo_id} --revision "
        f"{revision or 'main'}`, with HF_HUB_CACHE pointing at the cache this run reads), or set "
        "HF_HUB_CACHE (or HF_HOME) to a cache that holds it"
    )


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of `repo_id` at `revision` in the local hub cache, without network;
    None when the cache does not have it. Its folder name is the commit."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache_dir(),
                                      local_files_only=True))
    except IncompleteSnapshotError as err:
        raise TargetError(
            f"target.model {repo_id!r} (revision {revision or 'main'}): the cached snapshot "
            f"{err.snapshot_path} is incomplete ({err}); {_download_hint(repo_id, revision)}"
        ) from err
    except LocalEntryNotFoundError:
        return None


def _cache_contents(repo_id: str) -> str:
    """What the cache holds for `repo_id`, for error messages."""
    from huggingface_hub.file_download import repo_folder_name

    storage = hub_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")
    if not storage.is_dir():
        return f"{storage} does not exist"
    refs = sorted(p.relative_to(storage / "refs").as_posix() for p in (storage / "refs").rglob("*") if p.is_file())
    snapshots = sorted(p.name for p in (storage / "snapshots").glob("*"))
    return f"{storage} holds refs {refs or 'none'} and snapshots {snapshots or 'none'}"


def _check_snapshot(snapshot: Path, repo_id: str, revision: str | None, *, has_template_override: bool) -> None:
    weights = [p for p in [*snapshot.glob("*.safetensors"), *snapshot.glob("pytorch_model*.bin")] if p.is_file()]
    if not weights:
        present = sorted(p.name for p in snapshot.iterdir())
        raise TargetError(
            f"target.model {repo_id!r} (revision {revision or 'main'}): the cached snapshot {snapshot} "
            f"has no weights, only {present} (something fetched just the config or tokenizer); "
            f"{_download_hint(repo_id, revision)}"
        )
    check_target_folder(snapshot, has_template_override=has_template_override)


def _downloaded_commit(folder: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit an earlier download of the same id and revision recorded, if there is one."""
    try:
        record = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    same = (record.get("kind"), record.get("source"), record.get("revision")) == ("hub", repo_id, revision)
    return record.get("commit") if same else None


def _hub_commit(repo_id: str, revision: str | None) -> str:
    """The commit `revision` names on the Hub (one API call), for a model not cached locally."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    where = f"target.model {repo_id!r} (revision {revision or 'main'})"
    missing = f"not in the local Hugging Face cache ({_cache_contents(repo_id)})"
    if constants.is_offline_mode():
        raise TargetError(
            f"{where}: {missing}, and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
            f"{_download_hint(repo_id, revision)}"
        )
    if revision is not None and _COMMIT.match(revision):
        return revision
    try:
        return HfApi().model_info(repo_id, revision=revision, timeout=10).sha
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:  # includes gated repos
        raise TargetError(
            f"{where}: {missing}, and the Hub says: {type(err).__name__}: {err}. Check the id and "
            "target.revision, and HF_TOKEN for a gated or private model"
        ) from err
    except Exception as err:  # connection errors have many types; all mean: no Hub here
        raise TargetError(
            f"{where}: {missing}, and the Hub cannot be reached ({type(err).__name__}: {err}); "
            f"{_download_hint(repo_id, revision)}"
        ) from err


def download_hub(repo_id: str, out_dir: str | Path, chat_template: str | Path | None = None,
                 trust_remote_code: bool = False, commit: str | None = None,
                 revision: str | None = None) -> Path:
    """Download a hub model at `commit` (needs network and, for gated models, HF_TOKEN).

    The record (draftline_target.json) keeps the revision asked for and the commit fetched,
    so a later plan knows the commit without asking the Hub."""
    from huggingface_hub import HfApi, snapshot_download

    ignore = ["original/*", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.pth"]
    if not trust_remote_code:
        ignore.append("*.py")
    with atomic_dir(out_dir) as staging:
        try:
            commit = commit or HfApi().model_info(repo_id, revision=revision).sha
            snapshot_download(repo_id, revision=commit, local_dir=staging, ignore_patterns=ignore)
        except Exception as err:
            raise TargetError(
                f"target.model {repo_id!r} (revision {revision or 'main'}): not in the local Hugging "
                f"Face cache, and downloading it from the hub failed ({type(err).__name__}: {err}). "
                "Check the network/HF_TOKEN, or download it yourself and set target.model to the folder"
            ) from err
        if chat_template is not None:
            write_chat_template(staging, Path(chat_template).read_text())
        summary = verify_target(staging, trust_remote_code)
        write_provenance(staging, chat_template, summary, kind="hub", source=repo_id,
                          revision=revision, commit=commit)
    log.info("downloaded %s at %s to %s: %s", repo_id, commit, out_dir, summary)
    return Path(out_dir)
