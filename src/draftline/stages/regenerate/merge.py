"""The shards' rows merged in the prompts file's order, their counters summed, the merged file's
sha256 (merge_shards, write_answers_digest)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.lineage.content_hash import sha256_file
from draftline.runtime.atomic import atomic_file
from draftline.stages.regenerate.answer_key import read_answer_settings
from draftline.stages.regenerate.counters import log_summary, sum_stats
from draftline.stages.regenerate.files import SHARD_CONVERSATIONS, SHARD_SUMMARY, write_json

log = logging.getLogger(__name__)


def merge_shards(
    shard_dirs: Sequence[str | Path], settings_path: str | Path, out_conversations: str | Path, out_summary: str | Path,
    out_answers: str | Path | None = None,
) -> dict:
    """The shards' rows, streamed in shard order (= the prompts file's order), into
    `out_conversations`; `out_summary` sums their counters; `out_answers` (`write_answers_digest`)
    is the merged file's sha256, what tokenization follows. Errors when the shards do not tile
    the prompts file or were made with other settings than `settings_path`."""
    answer = read_answer_settings(settings_path)
    summaries = []
    expected_start = 0
    for k, folder in enumerate(map(Path, shard_dirs)):
        try:
            s = json.loads((folder / SHARD_SUMMARY).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{folder / SHARD_SUMMARY}: unreadable ({err}); rerun regenerate_shard {k}") from err
        if s["key"] != answer["key"]:
            raise ValueError(f"{folder}: answered with key {s['key']}, {settings_path} has {answer['key']}; rerun regenerate_shard {k}")
        if (s["shard"], s["num_shards"], s["row_start"]) != (k, len(shard_dirs), expected_start):
            raise ValueError(
                f"{folder}: shard {s['shard']} of {s['num_shards']} from row {s['row_start']}, expected shard {k} of "
                f"{len(shard_dirs)} from row {expected_start}; rerun the regeneration shards"
            )
        expected_start = s["row_stop"]
        summaries.append(s)
    if expected_start != answer["prompts"]["rows"]:
        raise ValueError(f"the shards cover {expected_start} conversations, {settings_path} has {answer['prompts']['rows']}")
    stats = sum_stats(summaries)
    if not stats["rows_out"]:
        max_model_len = answer["answers"].get("engine_outputs", {}).get("max_model_len")
        raise ValueError(f"no conversation fits max_model_len={max_model_len} (vllm.max_model_len, by default "
                         "tokenize.max_seq_len); raise it")

    def rows() -> Iterator[dict]:
        for folder, s in zip(map(Path, shard_dirs), summaries, strict=True):
            n = 0
            for row in conversation_file.iter_rows(folder / SHARD_CONVERSATIONS):
                n += 1
                yield row
            if n != s["rows_out"]:
                raise ValueError(f"{folder / SHARD_CONVERSATIONS}: {n} rows, its summary says {s['rows_out']}; rerun that shard")

    conversation_file.write(out_conversations, rows())
    sha256 = write_answers_digest(out_conversations, out_answers) if out_answers else sha256_file(out_conversations)
    answered = [s for s in summaries if s["answered"]]
    seconds = sum(s["seconds"] for s in answered)
    summary = {
        **stats,
        "seconds": round(seconds, 1),  # answering time summed over the shard jobs (GPU seconds)
        "tokens_per_second": round(sum(s["tokens_per_second"] * s["seconds"] for s in answered) / seconds, 1) if seconds else None,
        "shards": [{k: s[k] for k in ("shard", "row_start", "row_stop", "rows_out", "answered", "reused", "seconds",
                                     "tokens_per_second")} for s in summaries],
        "key": answer["key"],
        "settings": answer["answers"],
        "sha256": sha256,  # of the merged file
    }
    write_json(out_summary, summary)
    log.info("merged %d shards into %s (sha256 %s)", len(shard_dirs), out_conversations, sha256[:12])
    log_summary(stats, answer["answers"].get("max_new_tokens"))
    return summary


def write_answers_digest(conversations: str | Path, out: str | Path) -> str:
    """`out`: `<sha256>  <file name>` of the merged conversations (sha256sum's format, so `sha256sum
    -c` checks it from its folder); return the sha256. Its content changes only when the
    conversations do, which is what the tokenize rule follows (on GPUs another shard count or
    chunk size can give other answers: vLLM's can change with the batch)."""
    sha256 = sha256_file(conversations)
    with atomic_file(out, encoding="utf-8") as handle:
        handle.write(f"{sha256}  {Path(conversations).name}\n")
    return sha256
