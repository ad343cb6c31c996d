"""The page: summary.md's sections as markdown (to_markdown), and writing summary.md and
summary.json (write_summary)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from draftline.runtime.atomic import atomic_file

log = logging.getLogger(__name__)


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


def _training_rate(training: dict) -> str:
    """Tokens/s over every step, and at the median step where known: on a GPU the first steps
    (start-up, torch.compile) can take most of a short run's step time."""
    rate = f"{training['tokens_per_s'] or 0:,.0f} tokens/s over all steps"
    median = training.get("median_step_tokens_per_s")
    return rate + (f", {median:,.0f} at the median step (the rest: start-up and compilation steps)" if median else "")


def _batch1_lines(acceptance: pd.DataFrame) -> list[str]:
    """Latency at batch 1 (each prompt alone), the regime speculative decoding serves."""
    if "batch1_speedup" not in acceptance or acceptance["batch1_speedup"].isna().all():
        return []
    lines = ["## Latency at batch 1 (each prompt generated alone)", "",
             "| set | draft | prompts | ms per output token, target alone | with the draft | speed-up [95%] "
             "| a speculative step, in target steps | tokens per step |", "|---" * 8 + "|"]
    for row in acceptance.dropna(subset=["batch1_speedup"]).to_dict("records"):
        interval = row.get("batch1_interval_95")
        speedup = f"{row['batch1_speedup']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        lines.append("| " + " | ".join([row["set"], row["draft"], _fmt(int(row["batch1_prompts"])), _fmt(row["batch1_ms_alone"]),
                                        _fmt(row["batch1_ms_draft"]), speedup, _fmt(row["batch1_step_in_target_steps"]),
                                        _fmt(row["batch1_tokens_per_step"])]) + " |")
    return [*lines, "", "A speed-up above 1 needs a speculative step (the draft's proposals and the target's "
            "verification) to yield more tokens than it costs steps of the target alone.", ""]


def _lossless_line(summary: dict, acceptance: pd.DataFrame) -> str:
    """Whether every speculative output equals the target's own; where some differ (within
    evaluate.lossless_tolerance), which sets, how many and from which output token."""
    if summary["lossless"]:
        return f"Every speculative output identical to the target's own: {summary['lossless']}."
    unlike = acceptance[acceptance["outputs_unlike_target"].fillna(0) > 0]
    where = "; ".join(f"{r['set']}, {r['draft']} draft: {int(r['outputs_unlike_target'])} of {int(r['prompts'])} prompts, "
                      f"first from output token {int(r['first_unlike_token'])}" for r in unlike.to_dict("records"))
    return ("Every speculative output identical to the target's own: False, within `evaluate.lossless_tolerance` "
            f"(greedy speculative decoding is lossless up to floating-point numerics): {where}.")


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
        lines += ["", _lossless_line(summary, acceptance), ""]
        lines += _batch1_lines(acceptance)
    training = summary["training"]
    if training:
        lines += ["## Training", "",
                  f"Published epoch {training['chosen_epoch']} of {training['epochs']} ({training['reason']}); "
                  f"{training['optimizer']} on {training['device']} x {training['world_size']}, "
                  + _training_rate(training) + ".", ""]
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
        lines += ["", "## Prompt sources", "", "| source | format | rows read | kept | duplicates | rejected (reasons) "
                  "| kept rows changed as read |", "|---|---|---|---|---|---|---|"]
        for source in summary["sources"]:
            reasons = ", ".join(f"{code}: {n}" for code, n in sorted((source["rejected_reasons"] or {}).items()))
            changed = ", ".join(f"{code}: {n}" for code, n in sorted((source.get("changed") or {}).items())) or "none"
            lines.append(
                f"| {source['path']} | {source['format']} | {source['rows_read']} | {source['kept']} | "
                f"{source['duplicates']} | {source['rejected']}{f' ({reasons})' if reasons else ''} | {changed} |"
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


def write_summary(summary: dict, markdown: str | Path, json_path: str | Path) -> None:
    with atomic_file(json_path) as handle:
        handle.write(json.dumps(summary, indent=1, default=str) + "\n")
    with atomic_file(markdown) as handle:
        handle.write(to_markdown(summary))
    for warning in summary["warnings"]:
        log.warning("%s", warning)
    log.info("wrote %s and %s", markdown, json_path)
