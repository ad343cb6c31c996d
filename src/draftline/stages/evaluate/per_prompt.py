"""Each prompt's counts (vLLM's per-request spec-decode metrics): the spread of a set's mean
acceptance length (spread), their check against the set's counters (check_per_prompt) and the
trained draft against the untrained one, prompt by prompt (trained_minus_untrained)."""

from __future__ import annotations

import logging

from draftline.artifacts import acceptance as record
from draftline.artifacts.acceptance import RESAMPLES, interval_95, resamples
from draftline.stages.evaluate.counters import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS

log = logging.getLogger(__name__)


def spread(per_request: list[dict | None], seed: int = 0, count: int = RESAMPLES) -> dict | None:
    """Per-prompt mean acceptance lengths (min/median/max) and a bootstrap 95% interval of the
    set's mean acceptance length (accepted / steps summed over prompts resampled with
    replacement), from vLLM's per-request metrics; None when the engine kept none."""
    rows = [(m["num_accepted_draft_tokens"], m["num_spec_steps"]) for m in per_request if m and m["num_spec_steps"]]
    if len(rows) < 2:
        return None
    per_prompt = sorted(1 + a / n for a, n in rows)
    estimates = [
        1 + sum(rows[i][0] for i in sample) / sum(rows[i][1] for i in sample) for sample in resamples(len(rows), seed, count)
    ]
    return {
        "prompts": len(rows),
        "per_prompt_mean_acceptance_length": {
            "min": round(per_prompt[0], 4),
            "median": round(per_prompt[len(per_prompt) // 2], 4),
            "max": round(per_prompt[-1], 4),
        },
        "bootstrap_95": interval_95(estimates),
        "bootstrap": f"{count} resamples of the set's prompts, seed {seed}",
    }


def as_totals(counters: dict, positions: int) -> dict:
    """A call's counters in the shape of summed per-prompt rows (record.totals), the per-position
    counts padded to `positions` (vLLM leaves the later positions out while none reached them)."""
    per_pos = counters[ACCEPTED_PER_POS]
    return {"drafts": counters[DRAFTS], "draft_tokens": counters[DRAFT_TOKENS], "accepted": counters[ACCEPTED],
            "accepted_per_position": per_pos + [0] * (positions - len(per_pos))}


def check_per_prompt(block: dict | None, counters: dict, where: str) -> None:
    """The per-prompt counts must add up to the set's counters: both are vLLM's record of the
    same generate call, and a paired comparison trusts the rows."""
    if block is None:
        log.warning("%s: vLLM returned no per-request spec-decode metrics for some prompt: no per-prompt counts", where)
        return
    summed = record.totals(block)
    expected = as_totals(counters, len(summed["accepted_per_position"]))
    if summed != expected:
        raise RuntimeError(
            f"{where}: vLLM's per-request spec-decode metrics sum to {summed}, its counters for the same call to "
            f"{expected}: they do not describe the same run"
        )


def separate_calls_agree(block: dict, batched: dict, token_ids: list[list[int]], where: str) -> dict:
    """evaluate.per_prompt_counts separate_calls: whether the prompts' own calls gave the batched
    call's outputs and, summed, its counters (on CPU they do; on a GPU a batch can round otherwise
    and pick another greedy token); the set's figure stays the batched call's."""
    summed = record.totals(block)
    counters = batched["counters"]
    same_counts = summed == as_totals(counters, len(summed["accepted_per_position"]))
    other_outputs = sum(a != b for a, b in zip(token_ids, batched["token_ids"], strict=True))
    if not same_counts:
        log.warning("%s: the prompts' own calls sum to %s, the batched call's counters are %s (%d of %d outputs differ "
                    "from the batched call's): the per-prompt counts and interval describe the separate calls",
                    where, summed, counters, other_outputs, len(token_ids))
    return {"source": "separate_calls", "same_counts_as_batched": same_counts, "outputs_unlike_batched": other_outputs}


def trained_minus_untrained(drafts: dict, name: str, seed: int) -> dict | None:
    """The paired difference of the trained and the untrained draft on one set (the same prompts,
    the same resamples), when both were measured with per-prompt counts."""
    trained, untrained = drafts.get("trained", {}).get("per_prompt"), drafts.get("untrained", {}).get("per_prompt")
    if not (trained and untrained):
        return None
    difference = record.paired_difference(trained, untrained, seed=seed, names=("trained", "untrained"))
    log.info("%s, trained - untrained: mean acceptance length %+.4f (paired 95%% bootstrap %s)",
             name, difference["mean_acceptance_length"], difference["bootstrap_95"])
    return difference
