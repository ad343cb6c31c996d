"""The plan's check of the sources (at Snakemake parse time): each is there, and its first rows
can be used."""

from __future__ import annotations

from collections.abc import Sequence

from draftline.sources.conversation import normalize_conversation
from draftline.sources.errors import BadRow, PromptError, RawRow, row_error, where
from draftline.sources.formats import JSON_LIST, format_of
from draftline.sources.json_files import list_cut_off
from draftline.sources.spec import resolve_source

# Rows of each source checked at plan time (fields, roles, turn order), the first ones only, so a
# wrong column name or format stops the dry run rather than the prompts job, at any source size.
CHECKED_ROWS = 5


def check_sources(
    paths: Sequence[str], regenerate_enabled: bool = True, on_bad_row: str = "stop", rows: int = CHECKED_ROWS,
    leading_assistant_turn: str = "drop",
) -> None:
    """Fail fast (at Snakemake parse time) on a source that is missing, empty or unreadable, or
    whose first rows cannot be used.

    Cheap in every format: the first `rows` rows of each source are read (a JSONL file's first
    lines, a JSON list's first elements, a Parquet file's first batch, the first rows of a
    save_to_disk folder or of a cached hub split, memory-mapped by `datasets`) and validated as
    the prompts job validates them. In stop mode the first bad one stops the plan; in skip mode
    only a source whose rows read are all bad does (a wrong column name or format: the job would
    reject all of it). The full check happens in the prompts job. `rows=0` checks that the
    sources exist (a hub split: that it is in the local cache) and nothing more.
    """
    seen: set[str] = set()
    for raw in paths:
        if raw in seen:
            raise PromptError(
                f"prompts.sources lists {raw} twice (fix: list each source once; duplicate "
                "conversations across different sources are removed automatically)"
            )
        seen.add(raw)
        path = resolve_source(raw)
        source = format_of(path)
        source.check(path)
        if source is JSON_LIST and on_bad_row == "stop" and (cut := list_cut_off(path)):
            raise PromptError(f"{raw}: {cut} (fix: set prompts.on_bad_row: skip to keep the complete rows before "
                              "the break, each counted, or repair the file)")
        if rows > 0:
            _check_rows(raw, source.indexed, source.first_rows(path, rows), regenerate_enabled, on_bad_row,
                        leading_assistant_turn)


def _check_rows(raw: str, indexed: bool, head: list[RawRow], regenerate_enabled: bool, on_bad_row: str,
                leading_assistant_turn: str) -> None:
    bad: list[tuple[RawRow, BadRow]] = []
    for row in head:
        try:
            if row.error:
                raise row.error
            normalize_conversation(row.value, regenerate_enabled, leading_assistant_turn)
        except BadRow as error:
            if on_bad_row == "stop":
                raise row_error(raw, row.line, indexed, error) from None
            bad.append((row, error))
    if head and len(bad) == len(head):
        row, error = bad[0]
        raise PromptError(
            f"{raw}: none of its first {len(head)} rows can be used, so prompts.on_bad_row: skip would "
            f"reject the whole source; the first: {where(raw, row.line, indexed)}: {error.reason} "
            f"(fix: {error.fix}; or remove the source from prompts.sources)"
        )
