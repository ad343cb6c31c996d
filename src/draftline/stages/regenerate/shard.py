"""One shard of the prompts file answered into its folder, resuming from the staged chunks (regenerate_shard)."""

from __future__ import annotations

import logging
import time
from itertools import islice
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.artifacts.hidden_states import shard_rows
from draftline.runtime.atomic import atomic_dir
from draftline.runtime.shards import ShardJob
from draftline.runtime.vllm_engine import shutdown, target_llm
from draftline.stages.regenerate.answer_key import read_answer_settings
from draftline.stages.regenerate.answering import answer_conversations, chat_template_text
from draftline.stages.regenerate.conversation import Conversation, parse_conversation
from draftline.stages.regenerate.counters import Progress, log_summary, sum_stats
from draftline.stages.regenerate.files import SHARD_CONVERSATIONS, SHARD_SUMMARY, write_json
from draftline.stages.regenerate.settings import RegenerateSettings
from draftline.stages.regenerate.staging import Staging, staged_rows

log = logging.getLogger(__name__)


def regenerate_shard(
    target_dir: str | Path,
    conversations_path: str | Path,
    settings_path: str | Path,
    job: ShardJob,
    settings: RegenerateSettings,
    *,
    llm=None,
) -> dict:
    """Answer `job`'s shard of the prompts file into its folder (its `conversations.jsonl` and
    `summary.json`, published in one rename); return the summary.

    `settings_path` is `write_answer_settings`' file (the answer key, the row count). The job's
    staging folder (default `<out_dir's parent>/.staging`) keeps finished chunks across a killed
    job; conversations a valid chunk holds are not answered again.
    """
    shard, num_shards, staging_root = job.index, job.count, job.staging
    out_dir = Path(job.out_dir)
    answer = read_answer_settings(settings_path)
    key, num_rows = answer["key"], answer["prompts"]["rows"]
    rows = shard_rows(num_rows, shard, num_shards)
    staging = Staging(staging_root, key)
    staging.prepare()
    staged = _still_staged(staging, rows, conversations_path, f"{settings_path} says ({num_rows})")
    todo = [i for i in rows if i not in staged]
    log.info(
        "shard %d/%d: conversations %d..%d of %d (%d); %d already answered in %s, %d to answer; %s",
        shard, num_shards, rows.start, rows.stop - 1, num_rows, len(rows), len(staged), staging.folder, len(todo), settings,
    )

    progress = Progress(len(rows), staged.values())
    load_seconds = seconds = 0.0
    if todo:
        own = llm is None
        load_started = time.monotonic()
        llm = llm or target_llm(target_dir, settings)
        load_seconds = time.monotonic() - load_started
        log.info("target %s loaded in %.1f s", target_dir, load_seconds)
        progress.started = time.monotonic()
        _answer_rows(llm, conversations_path, rows, set(todo), settings, staging, progress)
        seconds = time.monotonic() - progress.started
        if own:
            shutdown(llm)

    # Publish: every chunk's rows of this shard, in order, checked against the staged ids.
    chunks = staging.chunks(rows)
    held = [i for c in chunks for i in range(c.start, c.stop) if i in rows]
    if held != list(rows):
        raise RuntimeError(f"shard {shard}: staged chunks in {staging.folder} do not cover rows {rows.start}..{rows.stop - 1}")
    stats = sum_stats(c.stats[i - c.start] for c in chunks for i in range(c.start, c.stop) if i in rows)
    summary = {
        "shard": shard, "num_shards": num_shards, "row_start": rows.start, "row_stop": rows.stop,
        "key": key, **stats, "answered": len(todo), "reused": len(rows) - len(todo),
        "load_seconds": round(load_seconds, 1), "seconds": round(seconds, 1),
        "tokens_per_second": progress.tokens_per_second if todo else None,
    }
    with atomic_dir(out_dir) as tmp:
        conversation_file.write(tmp / SHARD_CONVERSATIONS, (row for c in chunks for row in staged_rows(c, rows)))
        write_json(tmp / SHARD_SUMMARY, summary)
    log.info("published %s: %d rows (%d answered now, %d from staging)", out_dir, stats["rows_out"], len(todo), summary["reused"])
    log_summary(stats, settings.max_new_tokens)
    return summary


def _still_staged(staging: Staging, rows: range, conversations_path: str | Path, expected: str) -> dict[int, dict]:
    """Row -> its stats, for the rows of `rows` a staged chunk holds whose ids still match the
    prompts file (streamed); a chunk holding another id is discarded, saying which row differs."""
    chunks = staging.chunks(rows)
    staged_id = {i: (c, rid) for c in chunks for i, rid in zip(range(c.start, c.stop), c.ids, strict=True) if i in rows}
    bad: dict[int, str] = {}
    count = 0
    for i, row in zip(rows, islice(conversation_file.iter_rows(conversations_path), rows.start, rows.stop)):
        count += 1
        if i in staged_id and staged_id[i][1] != row["id"]:
            bad.setdefault(id(staged_id[i][0]), f"{staged_id[i][0].meta_path}: row {i} is {staged_id[i][1]!r}, "
                                                 f"the prompts file has {row['id']!r}")
    if count != len(rows):
        raise ValueError(f"{conversations_path}: has fewer rows than {expected}; rerun regenerate_settings")
    for chunk in [c for c in chunks if id(c) in bad]:
        staging.discard(chunk, bad[id(chunk)])
    return {i: c.stats[i - c.start] for c in chunks if id(c) not in bad for i in range(c.start, c.stop) if i in rows}


def _answer_rows(llm, conversations_path, rows: range, todo: set[int], settings: RegenerateSettings,
                 staging: Staging, progress: Progress) -> None:
    """Answer the `todo` rows of `rows`, streaming the prompts file again: one chunk of
    consecutive conversations in memory at a time, each staged once answered."""
    chat_template = chat_template_text(settings)
    pending: list[tuple[int, Conversation]] = []
    prompt_rows = islice(conversation_file.iter_rows(conversations_path), rows.start, rows.stop)
    for i, row in zip(rows, prompt_rows):
        if i not in todo:
            continue
        if pending and (len(pending) == settings.chunk_conversations or i != pending[-1][0] + 1):
            _answer_and_stage(llm, pending, settings, chat_template, staging, progress)
            pending = []
        pending.append((i, parse_conversation(row, f"{conversations_path} (row {i + 1})")))
    if pending:
        _answer_and_stage(llm, pending, settings, chat_template, staging, progress)


def _answer_and_stage(llm, pending, settings, chat_template, staging: Staging, progress: Progress) -> None:
    indices = [i for i, _ in pending]
    answered = answer_conversations(llm, [c for _, c in pending], indices, settings, chat_template)
    staging.stage(answered)
    progress.add(answered)
