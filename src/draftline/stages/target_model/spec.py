"""What a target is: its spec (TargetSpec: kind, name, the folder later stages read, where it
comes from), the error its setting or folder gives (TargetError), and where built targets go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
TARGET_ROOT = Path("resources/target")
PROVENANCE_FILE = "draftline_target.json"


class TargetError(ValueError):
    """The target setting or folder is unusable; the message says what to change."""


@dataclass(frozen=True)
class TargetSpec:
    """Where the target comes from and the folder later stages read.

    `dir` is relative to the repository root (the Snakemake working directory) unless the
    user configured an absolute local path or the target is a snapshot in the Hugging Face
    cache. `needs_rule` is False for a folder used in place (a local folder, a cached hub
    snapshot) unless a chat-template view is needed; otherwise the target rule writes `dir`.
    For a hub id: `revision` is the one asked for (None = main), `commit` the commit it
    resolved to, `snapshot` the cached snapshot folder (None when it must be downloaded).
    """

    kind: Literal["embedded", "local", "hub"]
    name: str
    dir: Path
    source: str
    needs_rule: bool
    chat_template: str | None = None
    revision: str | None = None
    commit: str | None = None
    snapshot: Path | None = None

    @property
    def config_folder(self) -> Path:
        """The folder whose config.json describes the target at parse time: `dir` once it is
        there, else the local folder or cached snapshot a chat-template view is made from."""
        if (self.dir / "config.json").is_file() or self.kind == "embedded":
            return self.dir
        if self.kind == "hub":
            return self.snapshot or self.dir
        return Path(self.source)
