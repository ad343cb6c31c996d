"""vLLM's spec-decode counters (`LLM.get_metrics()`): read, differenced around one call, and
turned into acceptance numbers (acceptance)."""

from __future__ import annotations

# vLLM's counter names (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py)
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PROMPT_TOKENS, GENERATION_TOKENS)


def read_counters(metrics) -> dict:
    """vLLM's counters this evaluation uses, summed over label sets (engines)."""
    counters: dict = {name: 0 for name in COUNTERS}
    per_pos: list[int] = []
    for metric in metrics:
        if metric.name in counters and hasattr(metric, "value"):
            counters[metric.name] += int(metric.value)
        elif metric.name == ACCEPTED_PER_POS and hasattr(metric, "values"):
            for i, value in enumerate(metric.values):
                if i == len(per_pos):
                    per_pos.append(0)
                per_pos[i] += int(value)
    counters[ACCEPTED_PER_POS] = per_pos
    return counters


def counter_delta(before: dict, after: dict) -> dict:
    delta = {name: after[name] - before[name] for name in COUNTERS}
    b, a = before[ACCEPTED_PER_POS], after[ACCEPTED_PER_POS]
    b = b + [0] * (len(a) - len(b))
    delta[ACCEPTED_PER_POS] = [x - y for x, y in zip(a, b, strict=False)]
    return delta


def request_metrics(delta: dict, k: int) -> dict:
    """One call of one prompt: its counter deltas in the shape of vLLM's per-request spec-decode
    metrics (what `per_request_spec_decode_metrics` gives where the engine keeps them)."""
    positions = list(delta[ACCEPTED_PER_POS]) + [0] * (k - len(delta[ACCEPTED_PER_POS]))
    # steps that accepted exactly j draft tokens, j = 0..k (a step accepting j counts at positions < j)
    histogram = [delta[DRAFTS] - positions[0], *(positions[j - 1] - positions[j] for j in range(1, k)), positions[k - 1]]
    return {"num_spec_steps": delta[DRAFTS], "num_draft_tokens": delta[DRAFT_TOKENS],
            "num_accepted_draft_tokens": delta[ACCEPTED], "acceptance_histogram": histogram}


def acceptance(counters: dict, k: int) -> dict:
    """Acceptance numbers from one run's counter deltas; checks vLLM's counters agree."""
    drafts, draft_tokens, accepted = counters[DRAFTS], counters[DRAFT_TOKENS], counters[ACCEPTED]
    per_pos = counters[ACCEPTED_PER_POS]
    if drafts <= 0 or draft_tokens <= 0:
        raise RuntimeError(
            f"vLLM counted no drafts ({DRAFTS}={drafts}, {DRAFT_TOKENS}={draft_tokens}): "
            "speculative decoding did not run; see the engine log above"
        )
    if not (accepted <= draft_tokens <= drafts * k) or sum(per_pos) != accepted or len(per_pos) > k:
        raise RuntimeError(f"vLLM's spec-decode counters disagree with each other (k={k}): {counters}")
    return {
        "acceptance_rate": accepted / draft_tokens,
        "mean_acceptance_length": 1 + accepted / drafts,
        "acceptance_per_position": [n / drafts for n in per_pos] + [0.0] * (k - len(per_pos)),
    }
