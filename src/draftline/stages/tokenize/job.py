"""What the rule runs: conversations -> speculators' arrow dataset, token_freq.pt and summary.json,
read back and published atomically (tokenize)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.stages.tokenize.arrow import write_rows_arrow
from draftline.stages.tokenize.parts import speculators_dataset
from draftline.stages.tokenize.rows import iter_tokenized, new_stats
from draftline.stages.tokenize.settings import TokenizeSettings
from draftline.stages.tokenize.template import load_tokenizer, stop_token_ids

log = logging.getLogger(__name__)


def tokenize(
    target_dir: str | Path,
    conversations_path: str | Path,
    out_dataset: str | Path,
    out_token_freq: str | Path,
    out_summary: str | Path,
    settings: TokenizeSettings,
) -> dict:
    """Conversations -> speculators' arrow dataset, token_freq.pt and summary.json, published atomically.

    Dataset row i is the i-th kept conversation in input order (its id is `ids[i]` in summary.json).
    """
    import tempfile

    from datasets import Dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    tokenizer = load_tokenizer(target_dir, settings.trust_remote_code)
    chat_template = Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None
    if chat_template is None and tokenizer.chat_template is None:
        raise ValueError(f"{target_dir}: the tokenizer has no chat template; set target.chat_template to a Jinja file")
    stop_ids = stop_token_ids(target_dir, tokenizer)
    out_dataset, out_token_freq, out_summary = Path(out_dataset), Path(out_token_freq), Path(out_summary)
    out_dataset.parent.mkdir(parents=True, exist_ok=True)
    # A fresh staging folder: speculators silently reuses an existing token_freq.pt.
    staging = Path(tempfile.mkdtemp(prefix=".tokenize.tmp-", dir=out_dataset.parent))
    try:
        # Streamed: conversations are read, tokenized and written to an Arrow file one batch at
        # a time; speculators' preprocessing then takes it a part at a time (speculators_dataset)
        # and every later step maps the files from disk.
        stats, ids = new_stats(), []
        rows = conversation_file.iter_rows(conversations_path)
        fingerprint = write_rows_arrow(
            staging / "rows.arrow", iter_tokenized(tokenizer, rows, settings, stop_ids, chat_template, stats, ids)
        )
        if not stats["rows"]:
            raise ValueError(
                f"{conversations_path}: no conversation has >= {settings.min_trainable_tokens} trainable (assistant) tokens "
                f"within max_seq_len={settings.max_seq_len}; see the counts above"
            )
        # The fingerprint from the rows' content, not the staging folder's random name, so the
        # same conversations give the same dataset fingerprint (hidden-state staging keys use it).
        tokenized = Dataset(Dataset.from_file(str(staging / "rows.arrow")).data, fingerprint=fingerprint)
        dataset = speculators_dataset(tokenized, tokenizer, settings, staging / "parts")
        if len(dataset) != stats["rows"]:
            raise RuntimeError(f"speculators' preprocessing kept {len(dataset)} of {stats['rows']} rows; expected all")
        save_token_frequency_distribution(dataset, staging / "token_freq.pt")
        dataset.save_to_disk(str(staging / "dataset"))
        _verify(staging, tokenized)
        del dataset, tokenized
        summary = {**stats, "max_seq_len": settings.max_seq_len, "min_trainable_tokens": settings.min_trainable_tokens,
                   "reasoning": settings.reasoning, "ids": ids}
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        # dataset and token_freq first, summary last: a finished summary means the rest is there
        _replace(staging / "dataset", out_dataset)
        _replace(staging / "token_freq.pt", out_token_freq)
        _replace(staging / "summary.json", out_summary)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "%d rows, %d tokens, %d trainable; %d rows truncated at max_seq_len=%d (%d tokens, %d trainable cut); "
        "%d rows dropped with < %d trainable tokens; %d answers were truncated at generation",
        stats["rows"], stats["total_tokens"], stats["trainable_tokens"], stats["rows_truncated"], settings.max_seq_len,
        stats["tokens_cut_by_truncation"], stats["trainable_tokens_cut_by_truncation"],
        stats["rows_dropped_few_trainable_tokens"], settings.min_trainable_tokens, stats["answers_truncated_at_generation"],
    )
    return summary


def _verify(staging: Path, tokenized) -> None:
    """Read back what was written: every row's ids and mask as tokenized (`tokenized`, the rows
    file), frequencies of trained tokens only; row by row, nothing held whole."""
    from collections import Counter

    import torch
    from datasets import load_from_disk

    dataset = load_from_disk(str(staging / "dataset")).with_format(None)  # plain lists, not tensors
    if len(dataset) != len(tokenized):
        raise RuntimeError(f"written dataset has {len(dataset)} rows, expected {len(tokenized)}")
    expected = Counter()
    for i, (written, row) in enumerate(zip(dataset, tokenized.with_format(None), strict=True)):
        same = written["input_ids"] == row["input_ids"] and written["loss_mask"] == row["loss_mask"]
        if not same or written["seq_len"] != len(row["input_ids"]):
            raise RuntimeError(f"written dataset row {i} differs from the tokenized conversation")
        expected.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    freq = torch.load(staging / "token_freq.pt", weights_only=True)
    if dict(expected) != freq:
        raise RuntimeError("token_freq.pt does not match the trained tokens of the dataset")


def _replace(src: Path, dst: Path) -> None:
    import os

    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)
