"""The prompts step: read, validate, de-duplicate and split the training conversations.

Every configured source (`draftline.sources`: the formats a user's data comes in) is read row
by row; each row becomes `{"id", "source", "messages"}` (`draftline.artifacts.conversations`),
exact duplicates collapse, and the seeded order puts the first rows into the validation and
test sets.

A bad row is never dropped silently: `on_bad_row="stop"` raises `PromptError` naming
`file:line`, the reason and the fix; `"skip"` writes it to rejects.jsonl and counts it (per
source, in summary.json and the run's results/summary.md), and a source whose rows are all
rejected stops the step all the same: a wrong column name never drops a whole source.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.runtime.atomic import atomic_file
from draftline.settings import DEFAULTS
from draftline.sources import (
    BadRow,
    PromptError,
    SourceStats,
    check_sources,
    conversation_id,
    normalize_conversation,
    read_source,
    row_error,
    where,
)

log = logging.getLogger(__name__)


class SpooledRows(Sequence):
    """Kept rows, in the order `positions` gives, read back one at a time from the spool file
    the prompts step wrote them to (each row `conversation_file.encode`d): 10^5 conversations
    are never held in memory at once (benchmarks/results/plan_at_scale.md)."""

    def __init__(self, spool, offsets: array, positions: Sequence[int]):
        self._spool, self._offsets, self._positions = spool, offsets, positions

    def __len__(self) -> int:
        return len(self._positions)

    def encoded(self, i: int) -> str:
        k = self._positions[i]
        start = self._offsets[k]
        return os.pread(self._spool.fileno(), self._offsets[k + 1] - start, start).decode("utf-8")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return SpooledRows(self._spool, self._offsets, self._positions[i])
        return json.loads(self.encoded(i))

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:  # the same rows in the same order, as a list compares
        if isinstance(other, (SpooledRows, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # mutable-like, as a list

    def lines(self) -> Iterator[str]:
        """The rows as `conversation_file.encode` wrote them, for `write_encoded`."""
        for i in range(len(self)):
            yield self.encoded(i)


@dataclass(frozen=True)
class PromptsSettings:
    """The prompts stage's settings: the `prompts:` block (and whether answers are regenerated,
    which decides what a usable row is); defaults are the schema's."""

    validation: int = DEFAULTS.prompts.validation
    test: int = DEFAULTS.prompts.test
    max_samples: int | None = DEFAULTS.prompts.max_samples
    on_bad_row: str = DEFAULTS.prompts.on_bad_row
    leading_assistant_turn: str = DEFAULTS.prompts.leading_assistant_turn
    seed: int = DEFAULTS.prompts.seed
    regenerate_enabled: bool = DEFAULTS.regenerate.enabled


@dataclass(frozen=True)
class PromptFiles:
    """The stage's five outputs (rules/prompts.smk)."""

    prompts: str | Path
    validation: str | Path
    test: str | Path
    rejects: str | Path
    summary: str | Path


@dataclass
class _Spool:
    """The kept rows of every source, in a temporary file as they were read (memory holds their
    offsets and sources, not the rows), with the rejects and each source's counts."""

    file: object = field(default_factory=tempfile.TemporaryFile)  # deleted when closed
    offsets: array = field(default_factory=lambda: array("q", [0]))  # row k is file[offsets[k]:offsets[k + 1]]
    row_source: array = field(default_factory=lambda: array("l"))  # index into `sources` of row k
    user_turns: array = field(default_factory=lambda: array("l"))  # user turns of row k (answers to regenerate)
    rejects: list[dict] = field(default_factory=list)
    stats: dict[str, SourceStats] = field(default_factory=dict)


@dataclass
class Collected:
    train: Sequence[dict]
    validation: Sequence[dict]
    test: Sequence[dict]
    rejects: list[dict]
    summary: dict


def collect_prompts(sources: Sequence[str], settings: PromptsSettings = PromptsSettings()) -> Collected:
    """Read every source, validate, de-duplicate, shuffle, split. Kept rows go to a temporary
    spool file as they are read; the splits read them back from it in the shuffled order."""
    if settings.on_bad_row not in ("stop", "skip"):
        raise PromptError(f"prompts.on_bad_row is {settings.on_bad_row!r} (fix: use stop or skip)")
    check_sources(sources, settings.regenerate_enabled, settings.on_bad_row, rows=0)  # existence only; rows below
    spool = _Spool()
    seen: set[str] = set()
    for source_index, source in enumerate(sources):
        _read_one(source, source_index, spool, seen, settings)
    return _split(sources, spool, settings)


def _read_one(source: str, source_index: int, spool: _Spool, seen: set[str], settings: PromptsSettings) -> None:
    """One source's rows into the spool: validated (a bad row stops, or is counted and kept in
    the rejects under on_bad_row: skip), de-duplicated against every row seen before."""
    st = spool.stats[source] = SourceStats(source)
    st.format, indexed, raw_rows = read_source(source)
    for raw in raw_rows:
        st.rows_read += 1
        try:
            if raw.error:
                raise raw.error
            conversation = normalize_conversation(raw.value, settings.regenerate_enabled, settings.leading_assistant_turn)
        except BadRow as bad:
            if settings.on_bad_row == "stop":
                raise row_error(source, raw.line, indexed, bad) from None
            st.rejected += 1
            st.rejected_reasons[bad.code] += 1
            spool.rejects.append(
                {"source": source, "line": raw.line, "code": bad.code, "reason": bad.reason,
                 "fix": bad.fix, "raw": raw.text}
            )
            continue
        messages = conversation.messages
        row_id = conversation_id(messages, conversation.tools)
        if row_id in seen:
            st.duplicates += 1
            continue
        seen.add(row_id)
        st.kept += 1
        st.changed.update(conversation.changes)
        row = {"id": row_id, "source": source, "messages": messages}
        if conversation.tools:
            row["tools"] = conversation.tools
        line = conversation_file.encode(row).encode("utf-8")
        spool.offsets.append(spool.offsets[-1] + spool.file.write(line))
        spool.row_source.append(source_index)
        spool.user_turns.append(sum(m["role"] == "user" for m in messages))
    _log_source(st)
    if st.rows_read and st.rejected == st.rows_read:
        first = next(r for r in spool.rejects if r["source"] == source)
        raise PromptError(
            f"{source}: all {st.rows_read} rows were rejected ({_reasons(st)}); prompts.on_bad_row: skip "
            f"leaves out bad rows, never a whole source. The first: {where(source, first['line'], indexed)}: "
            f"{first['reason']} (fix: {first['fix']}; or remove the source from prompts.sources)"
        )


def _split(sources: Sequence[str], spool: _Spool, settings: PromptsSettings) -> Collected:
    """The kept rows shuffled once (seeded) and split: validation, then test, then training (at
    most max_samples), with each source's share of each split counted."""
    validation, test, max_samples = settings.validation, settings.test, settings.max_samples
    stats = spool.stats
    kept = len(spool.row_source)
    if not kept:
        reasons = Counter()
        for st in stats.values():
            reasons.update(st.rejected_reasons)
        raise PromptError(
            f"no usable conversations in {', '.join(sources)} (rejected: {dict(reasons)}; see the "
            "log) (fix: repair the rows or add sources)"
        )
    if validation + test >= kept:
        raise PromptError(
            f"prompts.validation + prompts.test is {validation} + {test} but only {kept} distinct "
            "conversations were kept, leaving none for training (fix: lower them or add sources)"
        )

    # Held-out rows come off the shuffled order first (validation, then test), so max_samples
    # never changes them, and a run with a larger test set keeps the same validation set.
    # Shuffling the positions gives the permutation shuffling the rows themselves gave.
    order = list(range(kept))
    random.Random(settings.seed).shuffle(order)
    val_pos, test_pos = order[:validation], order[validation : validation + test]
    train_pos = order[validation + test :]
    capped_pos = train_pos if max_samples is None else train_pos[:max_samples]
    for split, chosen in (("validation", val_pos), ("test", test_pos), ("train", capped_pos)):
        for k in chosen:
            st = stats[sources[spool.row_source[k]]]
            setattr(st, split, getattr(st, split) + 1)
    spool.file.flush()
    val_rows, test_rows, capped = (SpooledRows(spool.file, spool.offsets, pos) for pos in (val_pos, test_pos, capped_pos))

    per_source = [st.as_dict() for st in stats.values()]
    totals = {
        key: sum(s[key] for s in per_source)
        for key in ("rows_read", "kept", "duplicates", "rejected", "train", "validation", "test")
    }
    summary = {
        "sources": per_source,
        "totals": totals,
        "train": len(capped),
        "train_user_turns": sum(spool.user_turns[k] for k in capped_pos),  # the answers regeneration writes (sizing)
        "validation": len(val_rows),
        "test": len(test_rows),
        "over_max_samples": len(train_pos) - len(capped),
        "settings": {
            "validation": validation,
            "test": test,
            "max_samples": max_samples,
            "on_bad_row": settings.on_bad_row,
            "regenerate_enabled": settings.regenerate_enabled,
            "seed": settings.seed,
        },
    }
    log.info(
        "total: %d rows read, %d kept, %d duplicates, %d rejected -> %d training, %d validation, "
        "%d test (%d over max_samples=%s left out)",
        totals["rows_read"], totals["kept"], totals["duplicates"], totals["rejected"],
        len(capped), len(val_rows), len(test_rows), summary["over_max_samples"], max_samples,
    )
    return Collected(capped, val_rows, test_rows, spool.rejects, summary)


def _log_source(st: SourceStats) -> None:
    log.info(
        "%s (%s): %d rows read, %d kept, %d duplicates, %d rejected",
        st.path, st.format, st.rows_read, st.kept, st.duplicates, st.rejected,
    )
    if st.rejected:
        log.warning("%s: rejected %d rows (%s); see rejects.jsonl", st.path, st.rejected, _reasons(st))
    if st.changed:
        log.info("%s: kept rows changed as read: %s", st.path, ", ".join(f"{k}: {n}" for k, n in sorted(st.changed.items())))


def _reasons(st: SourceStats) -> str:
    return ", ".join(f"{code}: {n}" for code, n in sorted(st.rejected_reasons.items()))


def build_prompts(sources: Sequence[str], files: PromptFiles, settings: PromptsSettings = PromptsSettings()) -> dict:
    """The prompts stage: collect, then publish the five outputs (summary last). Returns the summary."""
    result = collect_prompts(sources, settings)
    conversation_file.write_encoded(files.prompts, result.train.lines())
    conversation_file.write_encoded(files.validation, result.validation.lines())
    conversation_file.write_encoded(files.test, result.test.lines())
    conversation_file.write(files.rejects, result.rejects)
    with atomic_file(files.summary, encoding="utf-8") as out:
        json.dump(result.summary, out, indent=1, ensure_ascii=False)
        out.write("\n")
    return result.summary


