"""The published draft's own records: draftline_provenance.json (written by draftline.stages.train:
which epoch it is) and val_metrics.json (speculators' Trainer: that epoch's validation metrics)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def chosen_epoch(provenance: dict) -> int | None:
    """The published epoch counted from 1 (final/'s provenance before `chosen_epoch_folder` was
    recorded held speculators' 0-based folder number)."""
    chosen = provenance.get("chosen_epoch")
    if chosen is None:
        return None
    return int(chosen) if "chosen_epoch_folder" in provenance else int(chosen) + 1


def validation_per_position(final: Path) -> list[dict]:
    """The published draft's validation metrics per draft position (FINAL/val_metrics.json, as
    speculators' Trainer writes them: loss_K_epoch, full_acc_K_epoch, cond_acc_K_epoch for position K
    from 0): its loss, the share of positions whose drafts up to it were all the target's token
    (full_acc) and the share right where the ones before were (cond_acc), measured on the held-out
    training rows as training unrolls the draft. Empty where the file is missing (a type that writes
    no per-position metrics)."""
    path = Path(final) / "val_metrics.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    positions = sorted(int(m[1]) for key in data if (m := re.fullmatch(r"full_acc_(\d+)_epoch", key)))
    return [{"position": k, "loss": data.get(f"loss_{k}_epoch"), "full_acc": data[f"full_acc_{k}_epoch"],
             "cond_acc": data.get(f"cond_acc_{k}_epoch")} for k in positions]


def tokens_per_step_estimate(positions: list[dict]) -> float:
    """1 + the sum of `validation_per_position`'s full accuracies: the tokens a step a greedy verifier
    would accept if vLLM drafted as training does (an estimate, not vLLM's acceptance)."""
    return 1 + sum(p["full_acc"] for p in positions)
