"""What a reader yields (`RawRow`: a row as read, or why it cannot be) and the errors that name
the source, the row and the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class PromptError(ValueError):
    """A prompt source or row that cannot be used; the message says where and how to fix it."""


@dataclass
class BadRow(Exception):
    """One unusable row: `code` groups reasons in summary.json, `reason`/`fix` are for people."""

    code: str
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})"


@dataclass
class RawRow:
    """A row as read: `line` is the 1-based line of a JSONL file or the index of an indexed row."""

    line: int
    text: str
    value: Any = None
    error: BadRow | None = None


def as_raw_row(index: int, value: Any) -> RawRow:
    """Row `index` of an indexed source (a JSON list, Parquet, a dataset), its text for rejects.jsonl."""
    return RawRow(index, json.dumps(value, ensure_ascii=False, default=str), value)


def where(path: str, line: int, indexed: bool) -> str:
    """`file:7` for a JSONL line, `folder[7]` for row 7 of a dataset or a JSON list."""
    return f"{path}[{line}]" if indexed else f"{path}:{line}"


def row_error(source: str, line: int, indexed: bool, bad: BadRow) -> PromptError:
    return PromptError(f"{where(source, line, indexed)}: {bad.reason} (fix: {bad.fix})")


def no_rows(raw: str, what: str, fix: str = "add conversations or remove it from prompts.sources") -> PromptError:
    return PromptError(f"{raw}: {what}, no rows (fix: {fix})")
