"""The measure: the target's head's top-1 agreement on the stored last layer with each row's next
token, and each stored layer's scale, spread over tokens and nearest other layer (measure, layer_stats)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from draftline.fidelity.head import TargetHead
from draftline.fidelity.settings import FidelityError

TOKENS_PER_MATMUL = 512  # bounds the logits held at once (tokens x vocab floats)


@dataclass(frozen=True)
class Sample:
    """One dataset row's stored states [seq, n_layers, hidden] (float, fp8 dequantized)."""

    row: int
    hidden_states: object
    token_ids: Sequence[int]
    loss_mask: Sequence[int]


def measure(head: TargetHead, samples: Sequence, extracted: Sequence[int]) -> dict:
    """Top-1 agreement of the target's head on the last stored layer with each row's next token
    (assistant positions and all), and per stored layer its scale, spread over tokens and nearest
    other layer. `samples` are `Sample`s or (row, hidden_states, token_ids, loss_mask) tuples."""
    import torch

    samples = [s if isinstance(s, Sample) else Sample(*s) for s in samples]
    extracted = [int(i) for i in extracted]
    hits = {"assistant": 0, "all": 0}
    counts = {"assistant": 0, "all": 0}
    nll_assistant = 0.0
    per_row = []
    stacked = []
    for s in samples:
        states = torch.as_tensor(s.hidden_states).float()
        if states.ndim != 3 or states.shape[1] != len(extracted):
            raise FidelityError(
                f"dataset row {s.row}: hidden_states {tuple(states.shape)} do not hold the {len(extracted)} "
                f"layers {extracted}"
            )
        ids = torch.as_tensor(list(s.token_ids), dtype=torch.long)
        mask = torch.as_tensor(list(s.loss_mask), dtype=torch.long)
        stacked.append(states)
        nxt, assistant = ids[1:], mask[1:].bool()  # position t predicts token t+1
        row_hits = row_assistant_hits = 0
        for start in range(0, len(nxt), TOKENS_PER_MATMUL):
            stop = min(start + TOKENS_PER_MATMUL, len(nxt))
            logits = head.logits(states[start:stop, -1])
            target = nxt[start:stop].to(logits.device)
            on = assistant[start:stop].to(logits.device)
            right = logits.argmax(-1) == target
            row_hits += int(right.sum())
            row_assistant_hits += int(right[on].sum())
            if on.any():
                logp = torch.log_softmax(logits[on], -1).gather(-1, target[on, None])
                nll_assistant -= float(logp.sum())
        n_assistant = int(assistant.sum())
        hits["all"] += row_hits
        counts["all"] += len(nxt)
        hits["assistant"] += row_assistant_hits
        counts["assistant"] += n_assistant
        per_row.append({"row": int(s.row), "tokens": len(ids), "assistant_tokens": n_assistant,
                        "top1_assistant": _share(row_assistant_hits, n_assistant)})
    return {
        "rows": [int(s.row) for s in samples],
        "tokens": sum(len(s.token_ids) for s in samples),
        "assistant_tokens": counts["assistant"],
        "top1_assistant": _share(hits["assistant"], counts["assistant"]),
        "top1_all": _share(hits["all"], counts["all"]),
        "nll_assistant": round(nll_assistant / counts["assistant"], 4) if counts["assistant"] else None,
        "last_layer": extracted[-1],
        "layers": layer_stats(stacked, extracted),
        "per_row": per_row,
    }


def _share(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def layer_stats(rows: Sequence, extracted: Sequence[int]) -> list[dict]:
    """Per stored layer of the rows' states (each [tokens, n_layers, hidden]): RMS, the spread over
    each row's tokens (mean per-feature std / RMS, token-weighted over the rows) and the relative
    difference ||a - b|| / max(||a||, ||b||) to the nearest other stored layer (and its id)."""
    import torch

    rows = [r.float() for r in rows if r.shape[0] > 0]
    if not rows:
        return []
    x = torch.cat(rows)
    norms = [float(x[:, j].norm()) for j in range(x.shape[1])]
    spread_rows = [r for r in rows if r.shape[0] > 1]  # one token has no spread
    weights = sum(r.shape[0] for r in spread_rows)
    out = []
    for j, layer in enumerate(extracted):
        xj = x[:, j]
        rms = float(xj.pow(2).mean().sqrt())
        spread = sum(float(r[:, j].std(dim=0, unbiased=False).mean()) * r.shape[0] for r in spread_rows)
        spread = spread / weights / rms if rms > 0 and weights else 0.0
        nearest, nearest_id = math.inf, None
        for k, other in enumerate(extracted):
            if k != j:
                scale = max(norms[j], norms[k])
                diff = float((xj - x[:, k]).norm()) / scale if scale > 0 else 0.0
                if diff < nearest:
                    nearest, nearest_id = diff, other
        out.append({"layer": int(layer), "rms": round(rms, 6), "token_spread": round(spread, 6),
                    "nearest_layer": nearest_id,
                    "nearest_difference": None if nearest_id is None else round(nearest, 6)})
    return out
