"""The summary as a dict (what summary.json holds: build_summary), each section read from its
stage's files with the warnings and notes it gives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from draftline.artifacts.checkpoint import chosen_epoch
from draftline.stages.summary.records import (
    _json,
    acceptance_table,
    cut_answers_repeating,
    disk_used,
    hidden_state_fidelity,
    wall_times,
)

# More than this share of answers cut at regenerate.max_new_tokens (not counting those cut while
# repeating themselves: records.repeats_itself): the draft learns to predict cut answers (no end of
# turn), and long answers are under-represented.
TRUNCATION_WARNING = 0.2


@dataclass(frozen=True)
class SummarySettings:
    """What the page names (build_summary's keywords): the run (run_name, by default the work
    folder's name), the target and the planned device, and where the stage wall times are read.
    Passed to the summary job as one param object, which Snakemake does not compare, so naming,
    moving or renaming a run reruns nothing; the target and device are plain params beside it."""

    run_name: str
    target: str
    device: str
    benchmarks: str = "results/benchmarks"


def build_summary(
    results: str | Path, *, run_name: str, target: str, device: str, benchmarks: str | Path | None = None
) -> dict:
    """The summary as a dict (what summary.json holds). Missing stage files leave their part out."""
    results = Path(results)
    benchmarks = Path(benchmarks) if benchmarks is not None else results / "benchmarks"
    prompts = _json(results / "prompts/summary.json") or {}
    regenerated = _json(results / "regenerated/summary.json")
    tokenized = _json(results / "tokenized/summary.json") or {}
    vocab = _json(results / "vocab/summary.json") or {}
    provenance = _json(results / "checkpoint/final/draftline_provenance.json") or {}
    acceptance = _json(results / "eval/acceptance.json")
    warnings: list[str] = []
    notes: list[str] = []

    data = {
        "prompts_train": prompts.get("train"), "prompts_validation": prompts.get("validation"),
        "prompts_test": prompts.get("test"), "prompts_rejected": (prompts.get("totals") or {}).get("rejected"),
        "prompts_duplicates": (prompts.get("totals") or {}).get("duplicates"),
        "tokenized_rows": tokenized.get("rows"), "tokens": tokenized.get("total_tokens"),
        "trainable_tokens": tokenized.get("trainable_tokens"), "max_seq_len": tokenized.get("max_seq_len"),
        "draft_vocab_size": vocab.get("draft_vocab_size"), "draft_vocab_coverage": vocab.get("coverage"),
    }
    if regenerated:
        data["generated_tokens"] = regenerated.get("generated_tokens")
    if tokenized.get("reasoning_tokens"):  # answers that think: their thinking and the rest, apart
        trained = "trained" if tokenized.get("reasoning") == "train" else "left out of the loss"
        data[f"reasoning_tokens ({trained}, tokenize.reasoning: {tokenized.get('reasoning')})"] = tokenized["reasoning_tokens"]
        data["answer_tokens (besides the reasoning)"] = tokenized.get("answer_tokens")
    sources = _sources(prompts, warnings)
    truncation = _truncation(results, regenerated, tokenized, warnings)
    training = _training(provenance, warnings)
    accept = acceptance_table(acceptance) if acceptance else pd.DataFrame()
    _acceptance_findings(accept, device, warnings, notes)
    disk = disk_used(results)
    times = wall_times(benchmarks)
    return {
        "run": run_name,
        "target": target,
        "device": device,
        "data": data,
        "sources": sources,
        "truncation": truncation,
        "training": training,
        "hidden_state_fidelity": hidden_state_fidelity(provenance),
        "acceptance": json.loads(accept.to_json(orient="records")) if not accept.empty else [],
        "headline_set": (acceptance or {}).get("headline_set"),
        "num_speculative_tokens": (acceptance or {}).get("num_speculative_tokens"),
        "lossless": (acceptance or {}).get("lossless"),
        "disk_bytes": dict(zip(disk["folder"], disk["bytes"].astype(int).tolist(), strict=True)),
        "disk_bytes_total": int(disk["bytes"].sum()),
        "wall_seconds": dict(zip(times["job"], times["seconds"].tolist(), strict=True)),
        "wall_seconds_per_stage": times.groupby("stage")["seconds"].sum().sort_values(ascending=False).to_dict(),
        "warnings": warnings,
        "notes": notes,
    }


def _sources(prompts: dict, warnings: list[str]) -> list[dict]:
    """Each prompt source's counts; a warning naming every source rows were left out of, and why."""
    sources = [
        {key: source.get(key) for key in ("path", "format", "rows_read", "kept", "duplicates", "rejected", "rejected_reasons",
                                       "changed")}
        for source in prompts.get("sources") or []
    ]
    rejected = [s for s in sources if s["rejected"]]
    if rejected:
        per_source = "; ".join(
            f"{s['rejected']} of {s['rows_read']} rows of {s['path']} ("
            + ", ".join(f"{code}: {n}" for code, n in sorted((s["rejected_reasons"] or {}).items())) + ")"
            for s in rejected
        )
        warnings.append(
            f"prompts.on_bad_row: skip left out {sum(s['rejected'] for s in rejected)} rows: {per_source}; each "
            "with its reason and fix in results/prompts/rejects.jsonl"
        )
    return sources


def _truncation(results: Path, regenerated: dict | None, tokenized: dict, warnings: list[str]) -> dict:
    """Answers cut at regenerate.max_new_tokens (those cut while looping counted apart) and
    conversations cut at tokenize.max_seq_len; a warning when too many answers were cut mid-thought."""
    truncation: dict = {}
    if regenerated:
        answers = regenerated.get("turns_generated") or 0
        cut = regenerated.get("answers_truncated") or 0
        max_new = (regenerated.get("settings") or {}).get("max_new_tokens")
        repeating = cut_answers_repeating(results / "regenerated/conversations.jsonl") or 0
        truncation["answers"] = answers
        truncation["answers_cut_at_max_new_tokens"] = cut
        truncation["answers_cut_share"] = cut / answers if answers else None
        truncation["answers_cut_repeating"] = repeating
        truncation["max_new_tokens"] = max_new
        if answers and (cut - repeating) / answers > TRUNCATION_WARNING:
            warnings.append(
                f"{(cut - repeating) / answers:.0%} of the regenerated answers ({cut - repeating} of {answers}) were cut at "
                f"regenerate.max_new_tokens = {max_new} (more than {TRUNCATION_WARNING:.0%}; {repeating} more cut "
                "while repeating themselves are not counted): the draft learns few answer endings; raise "
                "regenerate.max_new_tokens (results/regenerated/summary.json)"
            )
    if tokenized:
        rows_in = tokenized.get("rows_in") or 0
        truncation["conversations_cut_at_max_seq_len"] = tokenized.get("rows_truncated")
        truncation["conversations_cut_share"] = (tokenized.get("rows_truncated") or 0) / rows_in if rows_in else None
    return truncation


def _training(provenance: dict, warnings: list[str]) -> dict:
    """What the published draft's training chose and measured; a warning for skipped samples."""
    if not provenance:
        return {}
    throughput = provenance.get("throughput") or {}
    training = {
        "chosen_epoch": chosen_epoch(provenance), "epochs": provenance.get("epochs"),
        "reason": provenance.get("reason"), "optimizer": provenance.get("optimizer"),
        "device": provenance.get("device"), "world_size": provenance.get("world_size"),
        # over every step (start-up and compilation included) and at the median step (steady)
        "tokens_per_s": throughput.get("tokens_per_s"),
        "median_step_tokens_per_s": throughput.get("median_step_tokens_per_s"),
        # samples the Trainer skipped without hidden states (online: the server gave none)
        "skipped_samples": provenance.get("skipped_samples"),
        # samples speculators' sampler cut at train.total_seq_len or left out of an epoch
        "dropped_samples": provenance.get("dropped_samples"),
    }
    skipped = training["skipped_samples"] or {}
    if skipped.get("total"):
        warnings.append(
            f"speculators' Trainer skipped {skipped['total']} sample(s) without hidden states "
            f"({skipped.get('training', 0)} in training, {skipped.get('validation', 0)} in validation; "
            f"hidden_states.online_max_skipped_samples allows {skipped.get('allowed')}): the server gave none "
            "for them, see logs/train.log (results/checkpoint/final/draftline_provenance.json)"
        )
    return training


def _acceptance_findings(accept: pd.DataFrame, device: str, warnings: list[str], notes: list[str]) -> None:
    """A speed-up below 1 with the trained draft: a note on the CPU (nothing to act on there), a
    warning on a GPU (serving with the draft would be slower); a warning when the trained draft
    accepts no more than the untrained one on the headline set."""
    if accept.empty:
        return
    slow = accept[(accept["draft"] == "trained") & (accept["speedup"] < 1)]
    where = ", ".join(f"{row.speedup:.2f} on the {row.set} set" for row in slow.itertuples())
    if len(slow) and device == "cpu":
        notes.append(
            f"speed-up below 1 with the trained draft ({where}), measured on the CPU: there decoding is "
            "compute-bound and speculation cannot pay off; acceptance is what carries over to a GPU "
            "(results/eval/acceptance.json)"
        )
    elif len(slow):
        warnings.append(
            f"speed-up below 1 with the trained draft ({where}), measured on {device}: served this way, the "
            "draft makes decoding slower than the target alone. A very small target is bound by kernel "
            "launches and gains nothing from any draft (the embedded 135M target on an H100: "
            "benchmarks/cuda/results/h100_pipeline_whole_dag_2026-12-05.md); on a large target, "
            "train on more data or epochs, or serve with fewer speculative tokens (results/eval/acceptance.json)"
        )
    headline = accept[(accept["draft"] == "trained") & accept["headline"]]
    speedup = headline["batch1_speedup"].iloc[0] if "batch1_speedup" in accept and len(headline) else None
    if speedup is not None and not pd.isna(speedup) and speedup < 1:
        row = headline.iloc[0]
        notes.append(
            f"at batch 1 the trained draft is slower than the target alone on the {row['set']} set (speed-up "
            f"{row['batch1_speedup']:.3f}): one speculative step (the draft's k proposals and the target's "
            f"verification) costs {row['batch1_step_in_target_steps']:.2f} steps of the target alone and yields "
            f"{row['batch1_tokens_per_step']:.2f} tokens; it pays off once a step yields more tokens than it costs "
            "(results/eval/acceptance.json, each set's `batch1`)"
        )
    trained = accept[(accept["draft"] == "trained") & accept["headline"]]
    untrained = accept[(accept["draft"] == "untrained") & accept["headline"]]
    if len(trained) and len(untrained) and trained["mean_acceptance_length"].iloc[0] <= untrained["mean_acceptance_length"].iloc[0]:
        warnings.append(
            "the trained draft accepts no more than the untrained one on the headline set: more data or "
            "epochs, or a look at the loss plot (results/eval/acceptance.json)"
        )
