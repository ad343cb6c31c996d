"""What the stages and the plan ask of the sources: their rows (the prompts job, evaluation's
prompt sets), their files (a rule's input) and their row counts (the plan's sizing)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from draftline.sources.conversation import conversation_id, normalize_conversation
from draftline.sources.errors import BadRow, PromptError, RawRow, row_error
from draftline.sources.formats import format_of
from draftline.sources.spec import resolve_source


def read_source(raw: str) -> tuple[str, bool, Iterator[RawRow]]:
    """(format, indexed, rows) of one source; file-level problems raise PromptError."""
    path = resolve_source(raw)
    source = format_of(path)
    source.check(path)
    return source.name, source.indexed, source.read(path)


def source_files(paths: Sequence[str]) -> list[str]:
    """The files behind the sources, for a rule's input: a dataset folder's own files count,
    since rewriting them in place does not change the folder's mtime; a hub split's are the
    cached files `datasets` reads it from, so a new download reruns the prompts."""
    return [file for path in map(resolve_source, paths) for file in format_of(path).files(path)]


def count_rows(paths: Sequence[str]) -> tuple[int | None, str | None]:
    """(rows, None) across the sources without reading the rows, or (None, why not): JSONL lines,
    a Parquet file's metadata, a save_to_disk folder's length (memory-mapped), a cached hub
    split's size in its dataset info, a small .json list parsed. Blank lines and bad rows are
    counted, so it is an upper bound of what the prompts job keeps. For the plan's estimates, at
    parse time."""
    total = 0
    for raw in paths:
        try:
            path = resolve_source(raw)
            rows = format_of(path).count(path)
        except PromptError as exc:  # its message names the source
            return None, str(exc)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged source: the prompts job says how
            return None, f"{raw} could not be counted ({type(exc).__name__}: {exc})"
        if isinstance(rows, str):
            return None, f"{raw}: {rows}"
        total += rows
    return total, None


def read_first_turns(raw: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(id, first-turn messages) of every row of a prompt file in any format a source may have:
    the leading system turns and the first user turn, as regeneration asks its turn 1.

    A bad row stops with file, line and reason (as prompts.on_bad_row: stop does); duplicate
    conversations are kept once.
    """
    _, indexed, raw_rows = read_source(raw)
    out, seen = [], set()
    for row in raw_rows:
        try:
            if row.error:
                raise row.error
            conversation = normalize_conversation(row.value, regenerate_enabled=True)
        except BadRow as bad:
            raise row_error(raw, row.line, indexed, bad) from None
        messages, row_id = conversation.messages, conversation_id(conversation.messages, conversation.tools)
        if row_id in seen:
            continue
        seen.add(row_id)
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        out.append((row_id, messages[: first_user + 1]))
    return out
