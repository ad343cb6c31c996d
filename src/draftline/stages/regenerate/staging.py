"""The finished chunks a shard keeps across a killed job, checked, under
`results/regenerated/.staging/<answer key>/` (Staging, staged_rows)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.lineage.content_hash import sha256_file
from draftline.stages.regenerate.counters import COUNTERS, Answered
from draftline.stages.regenerate.files import write_json

log = logging.getLogger(__name__)


class StagedChunkError(ValueError):
    """A staged chunk that is unreadable, of other settings, or does not match the prompts."""


_CHUNK = re.compile(r"chunk_(\d+)-(\d+)\.json")


@dataclass
class _Chunk:
    """A staged chunk: conversations start..stop-1 (contiguous) of the prompts file."""

    start: int
    stop: int
    rows_path: Path
    meta_path: Path
    ids: list[str]
    stats: list[dict[str, int]]


class Staging:
    """`<root>/<key>/chunk_<start>-<stop>.jsonl` (the kept rows, conversation-row format) and
    `.json` (ids and counters of every conversation of the chunk, the rows file's sha256).
    The .json is written last: a chunk without it was never finished."""

    def __init__(self, root: str | Path, key: str):
        self.root, self.key = Path(root), key
        self.folder = self.root / key

    def prepare(self) -> None:
        # Chunks answered with other settings are never reusable.
        if self.root.is_dir():
            for stale in self.root.iterdir():
                if stale.name != self.key and stale.is_dir():
                    log.info("removing staged answers of other settings: %s", stale)
                    shutil.rmtree(stale, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)

    def stage(self, answered: Sequence[Answered]) -> None:
        start, stop = answered[0].index, answered[-1].index + 1
        assert [a.index for a in answered] == list(range(start, stop)), "a chunk is one contiguous range"
        stem = self.folder / f"chunk_{start}-{stop}"
        conversation_file.write(stem.with_suffix(".jsonl"), [a.row for a in answered if a.row is not None])
        meta = {
            "key": self.key, "start": start, "stop": stop, "ids": [a.id for a in answered],
            "stats": [a.stats for a in answered], "rows_sha256": sha256_file(stem.with_suffix(".jsonl")),
        }
        write_json(stem.with_suffix(".json"), meta)

    def _open(self, meta_path: Path, start: int, stop: int) -> _Chunk:
        rows_path = meta_path.with_suffix(".jsonl")
        try:
            meta = json.loads(meta_path.read_text())
            ids, stats = meta["ids"], meta["stats"]
            if meta["key"] != self.key or (meta["start"], meta["stop"]) != (start, stop):
                raise StagedChunkError(f"{meta_path}: made for key {meta['key']}, rows {meta['start']}..{meta['stop']}")
            if len(ids) != stop - start or len(stats) != stop - start or any(set(s) != set(COUNTERS) for s in stats):
                raise StagedChunkError(f"{meta_path}: ids or counters do not cover rows {start}..{stop - 1}")
            if sha256_file(rows_path) != meta["rows_sha256"]:
                raise StagedChunkError(f"{rows_path}: changed since it was staged (sha256 differs)")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise err if isinstance(err, StagedChunkError) else StagedChunkError(f"{meta_path}: unreadable ({err})") from err
        return _Chunk(start, stop, rows_path, meta_path, ids, stats)

    def discard(self, chunk: _Chunk, reason: str) -> None:
        log.warning("discarding staged chunk: %s", reason)
        chunk.meta_path.unlink(missing_ok=True)
        chunk.rows_path.unlink(missing_ok=True)

    def chunks(self, rows: range) -> list[_Chunk]:
        """Checked chunks holding conversations of `rows`, in order; unusable ones are deleted."""
        found = []
        for meta_path in self.folder.glob("chunk_*.json"):
            match = _CHUNK.fullmatch(meta_path.name)
            if not match:
                continue
            start, stop = int(match[1]), int(match[2])
            if stop <= rows.start or start >= rows.stop:
                continue  # another shard's
            try:
                found.append(self._open(meta_path, start, stop))
            except StagedChunkError as err:
                log.warning("discarding staged chunk: %s", err)
                meta_path.unlink(missing_ok=True)
                meta_path.with_suffix(".jsonl").unlink(missing_ok=True)
        found.sort(key=lambda c: c.start)
        kept, covered = [], -1
        for chunk in found:
            if chunk.start < covered:  # never written so; skip rather than answer twice
                log.warning("ignoring staged chunk %s: it overlaps another", chunk.meta_path)
                continue
            kept.append(chunk)
            covered = chunk.stop
        return kept


def staged_rows(chunk: _Chunk, rows: range) -> Iterator[dict]:
    """The chunk's kept rows inside `rows`, checked against the ids it was staged with."""
    expected = [
        (i, rid) for i, rid, s in zip(range(chunk.start, chunk.stop), chunk.ids, chunk.stats, strict=True) if s["rows_out"]
    ]
    got = 0
    for (i, rid), row in zip(expected, conversation_file.iter_rows(chunk.rows_path), strict=False):
        got += 1
        if row["id"] != rid:
            raise StagedChunkError(f"{chunk.rows_path}: row {got} has id {row['id']!r}, staged as {rid!r}; delete it and rerun")
        if i in rows:
            yield row
    if got != len(expected):
        raise StagedChunkError(f"{chunk.rows_path}: {got} rows, staged with {len(expected)}; delete it and rerun")
