"""The files the stage writes: a shard folder's two, and JSON records published atomically (write_json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftline.runtime.atomic import atomic_file

SHARD_CONVERSATIONS = "conversations.jsonl"  # in each shard folder, beside
SHARD_SUMMARY = "summary.json"


def write_json(path: str | Path, value: Any) -> None:
    with atomic_file(path, encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")
