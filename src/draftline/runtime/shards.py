"""One shard of a sharded stage (regeneration, hidden-state extraction): which shard of how many,
the folder it is published to, and where its finished parts wait across a killed job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ShardJob:
    index: int  # this shard, 0-based (the rule's {shard} wildcard)
    count: int  # regenerate.shards or hidden_states.shards
    out_dir: str | Path  # published in one rename once complete
    staging_root: str | Path | None = None  # default: `.staging` beside out_dir

    @property
    def staging(self) -> Path:
        return Path(self.staging_root) if self.staging_root else Path(self.out_dir).parent / ".staging"

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count} ({self.out_dir})"
