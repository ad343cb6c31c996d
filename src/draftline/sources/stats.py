"""What the prompts stage counts per source, for summary.json."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SourceStats:
    path: str
    format: str = ""
    rows_read: int = 0
    kept: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    # what reading changed in the kept rows (sources.conversation.Conversation.changes), e.g. a
    # leading assistant turn dropped, a ShareGPT `bing` turn read as the assistant's
    changed: Counter = field(default_factory=Counter)
    train: int = 0
    validation: int = 0
    test: int = 0

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "rows_read": self.rows_read,
            "kept": self.kept,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "rejected_reasons": dict(sorted(self.rejected_reasons.items())),
            "changed": dict(sorted(self.changed.items())),
            "train": self.train,
            "validation": self.validation,
            "test": self.test,
        }

