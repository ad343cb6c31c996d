"""The answer settings and their hash, the answer key: `results/regenerated/settings.json`
(write_answer_settings, read_answer_settings)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.lineage.content_hash import sha256_file
from draftline.stages.regenerate.files import write_json

log = logging.getLogger(__name__)


def write_answer_settings(
    conversations_path: str | Path, out: str | Path, answers: dict, also: dict | None = None
) -> dict:
    """`results/regenerated/settings.json`: `answers` (everything else that decides the answers:
    target identity, generation settings, code, versions), the prompts file by content, and
    `key`, the hash of both. `also` (the merge's code) is recorded without entering the key:
    a change there reruns what follows but keeps the staged answers."""
    rows = conversation_file.count_rows(conversations_path)
    if not rows:
        raise ValueError(f"{conversations_path}: no conversations to regenerate")
    prompts = {"rows": rows, "sha256": sha256_file(conversations_path)}
    answers = json.loads(json.dumps(answers, sort_keys=True, default=str))
    key = hashlib.sha256(json.dumps({"answers": answers, "prompts": prompts}, sort_keys=True).encode()).hexdigest()[:16]
    record = {"key": key, "answers": answers, "prompts": prompts, "also": dict(sorted((also or {}).items()))}
    write_json(out, record)
    log.info("answer key %s: %d conversations in %s (sha256 %s)", key, rows, conversations_path, prompts["sha256"][:12])
    return record


def read_answer_settings(path: str | Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
        record["key"], record["prompts"]["rows"]  # noqa: B018 - the fields every reader uses
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a regeneration settings file ({err}); rerun rule regenerate_settings") from err
    return record
