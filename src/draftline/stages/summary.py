"""One page per run: `results/summary.md` and `results/summary.json`, read from what the stages wrote.

What it holds: the run's name and target, data counts (prompts, regenerated answers, tokenized
rows and tokens), each prompt source's rows read, kept, duplicated and rejected (with the
reasons), truncation shares (answers cut at regenerate.max_new_tokens, conversations cut at
tokenize.max_seq_len), disk used per results folder, stage wall times (Snakemake's benchmark
files, longest first), the published epoch (counted from 1, as in every log) and the samples the
Trainer skipped without hidden states, acceptance per prompt set (trained vs untrained draft, per
position), the hidden-state fidelity check (draftline.fidelity, from the checkpoint's
provenance), warnings a user should act on, and notes (facts of the setup, e.g. a speed-up
below 1 on the CPU, where nothing is to be done).
Nothing here is measured again: every figure names the file it comes from.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from draftline import algorithms
from draftline.artifacts.benchmarks import read_benchmarks
from draftline.artifacts.checkpoint import chosen_epoch
from draftline.runtime.atomic import atomic_file

log = logging.getLogger(__name__)

# More than this share of answers cut at regenerate.max_new_tokens (not counting those cut while
# repeating themselves, below): the draft learns to predict cut answers (no end of turn), and long
# answers are under-represented.
TRUNCATION_WARNING = 0.2
# An answer "repeats itself" when, among its last LOOP_WINDOW words (every number read as one
# symbol, so a numbered list that goes on counts), at most LOOP_DISTINCT of the word trigrams
# differ. Greedy decoding of a small target falls into such loops; a larger max_new_tokens would
# not end them, only lengthen them (on the embedded default: benchmarks/results/default_tuning.md).
LOOP_WINDOW, LOOP_DISTINCT = 60, 0.5


def repeats_itself(text: str) -> bool:
    """Whether an answer ends in a loop (see LOOP_WINDOW)."""
    words = re.sub(r"\d+", "#", text).split()[-LOOP_WINDOW:]
    if len(words) < LOOP_WINDOW:
        return False
    trigrams = list(zip(words, words[1:], words[2:]))
    return len(set(trigrams)) <= LOOP_DISTINCT * len(trigrams)


def cut_answers_repeating(conversations: Path) -> int | None:
    """How many answers the regenerate stage marked `"truncated"` end in a loop (None: no file)."""
    if not conversations.is_file():
        return None
    count = 0
    with conversations.open(encoding="utf-8") as lines:
        for line in lines:
            for message in json.loads(line).get("messages") or []:
                count += bool(message.get("truncated")) and repeats_itself(message.get("content") or "")
    return count


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path`, links not followed (the training view is links)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def disk_used(results: Path) -> pd.DataFrame:
    """Bytes per top-level results folder (checkpoint/runs apart: every epoch with its optimizer state)."""
    rows = []
    for child in sorted(results.iterdir()) if results.is_dir() else []:
        if child.name == "checkpoint" and child.is_dir():
            for sub in sorted(child.iterdir()):
                rows.append({"folder": f"checkpoint/{sub.name}", "bytes": folder_bytes(sub)})
        elif child.is_dir() and not child.name.startswith("."):
            rows.append({"folder": child.name, "bytes": folder_bytes(child)})
    frame = pd.DataFrame(rows, columns=["folder", "bytes"])
    return frame.sort_values("bytes", ascending=False, ignore_index=True)


def wall_times(benchmarks: Path) -> pd.DataFrame:
    """One row per job (the benchmark file's path), longest first, with the stage it belongs to."""
    times = read_benchmarks(benchmarks, exclude=()) if benchmarks.is_dir() else {}
    frame = pd.DataFrame([{"job": name, "seconds": s} for name, s in times.items()], columns=["job", "seconds"])
    frame["stage"] = frame["job"].str.split("/").str[0]
    return frame.sort_values("seconds", ascending=False, ignore_index=True)


def acceptance_table(acceptance: dict) -> pd.DataFrame:
    """Per prompt set and draft: mean acceptance length [interval], rate, per position, tok/s, speed-up."""
    k = int(acceptance["num_speculative_tokens"])
    rows = []
    for name, block in (acceptance.get("sets") or {}).items():
        for draft, numbers in block["drafts"].items():
            interval = (numbers.get("spread") or {}).get("bootstrap_95")
            per_position = list(numbers.get("acceptance_per_position") or [None] * k)
            rows.append({
                "set": name, "headline": name == acceptance.get("headline_set"), "prompts": block.get("prompts"),
                "draft": draft, "mean_acceptance_length": numbers.get("mean_acceptance_length"),
                "interval_95": interval, "acceptance_rate": numbers.get("acceptance_rate"),
                **{f"position_{i + 1}": per_position[i] for i in range(k)},
                "output_tokens_per_s": numbers.get("output_tokens_per_s"), "speedup": numbers.get("speedup"),
            })
    return pd.DataFrame(rows)


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
        {key: source.get(key) for key in ("path", "format", "rows_read", "kept", "duplicates", "rejected", "rejected_reasons")}
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
    training = {
        "chosen_epoch": chosen_epoch(provenance), "epochs": provenance.get("epochs"),
        "reason": provenance.get("reason"), "optimizer": provenance.get("optimizer"),
        "device": provenance.get("device"), "world_size": provenance.get("world_size"),
        "tokens_per_s": (provenance.get("throughput") or {}).get("tokens_per_s"),
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
    """A note for a speed-up below 1 on the CPU (nothing to act on there); a warning when the
    trained draft accepts no more than the untrained one on the headline set."""
    if accept.empty:
        return
    if device == "cpu":
        slow = accept[(accept["draft"] == "trained") & (accept["speedup"] < 1)]
        if len(slow):
            where = ", ".join(f"{row.speedup:.2f} on the {row.set} set" for row in slow.itertuples())
            notes.append(
                f"speed-up below 1 with the trained draft ({where}), measured on the CPU: there decoding is "
                "compute-bound and speculation cannot pay off; acceptance is what carries over to a GPU "
                "(results/eval/acceptance.json)"
            )
    trained = accept[(accept["draft"] == "trained") & accept["headline"]]
    untrained = accept[(accept["draft"] == "untrained") & accept["headline"]]
    if len(trained) and len(untrained) and trained["mean_acceptance_length"].iloc[0] <= untrained["mean_acceptance_length"].iloc[0]:
        warnings.append(
            "the trained draft accepts no more than the untrained one on the headline set: more data or "
            "epochs, or a look at the loss plot (results/eval/acceptance.json)"
        )


def hidden_state_fidelity(provenance: dict) -> dict | None:
    """The fidelity check the trained states passed (offline: every shard's, online: the server's
    rows), from the checkpoint's provenance; None when it did not run (hidden_states.fidelity.rows 0)."""
    hidden = provenance.get("hidden_states") or {}
    record = hidden.get("fidelity")
    if not record:
        return None
    total = record.get("total") if "total" in record else record  # offline: the view's total over shards
    if not total:
        return None
    rows = total.get("rows")
    return {
        "mode": hidden.get("mode"),
        "rows": len(rows) if isinstance(rows, list) else rows,
        "assistant_tokens": total.get("assistant_tokens"),
        "top1_assistant": total.get("top1_assistant"),
        "lowest_shard_top1_assistant": total.get("lowest_shard_top1_assistant"),
        "min_top1": total.get("min_top1"),
        "basis": total.get("basis"),
        # offline: every shard counts; one made without the check is named, not left out
        "unchecked_shards": total.get("unchecked_shards") or [],
        "bars": total.get("bars") if len(set((total.get("bars") or {}).values())) > 1 else None,
    }


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def to_markdown(summary: dict) -> str:
    lines = [f"# {summary['run']}: draft for {summary['target']}", ""]
    if summary["warnings"]:
        lines += ["## Warnings", "", *[f"- {w}" for w in summary["warnings"]], ""]
    if summary.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in summary["notes"]], ""]
    acceptance = pd.DataFrame(summary["acceptance"])
    if not acceptance.empty:
        k = summary["num_speculative_tokens"]
        lines += [f"## Acceptance (k = {k}; headline: the {summary['headline_set']} set)", ""]
        lines += ["| set | prompts | draft | mean acceptance length [95%] | " + " | ".join(f"pos {i + 1}" for i in range(k))
                  + " | tok/s | speed-up |", "|---" * (6 + k) + "|"]
        for row in acceptance.to_dict("records"):
            interval = row.get("interval_95")
            mal = _fmt(row["mean_acceptance_length"]) + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
            cells = [row["set"] + (" (headline)" if row["headline"] else ""), _fmt(row["prompts"]), row["draft"], mal,
                     *[_fmt(row.get(f"position_{i + 1}")) for i in range(k)],
                     f"{row['output_tokens_per_s']:.1f}" if row.get("output_tokens_per_s") is not None else "n/a",
                     _fmt(row.get("speedup"))]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"Every speculative output identical to the target's own: {summary['lossless']}.", ""]
    training = summary["training"]
    if training:
        lines += ["## Training", "",
                  f"Published epoch {training['chosen_epoch']} of {training['epochs']} ({training['reason']}); "
                  f"{training['optimizer']} on {training['device']} x {training['world_size']}, "
                  f"{training['tokens_per_s'] or 0:.0f} tokens/s.", ""]
        skipped = training.get("skipped_samples")
        if skipped is not None:
            lines[-1:-1] = [
                f"Samples skipped without hidden states: {skipped['total']} ({skipped['training']} in training, "
                f"{skipped['validation']} in validation; {skipped['allowed']} allowed).",
            ]
    fidelity = summary.get("hidden_state_fidelity")
    if fidelity:
        lowest = fidelity.get("lowest_shard_top1_assistant")
        lines += ["## Hidden-state fidelity", "",
                  f"Checked before training ({fidelity['mode']}): the target's own final norm + lm_head on the stored "
                  f"last layer predicts the next token on {_fmt(fidelity['top1_assistant'])} of "
                  f"{fidelity['assistant_tokens']} assistant positions in {fidelity['rows']} rows"
                  + (f" (lowest shard {_fmt(lowest)})" if lowest is not None else "")
                  + f"; bar {fidelity['min_top1']} ({fidelity['basis']}). Every stored layer non-zero, varying over "
                  "tokens and distinct from the others."
                  + ("".join(f" Bar of {shard}: {bar}." for shard, bar in sorted(fidelity["bars"].items()))
                     if fidelity.get("bars") else "")
                  + (f" **Not checked** (made without the check): {', '.join(fidelity['unchecked_shards'])}."
                     if fidelity.get("unchecked_shards") else ""), ""]
    data, truncation = summary["data"], summary["truncation"]
    lines += ["## Data", "", "| what | count |", "|---|---|"]
    lines += [f"| {key.replace('_', ' ')} | {_fmt(value)} |" for key, value in data.items() if value is not None]
    if truncation:
        if truncation.get("answers") is not None:
            lines.append(
                f"| answers cut at max_new_tokens ({truncation['max_new_tokens']}) | "
                f"{truncation['answers_cut_at_max_new_tokens']} of {truncation['answers']} "
                f"({_share(truncation['answers_cut_share'])}; "
                f"{truncation.get('answers_cut_repeating', 0)} of them repeating themselves) |"
            )
        if truncation.get("conversations_cut_at_max_seq_len") is not None:
            lines.append(
                f"| conversations cut at max_seq_len | {truncation['conversations_cut_at_max_seq_len']} "
                f"({_share(truncation['conversations_cut_share'])}) |"
            )
    lines += _dropped_rows(summary["training"])
    if summary.get("sources"):
        lines += ["", "## Prompt sources", "", "| source | format | rows read | kept | duplicates | rejected (reasons) |",
                  "|---|---|---|---|---|---|"]
        for source in summary["sources"]:
            reasons = ", ".join(f"{code}: {n}" for code, n in sorted((source["rejected_reasons"] or {}).items()))
            lines.append(
                f"| {source['path']} | {source['format']} | {source['rows_read']} | {source['kept']} | "
                f"{source['duplicates']} | {source['rejected']}{f' ({reasons})' if reasons else ''} |"
            )
    lines += ["", f"## Disk used: {_size(summary['disk_bytes_total'])}", "", "| folder (results/) | size |", "|---|---|"]
    lines += [f"| {folder} | {_size(size)} |" for folder, size in summary["disk_bytes"].items()]
    total = sum(summary["wall_seconds"].values())
    lines += ["", f"## Wall time per job, longest first (sum {_duration(total)}; parallel jobs overlap)", "",
              "| job | wall time |", "|---|---|"]
    lines += [f"| {job} | {_duration(s)} |" for job, s in summary["wall_seconds"].items()]
    lines.append("")
    return "\n".join(lines)


def _dropped_rows(training: dict) -> list[str]:
    """The Data table's rows for what speculators' sampler cut or left out (train/sampling.py)."""
    dropped = (training or {}).get("dropped_samples")
    if not dropped:
        return []
    train, val = dropped["training"], dropped["validation"]
    return [
        f"| samples cut at train.total_seq_len ({dropped['total_seq_len']}) | {train['truncated']} of "
        f"{train['samples']} training ({train['truncated_tokens']} tokens never trained on), {val['truncated']} of "
        f"{val['samples']} validation |",
        f"| samples left out per epoch ({dropped['world_size']} training process(es)) | training "
        f"{train['left_over_per_epoch']}, validation {val['left_over_per_epoch']} |",
    ]


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def headline(summary: dict) -> str | None:
    """The headline set's mean acceptance length, trained vs untrained, as one line (None before
    evaluation)."""
    rows = [r for r in summary.get("acceptance") or [] if r.get("headline")]
    by_draft = {r["draft"]: r for r in rows}
    trained = by_draft.get("trained")
    if not trained or trained.get("mean_acceptance_length") is None:
        return None
    interval = trained.get("interval_95")
    text = (f"the {trained['set']} set ({trained.get('prompts')} prompts, k = {summary.get('num_speculative_tokens')}): "
            f"mean acceptance length {trained['mean_acceptance_length']:.2f}"
            + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""))
    untrained = (by_draft.get("untrained") or {}).get("mean_acceptance_length")
    return text + (f" with the trained draft, {untrained:.2f} untrained" if untrained is not None else "")


def end_of_run_lines(results: str | Path, serve_target: str) -> list[str]:
    """What a finished run prints last (rules/common.smk, onsuccess): where the draft is, the
    headline of results/summary.json when it was written after the draft, and the next command.
    `serve_target`: the target as vLLM is given it (a hub id or the folder the jobs read)."""
    results = Path(results)
    final = results / "checkpoint/final"
    provenance = _json(final / "draftline_provenance.json")
    if provenance is None:
        return []
    epoch, epochs = chosen_epoch(provenance), provenance.get("epochs")
    draft = _json(final / "config.json") or {}
    method = draft.get("speculators_model_type", "eagle3")
    lines = [f"the draft is in {final}/ (epoch {epoch} of {epochs}, {method})"]
    summary_json = results / "summary.json"
    summary = _json(summary_json)
    fresh = summary is not None and summary_json.stat().st_mtime >= (final / "draftline_provenance.json").stat().st_mtime
    top = headline(summary) if fresh else None
    if top is None:
        lines.append("next: ./draftline snakemake --cores all (evaluation, the report's plots and "
                     f"{results}/summary.md)")
        return lines
    # vLLM's method is the algorithm's, not always its speculators name (peagle: eagle3 + parallel_drafting)
    serving = algorithms.get(method).speculative_config(final, summary.get("num_speculative_tokens"))
    config = json.dumps(serving)
    lines.append(f"{top} ({results}/summary.md)")
    lines.append(f"next: vllm serve {serve_target} --speculative-config '{config}'; the plots: "
                 "./draftline snakemake --report report.html")
    return lines


def write_summary(summary: dict, markdown: str | Path, json_path: str | Path) -> None:
    with atomic_file(json_path) as handle:
        handle.write(json.dumps(summary, indent=1, default=str) + "\n")
    with atomic_file(markdown) as handle:
        handle.write(to_markdown(summary))
    for warning in summary["warnings"]:
        log.warning("%s", warning)
    log.info("wrote %s and %s", markdown, json_path)
