"""What the fidelity check leaves: a record for a manifest or provenance (record), and one figure
over the shards' records for the view (combine)."""

from __future__ import annotations

from draftline.fidelity.settings import FidelitySettings


def record(measured: dict, settings: FidelitySettings) -> dict:
    """What a manifest or provenance keeps: the figures without the per-row list, and the bar."""
    out = {k: v for k, v in measured.items() if k != "per_row"}
    out["min_top1"] = settings.min_top1
    out["basis"] = settings.basis
    return out


def combine(records: dict[str, dict | None]) -> dict | None:
    """One figure over the shards' records {shard: record or None} (token-weighted agreement), for
    the view. Every shard counts: one without a record (hidden_states.fidelity.rows 0 when it was
    made, or a shard from before the check) is `unchecked` and named; each checked shard keeps its
    own bar (`bars`); `min_top1` and `basis` are the shards' common ones (the highest bar and
    "differs by shard" when they differ). None when no shard was checked."""
    checked = {shard: r for shard, r in records.items() if r}
    if not checked:
        return None
    assistant = sum(r["assistant_tokens"] for r in checked.values())
    hits = sum((r["top1_assistant"] or 0) * r["assistant_tokens"] for r in checked.values())
    bars = {shard: r["min_top1"] for shard, r in checked.items()}
    bases = {r["basis"] for r in checked.values()}
    return {
        "rows": sum(len(r["rows"]) for r in checked.values()),
        "assistant_tokens": assistant,
        "top1_assistant": round(hits / assistant, 4) if assistant else None,
        "lowest_shard_top1_assistant": min((r["top1_assistant"] for r in checked.values()
                                            if r["top1_assistant"] is not None), default=None),
        "shards": len(records),
        "checked_shards": len(checked),
        "unchecked_shards": sorted(shard for shard in records if shard not in checked),
        "bars": bars,
        "min_top1": max(bars.values()),
        "basis": bases.pop() if len(bases) == 1 else "differs by shard (see bars)",
    }
