"""What answering counts and logs: each conversation's counters (COUNTERS, Answered), their
sums (a shard's, the merged summary's), the progress lines and the closing summary line."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from tqdm import tqdm

log = logging.getLogger(__name__)

# Per-conversation counters; a shard's and the merged summary's are their sums.
COUNTERS = (
    "rows_in", "rows_out", "turns_generated", "answers_truncated", "answers_capped_by_context",
    "rows_skipped_prompt_too_long", "rows_shortened_prompt_too_long", "generated_tokens", "prompt_tokens",
    "tool_calls_generated", "tool_results_spliced", "rows_shortened_tool_results",
)


@dataclass
class Answered:
    """One conversation's outcome: its regenerated row (None when its first prompt does not fit
    max_model_len) and its counters (COUNTERS)."""

    index: int  # in the prompts file
    id: str
    row: dict | None
    stats: dict[str, int]


def sum_stats(stats: Iterable[dict[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(COUNTERS, 0)
    for s in stats:
        for k in COUNTERS:
            total[k] += s.get(k, 0)
    return total


class LogProgress(tqdm):
    """vLLM's progress bar, written to the log every 30 s instead of redrawn on a terminal."""

    def __init__(self, *args, **kwargs):
        kwargs.update(mininterval=30, file=io.StringIO(), ascii=True)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if str(self.desc).startswith("Rendering"):  # vLLM's chat rendering: a blink, a line a turn
            return True
        if self.n and self.n != getattr(self, "_logged_n", None):  # not the empty bar, not twice
            self._logged_n = self.n
            log.info("  %s", self.format_meter(**self.format_dict).strip())
        return True


class Progress:
    """Conversations done / total, tokens/s, time left and truncations so far, logged after
    every chunk (vLLM's own bar adds a line every 30 s within a chunk)."""

    def __init__(self, total: int, reused: Iterable[dict[str, int]] = ()):
        reused = list(reused)
        self.total, self.done, self.answered_now = total, len(reused), 0
        self.truncated = sum(s["answers_truncated"] for s in reused)
        self.answers = sum(s["turns_generated"] for s in reused)
        self.tokens_now = 0
        self.started = time.monotonic()

    def add(self, answered: Sequence[Answered]) -> None:
        self.done += len(answered)
        self.answered_now += len(answered)
        self.truncated += sum(a.stats["answers_truncated"] for a in answered)
        self.answers += sum(a.stats["turns_generated"] for a in answered)
        self.tokens_now += sum(a.stats["generated_tokens"] for a in answered)
        elapsed = max(time.monotonic() - self.started, 1e-9)
        left = timedelta(seconds=round(elapsed / self.answered_now * (self.total - self.done)))
        log.info(
            "progress: %d/%d conversations (%.1f%%), %.1f tok/s, about %s left, %d of %d answers truncated so far",
            self.done, self.total, 100 * self.done / max(self.total, 1), self.tokens_now / elapsed, left,
            self.truncated, self.answers,
        )

    @property
    def tokens_per_second(self) -> float:
        return round(self.tokens_now / max(time.monotonic() - self.started, 1e-9), 1)


def log_summary(stats: dict, max_new_tokens: int | None) -> None:
    log.info(
        "%d rows written (%d left out, %d shortened: prompt too long), %d answers truncated at %s tokens",
        stats["rows_out"], stats["rows_skipped_prompt_too_long"], stats["rows_shortened_prompt_too_long"],
        stats["answers_truncated"], max_new_tokens,
    )
