"""What the rules run: every set with every draft in one call (evaluate), one set with one draft
(evaluate_set, rule evaluate_set) and the untrained draft on the headline set (evaluate_baseline);
each writes its record (draftline.artifacts.acceptance)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from draftline.artifacts import acceptance as record
from draftline.stages.evaluate.measure import checkpoint_record, measure_draft, target_alone
from draftline.stages.evaluate.per_prompt import trained_minus_untrained
from draftline.stages.evaluate.prompts import HEADLINE_SET, read_prompts, read_sets
from draftline.stages.evaluate.settings import EvaluateSettings

log = logging.getLogger(__name__)


def evaluate(
    target_dir: str | Path,
    prompt_sets: dict[str, str | Path],
    drafts: dict[str, str | Path],
    out_json: str | Path | None,
    settings: EvaluateSettings,
    baseline: str | None = None,
) -> dict:
    """Measure each draft (name -> checkpoint folder) against the target alone on every prompt
    set (name -> file); write out_json.

    `drafts` is typically {"trained": final/, "untrained": baseline/}: all in this one call, on
    the same prompts, with the same settings. Empty sets are skipped (named in the result).
    The draft named `baseline` (the untrained draft: it accepts next to nothing by construction)
    is measured on the headline set only, where the trained draft is compared against it; the
    named sets and validation then cost one pass each instead of two.
    """
    from draftline.runtime.atomic import atomic_file

    started = time.monotonic()
    chat_template = Path(settings.chat_template).read_text(encoding="utf-8") if settings.chat_template else None
    sets, empty = read_sets(prompt_sets, settings)
    headline = HEADLINE_SET if HEADLINE_SET in sets else next(iter(sets))
    log.info("prompt sets %s; target %s; drafts %s; %s", {n: len(p) for n, p in sets.items()}, target_dir, drafts, settings)
    alone = target_alone(target_dir, sets, settings, chat_template)
    skipped, reference = alone.skipped, alone.reference

    results: dict[str, dict] = {name: {} for name in sets}
    checkpoints = {}
    for draft, checkpoint in drafts.items():
        checkpoints[draft] = checkpoint_record(checkpoint)
        measured = {name: prompts for name, prompts in sets.items() if draft != baseline or name == headline}
        for name, numbers in measure_draft(alone, draft, checkpoint, measured).items():
            results[name][draft] = numbers

    per_set = {
        name: {
            "source": str(prompt_sets[name]),
            "prompts": len(sets[name]),
            "prompts_left_out": skipped[name],
            "prompt_ids": [p.id for p in sets[name]],
            "prompt_tokens": reference[name]["prompt_tokens"],
            "output_tokens": reference[name]["output_tokens"],
            "target_alone": {
                "output_tokens_per_s": reference[name]["output_tokens_per_s"],
                "seconds": reference[name]["seconds"],
                "counters": reference[name]["counters"],
            },
            "drafts": results[name],
            "trained_minus_untrained": trained_minus_untrained(results[name], name, settings.seed),
        }
        for name in sets
    }
    summary = {
        "num_speculative_tokens": settings.num_speculative_tokens,
        "headline_set": headline,
        # the headline set's numbers, as before sets existed (the report and summaries read them)
        "prompts": per_set[headline]["prompts"],
        "drafts": per_set[headline]["drafts"],
        "sets": per_set,
        "empty_sets": empty,
        "checkpoints": checkpoints,
        # every output of every draft identical to the target's own (check_lossless raised where more
        # differed than evaluate.lossless_tolerance allows; each set's draft names those that did)
        "lossless": all(d["lossless"]["identical"] == d["lossless"]["prompts"] for r in results.values() for d in r.values()),
        "baseline": {"draft": baseline, "sets": [headline]} if baseline in drafts else None,
        "timing": "each set's prompts in one batched greedy generate call per engine, after a warm-up request",
        "settings": {key: value for key, value in asdict(settings).items() if key != "threads"},
        "seconds": round(time.monotonic() - started, 1),
    }
    if out_json is not None:
        with atomic_file(out_json, encoding="utf-8") as handle:
            handle.write(record.dumps(summary))
    return summary


def evaluate_sets(target_dir: str | Path, prompt_sets: dict[str, str | Path], draft: tuple[str, str | Path],
                  out_jsons: dict[str, str | Path], settings: EvaluateSettings) -> dict:
    """Every set (name -> file) with one draft in one job (evaluate.sets_in_one_job): each engine
    starts once for all of them; each set's record (name -> out_jsons[name]) is the one its own
    `evaluate_set` job would write. The job's seconds go on the first set's record (the merge sums
    them), the others' say where they are."""
    from draftline.runtime.atomic import atomic_file

    filled = {name: path for name, path in prompt_sets.items() if read_prompts(path, settings.max_prompts)}
    summary = evaluate(target_dir, filled, dict([draft]), None, settings) if filled else None
    first = next(iter(filled), None)
    for name, out_json in out_jsons.items():
        if name not in filled:
            _write_empty(name, prompt_sets[name], out_json, settings)
            continue
        one = {**summary, "headline_set": name, "prompts": summary["sets"][name]["prompts"],
               "drafts": summary["sets"][name]["drafts"], "sets": {name: summary["sets"][name]}, "empty_sets": [],
               "timing": summary["timing"] + f"; every set in one job ({', '.join(filled)})",
               "seconds": summary["seconds"] if name == first else 0.0}
        with atomic_file(out_json, encoding="utf-8") as handle:
            handle.write(record.dumps(one))
    return summary or {}


def evaluate_set(target_dir: str | Path, prompt_set: tuple[str, str | Path], draft: tuple[str, str | Path],
                 out_json: str | Path, settings: EvaluateSettings) -> dict:
    """One prompt set (name, file) with one draft (name, checkpoint): a job of its own, so a new,
    edited or removed set reruns that set alone (its record: `evaluate`'s format with one set;
    `draftline.stages.evaluate_merge` gathers them). An empty set is recorded as empty, no engine
    loaded."""
    name, path = prompt_set
    if read_prompts(path, settings.max_prompts):
        return evaluate(target_dir, {name: path}, dict([draft]), out_json, settings)
    return _write_empty(name, path, out_json, settings)


def _write_empty(name: str, path: str | Path, out_json: str | Path, settings: EvaluateSettings) -> dict:
    from draftline.runtime.atomic import atomic_file

    log.info("%s (%s): no prompts; recorded as an empty set", name, path)
    summary = {"num_speculative_tokens": settings.num_speculative_tokens, "headline_set": None, "prompts": 0,
               "drafts": {}, "sets": {}, "empty_sets": [name], "checkpoints": {}, "lossless": True, "baseline": None,
               "settings": {key: value for key, value in asdict(settings).items() if key != "threads"}, "seconds": 0.0}
    with atomic_file(out_json, encoding="utf-8") as handle:
        handle.write(record.dumps(summary))
    return summary


def evaluate_baseline(target_dir: str | Path, prompt_sets: dict[str, str | Path], untrained: str | Path,
                      out_json: str | Path, settings: EvaluateSettings) -> dict:
    """The untrained draft on the headline set: the first of `prompt_sets` (test, then validation)
    that holds prompts. It depends on the config and vocab maps, not on training: retraining
    reruns the sets, never the baseline."""
    name = next((n for n, path in prompt_sets.items() if read_prompts(path, 1)), next(iter(prompt_sets)))
    return evaluate_set(target_dir, (name, prompt_sets[name]), ("untrained", untrained), out_json, settings)
