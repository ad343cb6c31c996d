"""What a finished run prints last: where the draft is, the headline set's acceptance from
summary.json (headline), its first warning, and the next command (end_of_run_lines)."""

from __future__ import annotations

import json
from pathlib import Path

from draftline import algorithms
from draftline.artifacts.checkpoint import chosen_epoch
from draftline.stages.summary.records import _json


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
    headline of results/summary.json when it was written after the draft, its first warning, and
    the next command.
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
    warnings = summary.get("warnings") or []
    if warnings:  # read before serving: e.g. a draft slower than the target alone on this GPU
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        lines.append(f"warning: {warnings[0]}{more}; every warning: {results}/summary.md")
    lines.append(f"next: vllm serve {serve_target} --speculative-config '{config}'; the plots: "
                 "./draftline snakemake --report report.html")
    return lines
