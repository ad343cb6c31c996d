"""results/eval/acceptance.json from the evaluation's own records: one per prompt set
(`results/eval/sets/<set>.json`, the trained draft) and the untrained baseline's
(`results/eval/untrained_draft.json`, on the headline set), each written by a job of its own
(draftline.stages.evaluate), so a new, edited or removed set reruns that set's job and this one.

The result has the format one evaluation of every set wrote before the sets were split: `sets`
in the configured order (validation, test, the named sets), the headline set's `drafts` at the
top, the untrained draft beside the trained one on the headline set with their paired
difference (`trained_minus_untrained`, from the per-prompt counts of both records), `empty_sets`,
and `records`: the file each set's numbers come from.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftline.artifacts import acceptance as record

log = logging.getLogger(__name__)

HEADLINE_SET = "test"


def _read(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable evaluation record ({error}); rerun its evaluate_set job") from error


def merge(sets: dict[str, str | Path], baseline: str | Path | None, out_json: str | Path) -> dict:
    """Gather the per-set records (name -> file, in the configured order) and the baseline's
    record into out_json."""
    from draftline.runtime.atomic import atomic_file

    summary = gather(sets, baseline)
    with atomic_file(out_json, encoding="utf-8") as handle:
        handle.write(record.dumps(summary))
    return summary


def gather(sets: dict[str, str | Path], baseline: str | Path | None = None) -> dict:
    """What results/eval/acceptance.json holds, from the per-set records (name -> file) and the
    baseline's record (None: no baseline measured yet)."""
    records = {name: _read(path) for name, path in sets.items()}
    per_set = {name: r["sets"][name] for name, r in records.items() if name in r.get("sets", {})}
    if not per_set:
        raise ValueError(
            f"no prompts to evaluate on in {', '.join(sets)}: set prompts.validation or prompts.test "
            "above 0, or name a non-empty file in evaluate.prompt_sets"
        )
    headline = HEADLINE_SET if HEADLINE_SET in per_set else next(iter(per_set))
    first = records[headline]
    checkpoints = {"trained": first["checkpoints"]["trained"]}
    measured_baseline = _add_baseline(per_set, _read(baseline) if baseline else None, first["settings"]["seed"])
    if measured_baseline:
        checkpoints["untrained"] = measured_baseline["checkpoint"]
    summary = {
        "num_speculative_tokens": first["num_speculative_tokens"],
        "headline_set": headline,
        # the headline set's numbers (the report and summaries read them)
        "prompts": per_set[headline]["prompts"],
        "drafts": per_set[headline]["drafts"],
        "sets": per_set,
        "empty_sets": sorted(name for name in sets if name not in per_set),
        "checkpoints": checkpoints,
        "lossless": all(r["lossless"] for r in records.values()),
        "baseline": {"draft": "untrained", "sets": [measured_baseline["set"]]} if measured_baseline else None,
        "timing": "each set's prompts in one batched greedy generate call per engine, after a warm-up request; "
                  "one job per set",
        "settings": first["settings"],
        "seconds": round(sum(r["seconds"] for r in records.values()), 1),
        "records": {name: str(path) for name, path in sets.items()} | ({"untrained": str(baseline)} if baseline else {}),
    }
    return summary


def _add_baseline(per_set: dict, baseline: dict | None, seed: int) -> dict | None:
    """The untrained draft's numbers beside the trained draft's on the set it was measured on
    (the same prompts: checked), with their paired difference; what was added, or None."""
    if not baseline or not baseline.get("sets"):
        return None
    (name, measured), = baseline["sets"].items()
    if name not in per_set:
        return None
    if measured["prompt_ids"] != per_set[name]["prompt_ids"]:
        raise ValueError(f"the untrained draft was measured on other prompts of {name!r} than the trained one: "
                         "rerun evaluate_baseline")
    drafts = per_set[name]["drafts"] = {**per_set[name]["drafts"], "untrained": measured["drafts"]["untrained"]}
    difference = None
    if drafts["trained"].get("per_prompt") and drafts["untrained"].get("per_prompt"):
        difference = record.paired_difference(drafts["trained"]["per_prompt"], drafts["untrained"]["per_prompt"],
                                              seed=seed, names=("trained", "untrained"))
        log.info("%s, trained - untrained: mean acceptance length %+.4f (paired 95%% bootstrap %s)",
                 name, difference["mean_acceptance_length"], difference["bootstrap_95"])
    per_set[name]["trained_minus_untrained"] = difference
    return {"set": name, "checkpoint": baseline["checkpoints"]["untrained"]}
