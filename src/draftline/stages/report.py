"""Plots for `snakemake --report`: one function per plot, each reading the artifacts a stage wrote.

- loss per epoch: speculators' metric records (`final/metrics.jsonl`, `draftline.artifacts.metrics`),
  train loss averaged over each epoch's steps, val loss as logged
- acceptance per position: results/eval/acceptance.json, trained vs untrained draft
- draft-vocab coverage: share of assistant tokens the first n draft-vocab entries cover
  (token_freq.pt), with the configured size marked (results/vocab/summary.json)
- hidden-state disk use per shard: each shard's manifest.json
- stage wall times: Snakemake's benchmark files (results/benchmarks/**/*.tsv)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402

from draftline.artifacts import metrics  # noqa: E402
from draftline.artifacts import token_freq as token_freq_file  # noqa: E402
from draftline.artifacts.benchmarks import read_benchmarks  # noqa: E402,F401 (re-exported)
from draftline.artifacts.checkpoint import chosen_epoch  # noqa: E402
from draftline.artifacts.hidden_states import read_manifest  # noqa: E402

log = logging.getLogger(__name__)

DPI = 110


def _save(fig, out: str | Path) -> None:
    from draftline.runtime.atomic import atomic_file

    fig.tight_layout()
    with atomic_file(out, mode="wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)
    plt.close(fig)
    log.info("wrote %s", out)


def _read_json(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read it as JSON ({err}); rerun the step that writes it") from err


# ---------------------------------------------------------------- training


def plot_loss(final_dir: str | Path, out: str | Path) -> dict:
    provenance = _read_json(Path(final_dir) / "draftline_provenance.json")
    records = Path(final_dir) / "metrics.jsonl"
    if records.exists():
        losses = metrics.loss_per_epoch(records)
    else:  # a draft trained before final/ kept its records: the validation losses it recorded
        log.warning("%s is missing: plotting the validation loss recorded in final/ only", records)
        shift = 1 if "chosen_epoch_folder" in provenance else 0  # keys counted from 1 since then
        losses = {int(e) - shift: {"val": v} for e, v in provenance.get("val_loss_per_epoch", {}).items()}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, style in (("train", "o-"), ("val", "s--")):
        points = [(e + 1, v[key]) for e, v in sorted(losses.items()) if key in v]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=f"{key} loss")
    chosen = chosen_epoch(provenance)
    if chosen is not None:
        ax.axvline(chosen, color="grey", lw=0.8, ls=":", label=f"published epoch {chosen}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss (sum over TTT steps)")
    ax.set_title("Draft training loss per epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend()
    _save(fig, out)
    return losses


# ---------------------------------------------------------------- evaluation


ACCEPTANCE_COLUMNS = 2


def plot_acceptance(acceptance_json: str | Path, out: str | Path) -> dict:
    """Acceptance per position for each draft, one panel per prompt set (the headline set first)."""
    result = _read_json(acceptance_json)
    k = int(result["num_speculative_tokens"])
    sets = result.get("sets") or {"held-out": {"prompts": result["prompts"], "drafts": result["drafts"]}}
    headline = result.get("headline_set")
    names = sorted(sets, key=lambda name: (name != headline, name != "validation", name))
    # at most ACCEPTANCE_COLUMNS panels a row: six in one row are unreadable in the report viewer
    cols = min(len(names), ACCEPTANCE_COLUMNS)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        drafts = sets[name]["drafts"]
        width = 0.8 / max(len(drafts), 1)
        for i, (draft, numbers) in enumerate(drafts.items()):
            xs = [p + 1 + (i - (len(drafts) - 1) / 2) * width for p in range(k)]
            interval = (numbers.get("spread") or {}).get("bootstrap_95")
            label = f"{draft}: {numbers['mean_acceptance_length']:.2f}"
            if interval:
                label += f" [{interval[0]:.2f}, {interval[1]:.2f}]"
            bars = ax.bar(xs, numbers["acceptance_per_position"], width, label=label)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks(range(1, k + 1))
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1.05)
        role = " (report)" if name == headline else " (choose settings)" if name == "validation" else ""
        ax.set_title(f"{name}{role}: {sets[name]['prompts']} prompts", fontsize=10)
        ax.legend(fontsize=8, title="mean acceptance length [95% bootstrap]", title_fontsize=7)
    for row in axes:
        row[0].set_ylabel("accepted / drafts")
    fig.suptitle(f"Acceptance per position, k = {k}")
    _save(fig, out)
    return {name: sets[name]["drafts"] for name in names}


# ---------------------------------------------------------------- data


def coverage_curve(token_freq: dict[int, int]) -> list[float]:
    """Share of assistant tokens covered by the n most frequent tokens, n = 1..distinct."""
    counts = sorted(token_freq.values(), reverse=True)
    total = sum(counts)
    curve, running = [], 0
    for c in counts:
        running += c
        curve.append(running / total)
    return curve


def plot_vocab_coverage(token_freq_path: str | Path, vocab_summary: str | Path, out: str | Path) -> dict:
    summary = _read_json(vocab_summary)
    curve = coverage_curve(token_freq_file.read(token_freq_path))
    size = int(summary["draft_vocab_size"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        range(1, len(curve) + 1), curve, marker="." if len(curve) < 50 else None,
        label=f"{len(curve):,} distinct assistant tokens, most frequent first",
    )
    ax.axvline(size, color="C1", ls="--", label=f"draft vocab {size}: {summary['coverage']:.1%} covered")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft vocabulary size (tokens)")
    ax.set_ylabel("share of assistant tokens")
    ax.set_title(f"Draft-vocab coverage\n{summary['assistant_tokens']:,} assistant tokens, target vocab "
                 f"{summary['target_vocab_size']:,}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    _save(fig, out)
    return summary


def plot_hidden_states_disk(shard_dirs: list[str | Path], out: str | Path) -> list[dict]:
    manifests = [read_manifest(d) for d in shard_dirs]
    manifests.sort(key=lambda m: m["shard"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    mib = [m["bytes"] / 2**20 for m in manifests]
    bars = ax.bar([str(m["shard"]) for m in manifests], mib)
    ax.bar_label(
        bars, fontsize=8,
        labels=[f"{m['num_rows']} rows\n{m['tokens']:,} tok\n{m['bytes'] / max(m['tokens'], 1):,.0f} B/tok" for m in manifests],
    )
    ax.set_ylim(0, max(mib, default=1) * 1.35)
    ax.set_xlabel("shard")
    ax.set_ylabel("MiB on disk")
    ax.set_title(f"Hidden states on disk: {sum(mib):,.1f} MiB in {len(manifests)} shards ({manifests[0]['dtype'] if manifests else '?'})")
    _save(fig, out)
    return manifests


# ---------------------------------------------------------------- wall times


def plot_wall_times(benchmark_dir: str | Path, out: str | Path) -> dict[str, float]:
    times = read_benchmarks(benchmark_dir)
    if not times:
        raise ValueError(f"{benchmark_dir}: no benchmark files (*.tsv); the stages write them with `benchmark:`")
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.32 * len(times)))
    names = sorted(times, key=times.get)  # longest at the top
    bars = ax.barh(names, [times[n] for n in names])
    ax.bar_label(bars, labels=[_duration(times[n]) for n in names], fontsize=8, padding=2)
    ax.set_xlim(0, max(times.values()) * 1.25)
    ax.set_xlabel("wall time (s)")
    # two short lines: one long line was cut at the figure's edge
    # (the summary's table, made after the report, lists the report's jobs too: its sum is larger)
    ax.set_title(f"Wall time per job, longest first\nsum {_duration(sum(times.values()))}, the report's own jobs left out "
                 "(parallel jobs overlap)", fontsize=10)
    _save(fig, out)
    return times


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
