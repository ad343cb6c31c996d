"""The conversations as rows for training, one at a time: tokenized, truncated at max_seq_len and
filtered at min_trainable_tokens, with the counts summary.json reports (iter_tokenized, new_stats)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from draftline.stages.tokenize.mask import Tokenized, apply_reasoning, tokenize_conversation
from draftline.stages.tokenize.settings import TokenizeSettings

log = logging.getLogger(__name__)


def new_stats() -> dict:
    return {
        "rows_in": 0,
        "rows_truncated": 0,
        "tokens_cut_by_truncation": 0,
        "trainable_tokens_cut_by_truncation": 0,
        "rows_dropped_few_trainable_tokens": 0,
        "answers_truncated_at_generation": 0,
        "rows": 0,
        "total_tokens": 0,
        "trainable_tokens": 0,
        # assistant tokens (kept rows, within max_seq_len) of the answers' thinking and of the rest
        # of the answers (tool-call text included); trained: both, or only the answers (tokenize.reasoning)
        "reasoning_tokens": 0,
        "answer_tokens": 0,
        "rows_with_reasoning": 0,
    }


def iter_tokenized(tokenizer, rows: Iterable[dict], settings: TokenizeSettings, stop_ids: set[int],
                   chat_template: str | None, stats: dict, ids: list[str]) -> Iterator[dict]:
    """Tokenize, truncate at max_seq_len and filter, one row at a time: yields each kept row's
    `input_ids` and `loss_mask`, appends its id to `ids` and counts into `stats` (`new_stats`)."""
    for row in rows:
        stats["rows_in"] += 1
        stats["answers_truncated_at_generation"] += sum(bool(m.get("truncated")) for m in row["messages"])
        full = tokenize_conversation(tokenizer, row["messages"], stop_ids, chat_template, row_id=row["id"],
                                     template_kwargs=settings.chat_template_kwargs, tools=row.get("tools"))
        tok = apply_reasoning(full, settings.reasoning)
        if len(tok.input_ids) > settings.max_seq_len:
            stats["rows_truncated"] += 1
            stats["tokens_cut_by_truncation"] += len(tok.input_ids) - settings.max_seq_len
            stats["trainable_tokens_cut_by_truncation"] += sum(tok.loss_mask[settings.max_seq_len :])
            n = settings.max_seq_len
            full = Tokenized(full.input_ids[:n], full.loss_mask[:n], full.reasoning[:n])
            tok = Tokenized(tok.input_ids[:n], tok.loss_mask[:n], tok.reasoning[:n])
        trainable = sum(tok.loss_mask)
        if trainable < settings.min_trainable_tokens:
            stats["rows_dropped_few_trainable_tokens"] += 1
            log.warning("id %r dropped: %d trainable tokens < tokenize.min_trainable_tokens=%d",
                        row["id"], trainable, settings.min_trainable_tokens)
            continue
        stats["rows"] += 1
        stats["total_tokens"] += len(tok.input_ids)
        stats["trainable_tokens"] += trainable
        thinking = sum(full.reasoning)
        stats["reasoning_tokens"] += thinking
        stats["answer_tokens"] += sum(full.loss_mask) - thinking
        stats["rows_with_reasoning"] += thinking > 0
        ids.append(row["id"])
        yield {"input_ids": tok.input_ids, "loss_mask": tok.loss_mask}
