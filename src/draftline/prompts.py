"""The prompts step: read, validate, de-duplicate and split the training conversations.

Every configured source (`draftline.sources`: the formats a user's data comes in) is read row
by row; each row becomes `{"id", "source", "messages"}` (`draftline.artifacts.conversations`),
exact duplicates collapse, and the seeded order puts the first rows into the validation and
test sets.

A bad row is never dropped silently: `on_bad_row="stop"` raises `PromptError` naming
`file:line`, the reason and the fix; `"skip"` writes it to rejects.jsonl and counts it.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts import conversations as conversation_file
from draftline.atomic import atomic_file
from draftline.sources import (
    BadRow,
    PromptError,
    SourceStats,
    check_sources,
    conversation_id,
    normalize_row,
    read_source,
    row_error,
)

log = logging.getLogger(__name__)


@dataclass
class Collected:
    train: list[dict]
    validation: list[dict]
    test: list[dict]
    rejects: list[dict]
    summary: dict


def collect_prompts(
    sources: Sequence[str],
    *,
    on_bad_row: str = "stop",
    validation: int = 0,
    test: int = 0,
    max_samples: int | None = None,
    seed: int = 0,
    regenerate_enabled: bool = True,
) -> Collected:
    """Read every source, validate, de-duplicate, shuffle, split: all in memory, nothing written."""
    if on_bad_row not in ("stop", "skip"):
        raise PromptError(f"prompts.on_bad_row is {on_bad_row!r} (fix: use stop or skip)")
    check_sources(sources, regenerate_enabled, on_bad_row="skip")  # existence only; rows below
    rows: list[dict] = []
    rejects: list[dict] = []
    stats: dict[str, SourceStats] = {}
    seen: set[str] = set()
    for source in sources:
        st = stats[source] = SourceStats(source)
        st.format, indexed, raw_rows = read_source(source)
        for raw in raw_rows:
            st.rows_read += 1
            try:
                if raw.error:
                    raise raw.error
                messages = normalize_row(raw.value, regenerate_enabled)
            except BadRow as bad:
                if on_bad_row == "stop":
                    raise row_error(source, raw.line, indexed, bad) from None
                st.rejected += 1
                st.rejected_reasons[bad.code] += 1
                rejects.append(
                    {"source": source, "line": raw.line, "code": bad.code, "reason": bad.reason,
                     "fix": bad.fix, "raw": raw.text}
                )
                continue
            row_id = conversation_id(messages)
            if row_id in seen:
                st.duplicates += 1
                continue
            seen.add(row_id)
            st.kept += 1
            rows.append({"id": row_id, "source": source, "messages": messages})
        _log_source(st)

    if not rows:
        reasons = Counter()
        for st in stats.values():
            reasons.update(st.rejected_reasons)
        raise PromptError(
            f"no usable conversations in {', '.join(sources)} (rejected: {dict(reasons)}; see the "
            "log) (fix: repair the rows or add sources)"
        )
    if validation + test >= len(rows):
        raise PromptError(
            f"prompts.validation + prompts.test is {validation} + {test} but only {len(rows)} distinct "
            "conversations were kept, leaving none for training (fix: lower them or add sources)"
        )

    # Held-out rows come off the shuffled order first (validation, then test), so max_samples
    # never changes them, and a run with a larger test set keeps the same validation set.
    random.Random(seed).shuffle(rows)
    val_rows, test_rows = rows[:validation], rows[validation : validation + test]
    train = rows[validation + test :]
    capped = train if max_samples is None else train[:max_samples]
    for split, chosen in (("validation", val_rows), ("test", test_rows), ("train", capped)):
        for row in chosen:
            setattr(stats[row["source"]], split, getattr(stats[row["source"]], split) + 1)

    per_source = [st.as_dict() for st in stats.values()]
    totals = {
        key: sum(s[key] for s in per_source)
        for key in ("rows_read", "kept", "duplicates", "rejected", "train", "validation", "test")
    }
    summary = {
        "sources": per_source,
        "totals": totals,
        "train": len(capped),
        "validation": len(val_rows),
        "test": len(test_rows),
        "over_max_samples": len(train) - len(capped),
        "settings": {
            "validation": validation,
            "test": test,
            "max_samples": max_samples,
            "on_bad_row": on_bad_row,
            "regenerate_enabled": regenerate_enabled,
            "seed": seed,
        },
    }
    log.info(
        "total: %d rows read, %d kept, %d duplicates, %d rejected -> %d training, %d validation, "
        "%d test (%d over max_samples=%s left out)",
        totals["rows_read"], totals["kept"], totals["duplicates"], totals["rejected"],
        len(capped), len(val_rows), len(test_rows), summary["over_max_samples"], max_samples,
    )
    return Collected(capped, val_rows, test_rows, rejects, summary)


def _log_source(st: SourceStats) -> None:
    log.info(
        "%s (%s): %d rows read, %d kept, %d duplicates, %d rejected",
        st.path, st.format, st.rows_read, st.kept, st.duplicates, st.rejected,
    )
    if st.rejected:
        log.warning(
            "%s: rejected %d rows (%s); see rejects.jsonl", st.path, st.rejected,
            ", ".join(f"{code}: {n}" for code, n in sorted(st.rejected_reasons.items())),
        )


def build_prompts(
    sources: Sequence[str],
    *,
    prompts_path: str | Path,
    validation_path: str | Path,
    test_path: str | Path,
    rejects_path: str | Path,
    summary_path: str | Path,
    on_bad_row: str = "stop",
    validation: int = 0,
    test: int = 0,
    max_samples: int | None = None,
    seed: int = 0,
    regenerate_enabled: bool = True,
) -> dict:
    """The prompts stage: collect, then publish the five outputs (summary last). Returns the summary."""
    result = collect_prompts(
        sources, on_bad_row=on_bad_row, validation=validation, test=test, max_samples=max_samples,
        seed=seed, regenerate_enabled=regenerate_enabled,
    )
    conversation_file.write(prompts_path, result.train)
    conversation_file.write(validation_path, result.validation)
    conversation_file.write(test_path, result.test)
    conversation_file.write(rejects_path, result.rejects)
    with atomic_file(summary_path, encoding="utf-8") as out:
        json.dump(result.summary, out, indent=1, ensure_ascii=False)
        out.write("\n")
    return result.summary


