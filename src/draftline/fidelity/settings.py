"""What the fidelity check is given: `hidden_states.fidelity` with its `auto` bar resolved
(FidelitySettings, resolve_min_top1) and the rows it reads (sample_rows); and what it raises
(FidelityError)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# `auto` bars for hidden_states.fidelity.min_top1, from benchmarks/results/hidden_state_fidelity.md
# (docs/hidden-states.md, "Hidden-state fidelity", says which failures each catches)
AUTO_MIN_TOP1_GREEDY = 0.8  # greedy regenerated answers: the target's own top-1 tokens (re-tokenized)
AUTO_MIN_TOP1_OTHER = 0.2  # the dataset's own answers, or answers sampled at temperature > 0


class FidelityError(ValueError):
    """Stored hidden states that are not the target's (or a target whose head cannot be read)."""


@dataclass(frozen=True)
class FidelitySettings:
    """`hidden_states.fidelity`, its `auto` bar resolved (`resolve_min_top1`): what the rules pass."""

    rows: int = 8  # rows measured per shard (0 = no check)
    min_top1: float = AUTO_MIN_TOP1_GREEDY
    basis: str = "greedy regenerated answers"  # why this bar (shown in errors and the summary)
    recompute_rows: int = 2  # of those, rows recomputed by a plain forward (`recompute`; 0 = none)

    @classmethod
    def from_param(cls, param: dict | None) -> FidelitySettings:
        return cls(**param) if param else cls(rows=0)


def resolve_min_top1(value, regenerate_enabled: bool, temperature: float) -> tuple[float, str]:
    """The bar for `hidden_states.fidelity.min_top1` and where it comes from. `auto`: greedy
    regenerated answers are the target's own top-1 tokens (a high bar); the dataset's own answers
    or sampled ones are not, so only a lower bar separates right states from wrong ones there."""
    if value != "auto":
        return float(value), "set in hidden_states.fidelity.min_top1"
    if not regenerate_enabled:
        return AUTO_MIN_TOP1_OTHER, "auto: the dataset's own answers (regenerate.enabled false)"
    if temperature > 0:
        return AUTO_MIN_TOP1_OTHER, f"auto: answers sampled at regenerate.temperature {temperature}"
    return AUTO_MIN_TOP1_GREEDY, "auto: greedy regenerated answers"


def sample_rows(rows: Sequence[int], n: int) -> list[int]:
    """`n` rows spread evenly over `rows` (the middle of each of n equal parts): deterministic,
    and not only the first rows of a shard."""
    rows = list(rows)
    if n >= len(rows):
        return rows
    return [rows[(2 * i + 1) * len(rows) // (2 * n)] for i in range(n)]
