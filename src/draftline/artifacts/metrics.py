"""`metrics.jsonl` of a training run (`results/checkpoint/runs/<key>/metrics.jsonl`).

One JSON record per line, appended by `draftline.stages.train.entry` inside speculators' Trainer:
step records carry `profile` (`step_ms`, `tokens_per_s`), epoch records `train`/`val` with
`loss_epoch`, and a batch from which speculators dropped samples (no hidden states for them) a
`skipped_samples` record (count, `phase` training/validation, `epoch`, `rank`). Read by training
(the chosen epoch, throughput, skipped samples), the report's loss plot and the CUDA benchmarks,
all through `records`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def append(path: str | Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=float) + "\n")


def records(path: str | Path) -> Iterator[dict]:
    """Every complete record (a line cut short by a kill is skipped)."""
    path = Path(path)
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def val_losses(path: str | Path) -> dict[int, float]:
    """Validation loss per epoch (0-based); a rerun epoch's last value wins."""
    losses: dict[int, float] = {}
    for record in records(path):
        if "val" in record and "loss_epoch" in record["val"]:
            losses[int(record["epoch"])] = float(record["val"]["loss_epoch"])
    return dict(sorted(losses.items()))


def loss_per_epoch(path: str | Path) -> dict[int, dict[str, float]]:
    """epoch (0-based) -> {"train": mean step loss, "val": validation loss (the last logged)}."""
    steps: dict[int, list[float]] = {}
    val: dict[int, float] = {}
    for record in records(path):
        epoch = record.get("epoch")
        if not isinstance(epoch, int):
            continue
        if "train" in record and record["train"].get("loss") is not None:
            steps.setdefault(epoch, []).append(float(record["train"]["loss"]))
        elif "val" in record and "loss_epoch" in record["val"]:
            val[epoch] = float(record["val"]["loss_epoch"])
    return {
        e: {k: v for k, v in (("train", sum(steps[e]) / len(steps[e]) if steps.get(e) else None), ("val", val.get(e)))
            if v is not None}
        for e in sorted(set(steps) | set(val))
    }


def throughput(path: str | Path) -> dict:
    """Tokens/s over all logged steps, and the median step's (without start-up/compile steps)."""
    tokens = seconds = 0.0
    rates: list[float] = []
    for record in records(path):
        profile = record.get("profile") or {}
        if "step_ms" not in profile:
            continue
        step_s = profile["step_ms"] / 1000
        seconds += step_s
        tokens += profile.get("tokens_per_s", 0.0) * step_s
        rates.append(profile.get("tokens_per_s", 0.0))
    rates.sort()
    return {
        "tokens": round(tokens),
        "step_seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "median_step_tokens_per_s": round(rates[len(rates) // 2], 1) if rates else None,
    }


def skipped_samples(path: str | Path) -> dict:
    """Samples speculators' Trainer dropped, summed over ranks and every attempt of the run (a
    resumed run keeps the records of the attempt a kill cut short, so a sample of a step that is
    trained again can count twice: never fewer than the published weights missed). `total`,
    `training`, `validation`, and `per_epoch` (epochs counted from 1, as in the logs)."""
    phases = {"training": 0, "validation": 0}
    per_epoch: dict[str, dict[str, int]] = {}
    for record in records(path):
        if "skipped_samples" not in record:
            continue
        count, phase = int(record["skipped_samples"]), str(record.get("phase"))
        phases[phase] = phases.get(phase, 0) + count
        epoch = record.get("epoch")
        key = str(epoch + 1) if isinstance(epoch, int) else str(epoch)
        per_epoch.setdefault(key, {})
        per_epoch[key][phase] = per_epoch[key].get(phase, 0) + count
    return {"total": sum(phases.values()), **phases, "per_epoch": per_epoch}
