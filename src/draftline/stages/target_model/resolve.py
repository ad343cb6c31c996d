"""From the config alone, which target this is and where its folder is (resolve_target): cheap and
import-light, so the Snakefile calls it at parse time."""

from __future__ import annotations

import re
from pathlib import Path

from draftline.stages.target_model.checks import check_target_folder
from draftline.stages.target_model.hub import resolve_hub
from draftline.stages.target_model.spec import EMBEDDED, EMBEDDED_NAME, TARGET_ROOT, TargetError, TargetSpec

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_target(
    model_setting: str,
    name: str | None = None,
    chat_template: str | None = None,
    repo_root: str | Path = ".",
    revision: str | None = None,
) -> TargetSpec:
    """Decide, from the config alone, which kind of target this is and where its folder is.

    A local folder or cached hub snapshot is checked here (file names only, no heavy imports)
    so a broken folder fails at parse time rather than in the first job that loads it. Only a
    hub id that is neither cached nor downloaded yet asks the Hub (one call) for its commit.
    """
    root = Path(repo_root)
    setting = str(model_setting).strip()
    if name is not None and not _NAME.match(name):
        raise TargetError(
            f"target.name {name!r}: use letters, digits, '.', '_' or '-' only (it names a folder "
            f"under {TARGET_ROOT}/)"
        )
    if chat_template is not None and not (root / chat_template).is_file():
        raise TargetError(
            f"target.chat_template {chat_template!r}: no such file (looked at "
            f"{(root / chat_template).resolve()}); give a path to a Jinja chat template"
        )

    if setting == EMBEDDED:
        _refuse_revision(revision, setting)
        name = name or EMBEDDED_NAME
        return TargetSpec("embedded", name, TARGET_ROOT / name, EMBEDDED, True, chat_template)

    local = Path(setting).expanduser()
    local_abs = local if local.is_absolute() else root / local
    if local_abs.is_dir():
        _refuse_revision(revision, setting)
        check_target_folder(local_abs, has_template_override=chat_template is not None)
        if chat_template is None:
            return TargetSpec("local", name or local_abs.resolve().name, local, setting, False)
        name = name or local_abs.resolve().name
        view = TARGET_ROOT / name
        if (root / view).resolve() == local_abs.resolve():
            raise TargetError(
                f"target.model {setting!r} is itself {view}/, where the chat-template view would "
                "be written; set target.name to another folder name"
            )
        return TargetSpec("local", name, view, str(local_abs), True, chat_template)

    explicit_path = setting.startswith(("/", "./", "../", "~")) or local_abs.exists()
    if not explicit_path and _HUB_ID.match(setting):
        return resolve_hub(setting, revision, name or setting.split("/")[1], chat_template, root)
    raise TargetError(
        f"target.model {setting!r}: not 'embedded', not a folder (looked at {local_abs.resolve()}) "
        "and not a hub id like 'org/name'; set it to 'embedded', to a local Hugging Face model "
        "folder, or to a hub id"
    )


def _refuse_revision(revision: str | None, setting: str) -> None:
    if revision is not None:
        raise TargetError(
            f"target.revision {revision!r} is set, but target.model {setting!r} is not a hub id; "
            "a revision picks a commit of a hub model: remove target.revision"
        )
