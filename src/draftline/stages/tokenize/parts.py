"""The rows through speculators' own preprocessing, a part of about PART_TOKENS tokens at a time, so
the step's memory stays bounded whatever the dataset's size (part_bounds, speculators_dataset)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from draftline.stages.tokenize.settings import TokenizeSettings

log = logging.getLogger(__name__)

# speculators' preprocessing keeps its output in memory (`map(..., keep_in_memory=True)`): fed
# this many tokens at a time, each part is saved to disk before the next, so the step's memory
# stays bounded whatever the dataset's size (int64 ids and mask: 16 bytes a token, ~128 MB a part).
PART_TOKENS = 8_000_000


def part_bounds(lengths: Iterable[int], part_tokens: int = PART_TOKENS) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges covering every row, each of at most `part_tokens`
    tokens (a longer row is a part of its own)."""
    bounds, start, tokens, rows = [], 0, 0, 0
    for rows, length in enumerate(lengths, start=1):
        if tokens and tokens + length > part_tokens:
            bounds.append((start, rows - 1))
            start, tokens = rows - 1, 0
        tokens += length
    if rows > start:
        bounds.append((start, rows))
    return bounds


def speculators_dataset(tokenized, tokenizer, settings: TokenizeSettings, parts_dir: Path, part_tokens: int | None = None):
    """The rows through speculators' own preprocessing (its pass-through for rows that already
    hold input_ids and loss_mask: its clipping and filtering find nothing left to do, done and
    counted above, and it does not shuffle, so row i stays the i-th kept conversation), about
    `part_tokens` (PART_TOKENS) tokens at a time: each part is saved under `parts_dir` and the
    parts are concatenated memory-mapped. One part is the whole dataset in one call."""
    import pyarrow.compute as pc
    from datasets import concatenate_datasets, load_from_disk
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    def preprocess(rows):
        return build_speculator_training_dataset(
            rows, tokenizer, max_length=settings.max_seq_len, num_proc=1,
            minimum_valid_tokens=settings.min_trainable_tokens,
        )

    lengths = pc.list_value_length(tokenized.data.column("input_ids")).to_pylist()
    bounds = part_bounds(lengths, part_tokens or PART_TOKENS)
    if len(bounds) == 1:
        return preprocess(tokenized)
    parts = []
    for k, (start, stop) in enumerate(bounds):
        staging_part = str(parts_dir / f"part_{k:05d}")  # parts_dir is in tokenize's staging folder
        preprocess(tokenized.select(range(start, stop))).save_to_disk(staging_part)  # the part leaves memory here
        parts.append(load_from_disk(staging_part))
    log.info("speculators' preprocessing in %d parts of <= %d tokens", len(parts), part_tokens or PART_TOKENS)
    return concatenate_datasets(parts)
