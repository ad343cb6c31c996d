"""What the summary reads of the stages' files: disk used per results folder, the jobs' wall times,
the acceptance table, the fidelity record in the checkpoint's provenance, and the cut answers that
end in a loop. Nothing is measured again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from draftline.artifacts.benchmarks import read_benchmarks

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
                **lossless_columns(numbers.get("lossless")),
                **batch1_columns(numbers.get("batch1")),
            })
    return pd.DataFrame(rows)


def lossless_columns(lossless: dict | None) -> dict:
    """How many of a set's outputs with the draft differ from the target's own, and the earliest
    output token where one does (draftline.stages.evaluate.lossless; None in records written
    before it was counted, when every output had to be identical)."""
    if not lossless:
        return {"outputs_unlike_target": None, "first_unlike_token": None}
    return {"outputs_unlike_target": len(lossless["differing"]),
            "first_unlike_token": min((d["at"] for d in lossless["differing"]), default=None)}


def batch1_columns(latency: dict | None) -> dict:
    """A draft's latency at batch 1 on one set (draftline.stages.evaluate.latency) as table columns."""
    latency = latency or {}
    ms = latency.get("ms_per_output_token") or {}
    step = latency.get("speculative_step") or {}
    return {"batch1_prompts": latency.get("prompts"), "batch1_ms_alone": ms.get("target_alone"),
            "batch1_ms_draft": ms.get("with_draft"), "batch1_speedup": latency.get("speedup"),
            "batch1_interval_95": latency.get("bootstrap_95"), "batch1_step_in_target_steps": step.get("in_target_steps"),
            "batch1_tokens_per_step": step.get("output_tokens_per_step")}


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
