"""The published draft's own record (results/checkpoint/final/draftline_provenance.json, written by
draftline.stages.train): which epoch it is."""

from __future__ import annotations


def chosen_epoch(provenance: dict) -> int | None:
    """The published epoch counted from 1 (final/'s provenance before `chosen_epoch_folder` was
    recorded held speculators' 0-based folder number)."""
    chosen = provenance.get("chosen_epoch")
    if chosen is None:
        return None
    return int(chosen) if "chosen_epoch_folder" in provenance else int(chosen) + 1
