"""`results/eval/acceptance.json`'s per-prompt counts, and paired comparisons built on them.

Each draft of each prompt set (`sets.<set>.drafts.<draft>`) keeps `per_prompt`: one row per
prompt, in the set's order, from vLLM's per-request spec-decode metrics
(`per_request_spec_decode_metrics="summary"`), or, with `evaluate.per_prompt_counts:
separate_calls` (a vLLM that keeps none), from the counters around each prompt's own call
(`sets.<set>.drafts.<draft>.per_prompt_counts` then says whether they add up to the batched
call's), written one row to a line:

    "per_prompt": {"columns": ["id", "drafts", "draft_tokens", "accepted", "accepted_per_position"],
                   "rows": [["9f2c…", 41, 123, 17, [12, 4, 1]], ...]}

`drafts` are the prompt's target steps that verified a draft (vLLM's `num_spec_steps`),
`accepted_per_position[i]` the steps that accepted more than i draft tokens (from vLLM's
acceptance histogram); summed over the rows they are the set's own counters.

Two drafts measured on the same prompts are compared prompt by prompt (`paired_difference`):
the difference of their mean acceptance lengths (1 + accepted / drafts, summed over the
prompts), with a bootstrap that resamples prompts and uses the same resample for both drafts,
so what the prompts share (length, difficulty) cancels instead of widening two separate
intervals. Used by evaluation (trained − untrained, `sets.<set>.trained_minus_untrained`) and
by `benchmarks/compare_acceptance.py` (two evaluations).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

COLUMNS = ["id", "drafts", "draft_tokens", "accepted", "accepted_per_position"]
RESAMPLES = 2000


def resamples(n: int, seed: int = 0, count: int = RESAMPLES) -> Iterator[list[int]]:
    """`count` bootstrap resamples (indices drawn with replacement) of n items, seeded."""
    rng = random.Random(seed)
    for _ in range(count):
        yield [rng.randrange(n) for _ in range(n)]


def interval_95(estimates: list[float]) -> list[float]:
    """The 2.5th and 97.5th percentile of bootstrap estimates, rounded to 4 decimals."""
    ordered = sorted(estimates)
    return [round(ordered[int(0.025 * len(ordered))], 4), round(ordered[int(0.975 * len(ordered)) - 1], 4)]


# ---------------------------------------------------------------- the record


def per_prompt(prompt_ids: list[str], per_request: list[dict | None], k: int) -> dict | None:
    """The per-prompt block of one draft on one set; None when vLLM kept no metrics for some
    prompt (then no comparison can pair this set)."""
    if len(prompt_ids) != len(per_request) or any(m is None for m in per_request):
        return None
    rows = []
    for prompt_id, m in zip(prompt_ids, per_request, strict=True):
        histogram = list(m["acceptance_histogram"])  # steps that accepted j draft tokens, j = 0..k
        positions = [sum(histogram[i + 1 :]) for i in range(k)]
        rows.append([prompt_id, m["num_spec_steps"], m["num_draft_tokens"], m["num_accepted_draft_tokens"], positions])
    return {"columns": list(COLUMNS), "rows": rows}


def totals(block: dict) -> dict:
    """The rows summed: drafts, draft_tokens, accepted, accepted_per_position."""
    rows = block["rows"]
    k = max((len(r[4]) for r in rows), default=0)
    return {
        "drafts": sum(r[1] for r in rows),
        "draft_tokens": sum(r[2] for r in rows),
        "accepted": sum(r[3] for r in rows),
        "accepted_per_position": [sum(r[4][i] for r in rows if i < len(r[4])) for i in range(k)],
    }


def _numbers(value) -> bool:
    """A list of numbers, or of lists of numbers (per position, intervals): short enough for one line."""
    def number(x):
        return x is None or isinstance(x, int | float)

    return isinstance(value, list) and all(number(x) or (isinstance(x, list) and all(map(number, x))) for x in value)


def dumps(result: dict) -> str:
    """acceptance.json's text: indented like the rest of the project's JSON, with each
    per-prompt row on one line (a set of 50 prompts stays 50 lines per draft), as are lists
    of numbers (per position, intervals)."""
    inline: list[list] = []  # lists written on one line, each held by a placeholder string

    def hold(value: list) -> str:
        inline.append(value)
        return f"\0inline{len(inline) - 1}\0"

    def mark(node):
        if isinstance(node, dict):
            if node.get("columns") == COLUMNS and set(node) == {"columns", "rows"}:
                return {"columns": hold(node["columns"]), "rows": [hold(row) for row in node["rows"]]}
            return {key: mark(value) for key, value in node.items()}
        if _numbers(node):
            return hold(node)
        if isinstance(node, list):
            return [mark(value) for value in node]
        return node

    text = json.dumps(mark(result), indent=1)
    return re.sub(r'"\\u0000inline(\d+)\\u0000"', lambda m: json.dumps(inline[int(m.group(1))]), text) + "\n"


# ---------------------------------------------------------------- pairing


def _pooled(rows: list[list], sample: list[int] | range, k: int) -> tuple[float, list[float]]:
    """Mean acceptance length and acceptance per position of the sampled prompts, pooled as
    vLLM's counters pool them (1.0 and zeros when they hold no drafts, as vLLM reports)."""
    drafts = sum(rows[i][1] for i in sample)
    if not drafts:
        return 1.0, [0.0] * k
    accepted = sum(rows[i][3] for i in sample)
    return 1 + accepted / drafts, [sum(rows[i][4][p] for i in sample) / drafts for p in range(k)]


def intervals(block: dict, seed: int = 0, count: int = RESAMPLES) -> dict:
    """One draft's per-prompt block alone: its mean acceptance length and acceptance per position,
    each with a 95% bootstrap interval over the prompts (`count` resamples, seeded). The quality
    gate (tests/test_embedded_default.py) holds a new run to the recorded run's intervals."""
    rows = [r for r in block["rows"] if r[1]]  # prompts without drafts carry no acceptance
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} prompts with drafts: too few for an interval")
    k = min(len(r[4]) for r in rows)
    mean, positions = _pooled(rows, range(len(rows)), k)
    estimates = [_pooled(rows, sample, k) for sample in resamples(len(rows), seed, count)]
    return {
        "prompts": len(rows),
        "mean_acceptance_length": round(mean, 4),
        "bootstrap_95": interval_95([m for m, _ in estimates]),
        "acceptance_per_position": [round(x, 4) for x in positions],
        "acceptance_per_position_bootstrap_95": [interval_95([p[i] for _, p in estimates]) for i in range(k)],
    }


def pair(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> tuple[list[list], list[list]]:
    """The rows of two per-prompt blocks matched by prompt id (a repeated prompt's n-th row
    with the other's n-th); ValueError naming the ids that only one of them has."""
    count_a, count_b = Counter(r[0] for r in a["rows"]), Counter(r[0] for r in b["rows"])
    if count_a != count_b:
        only_a, only_b = sorted((count_a - count_b).elements()), sorted((count_b - count_a).elements())

        def show(ids):
            return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "") if ids else "none"

        raise ValueError(
            f"the two evaluations did not measure the same prompts ({len(a['rows'])} in {names[0]}, "
            f"{len(b['rows'])} in {names[1]}): only in {names[0]}: {show(only_a)}; only in {names[1]}: "
            f"{show(only_b)}. A paired comparison needs the same prompt set (same file, "
            "evaluate.max_prompts and max_model_len) in both."
        )
    by_id: dict[str, list[list]] = {}
    for row in b["rows"]:
        by_id.setdefault(row[0], []).append(row)
    return list(a["rows"]), [by_id[row[0]].pop(0) for row in a["rows"]]


def paired_difference(a: dict, b: dict, seed: int = 0, count: int = RESAMPLES, names: tuple[str, str] = ("A", "B")) -> dict:
    """a − b for two drafts' per-prompt blocks of the same prompts: the difference of mean
    acceptance lengths and of acceptance per position (positions both measured), each with a
    paired bootstrap 95% interval (`count` resamples of the prompts, seeded, the same resample
    for both). Prompts without drafts in either carry no acceptance and are left out, as in
    the set's `spread`; the interval is None with fewer than two prompts left."""
    rows_a, rows_b = pair(a, b, names)
    kept = [i for i in range(len(rows_a)) if rows_a[i][1] or rows_b[i][1]]
    rows_a, rows_b = [rows_a[i] for i in kept], [rows_b[i] for i in kept]
    if not rows_a:
        raise ValueError(f"no prompt holds a draft in {names[0]} or {names[1]}: nothing to compare")
    k = min(min(len(r[4]) for r in rows_a), min(len(r[4]) for r in rows_b))

    def difference(sample):
        (mean_a, pos_a), (mean_b, pos_b) = _pooled(rows_a, sample, k), _pooled(rows_b, sample, k)
        return mean_a - mean_b, [x - y for x, y in zip(pos_a, pos_b, strict=True)]

    everyone = range(len(rows_a))
    mean, positions = difference(everyone)
    result = {
        "prompts": len(rows_a),
        "mean_acceptance_lengths": [round(_pooled(rows_a, everyone, k)[0], 4), round(_pooled(rows_b, everyone, k)[0], 4)],
        "mean_acceptance_length": round(mean, 4),
        "bootstrap_95": None,
        "acceptance_per_position": [round(x, 4) for x in positions],
        "acceptance_per_position_bootstrap_95": None,
        "bootstrap": f"{count} paired resamples of the prompts (the same resample for both), seed {seed}"
        if len(rows_a) >= 2 else "none: one prompt",
    }
    if len(rows_a) >= 2:
        estimates = [difference(sample) for sample in resamples(len(rows_a), seed, count)]
        result["bootstrap_95"] = interval_95([m for m, _ in estimates])
        result["acceptance_per_position_bootstrap_95"] = [interval_95([p[i] for _, p in estimates]) for i in range(k)]
    return result


# ---------------------------------------------------------------- files


def read(path: str | Path) -> dict:
    """An acceptance.json, or the `acceptance` a benchmarks/results record (record_run.py) holds."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable acceptance.json ({error})") from error
    return data["acceptance"] if "sets" not in data and isinstance(data.get("acceptance"), dict) else data


def draft_block(result: dict, path: str | Path, prompt_set: str, draft: str) -> dict:
    """`sets.<prompt_set>.drafts.<draft>.per_prompt` of one acceptance.json, or ValueError saying
    which key is missing and what to do."""
    sets = result.get("sets", {})
    if prompt_set not in sets:
        raise ValueError(f"{path}: no prompt set {prompt_set!r} (sets: {', '.join(sets) or 'none'})")
    drafts = sets[prompt_set].get("drafts", {})
    if draft not in drafts:
        raise ValueError(f"{path}: set {prompt_set!r} has no draft {draft!r} (drafts: {', '.join(drafts) or 'none'})")
    block = drafts[draft].get("per_prompt")
    if not block:
        raise ValueError(
            f"{path}: sets.{prompt_set}.drafts.{draft} has no per_prompt counts (evaluated before draftline "
            "recorded them, or vLLM kept no per-request metrics: vLLM < 0.29, where "
            "`evaluate.per_prompt_counts: separate_calls` counts each prompt in a call of its own): rerun the "
            "evaluate step (`./draftline snakemake --forcerun evaluate results/eval/acceptance.json`)"
        )
    return block


def compare_files(
    path_a: str | Path, path_b: str | Path, prompt_set: str = "test", draft_a: str = "trained", draft_b: str = "trained",
    seed: int = 0, count: int = RESAMPLES,
) -> dict:
    """paired_difference of one draft in acceptance.json A and one in B on the same prompt set."""
    a = draft_block(read(path_a), path_a, prompt_set, draft_a)
    b = draft_block(read(path_b), path_b, prompt_set, draft_b)
    return paired_difference(a, b, seed=seed, count=count, names=(f"{path_a} ({draft_a})", f"{path_b} ({draft_b})"))
