"""Every conversation answered in one process, nothing staged (regenerate: preflight's and the tests' way)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.runtime.vllm_engine import target_llm
from draftline.stages.regenerate.answering import answer_conversations, chat_template_text
from draftline.stages.regenerate.conversation import read_conversations
from draftline.stages.regenerate.counters import Progress, log_summary, sum_stats
from draftline.stages.regenerate.files import write_json
from draftline.stages.regenerate.settings import RegenerateSettings

log = logging.getLogger(__name__)


def _runs(indices: Sequence[int], size: int) -> Iterator[list[int]]:
    """Consecutive indices, at most `size` at a time: a staged chunk is always one contiguous
    range, so staged chunks sort into the prompts file's order."""
    chunk: list[int] = []
    for i in indices:
        if chunk and (len(chunk) == size or i != chunk[-1] + 1):
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


def regenerate(
    target_dir: str | Path,
    conversations_path: str | Path,
    out_conversations: str | Path,
    out_summary: str | Path,
    settings: RegenerateSettings,
    llm=None,
) -> dict:
    """Every conversation in one process, nothing staged (the shards' rules do the same work
    split up and resumable): read prompts-stage rows, regenerate their answers, publish rows and
    summary atomically."""
    conversations = read_conversations(conversations_path)
    if not conversations:
        raise ValueError(f"{conversations_path}: no conversations to regenerate")
    chat_template = chat_template_text(settings)
    log.info("%d conversations from %s; target %s; %s", len(conversations), conversations_path, target_dir, settings)
    load_started = time.monotonic()
    llm = llm or target_llm(target_dir, settings)
    log.info("target loaded in %.1f s", time.monotonic() - load_started)
    progress, answered = Progress(len(conversations)), []
    for chunk in _runs(range(len(conversations)), settings.chunk_conversations):
        done = answer_conversations(llm, [conversations[i] for i in chunk], chunk, settings, chat_template)
        progress.add(done)
        answered += done
    rows = [a.row for a in answered if a.row is not None]
    if not rows:
        raise ValueError(f"no conversation fits max_model_len={settings.max_model_len} (vllm.max_model_len, by default "
                         "tokenize.max_seq_len); raise it")
    conversation_file.write(out_conversations, rows)
    stats = sum_stats(a.stats for a in answered)
    stats["seconds"] = round(time.monotonic() - progress.started, 1)
    stats["tokens_per_second"] = progress.tokens_per_second
    summary = {**stats, "settings": {k: v for k, v in vars(settings).items() if k != "threads"}}
    write_json(out_summary, summary)
    log_summary(stats, settings.max_new_tokens)
    return summary
