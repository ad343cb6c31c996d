"""The verdicts: FidelityError, saying what failed, where and what to do, for a stored layer that is
all zero, one state for every token or a copy of another, a last layer under the bar (check), or a
layer that is not the plain forward's of its id (check_recompute)."""

from __future__ import annotations

from collections.abc import Sequence

from draftline.fidelity.settings import FidelityError

# A stored layer closer than this (relative difference) to another stored layer is a copy of it.
MIN_LAYER_DIFFERENCE = 1e-3
# A layer whose per-feature spread over tokens is below this share of its RMS is one state for all tokens.
MIN_TOKEN_SPREAD = 1e-4


def check(measured: dict, min_top1: float, where: str, basis: str = "") -> None:
    """Raise FidelityError when a stored layer is all zero, one state for every token or a copy of
    another stored layer, or when the last layer's top-1 agreement on assistant positions is under
    `min_top1`. `where` names the shard folder (or the server); the message names the rows, the
    layer id, the figure and the bar, and what to do."""
    rows = measured.get("rows") or []
    at = f"{where} (dataset rows {_rows(rows)})"
    fix_states = (
        "the stored states are not the target's: check the extraction (hidden_states.backend, "
        "target.tensor_parallel_size / pipeline_parallel_size, the vLLM or transformers version); "
        "hidden_states.backend: transformers is a cross-check"
    )
    for layer in measured.get("layers", []):
        if layer["rms"] == 0:
            raise FidelityError(f"{at}: hidden-state fidelity: layer id {layer['layer']} is all zeros; {fix_states}")
        if layer["token_spread"] < MIN_TOKEN_SPREAD:
            raise FidelityError(
                f"{at}: hidden-state fidelity: layer id {layer['layer']} holds the same state for every token "
                f"(spread over tokens {layer['token_spread']:.2g} of its RMS, under {MIN_TOKEN_SPREAD}); {fix_states}"
            )
        if layer["nearest_layer"] is not None and layer["nearest_difference"] < MIN_LAYER_DIFFERENCE:
            raise FidelityError(
                f"{at}: hidden-state fidelity: layer id {layer['layer']} equals layer id {layer['nearest_layer']} "
                f"(relative difference {layer['nearest_difference']:.2g}, under {MIN_LAYER_DIFFERENCE}): one "
                f"layer's states were stored for several (as a tensor-parallel extraction bug does); {fix_states}"
            )
    top1 = measured.get("top1_assistant")
    if top1 is not None and top1 < min_top1:
        worst = sorted((r for r in measured.get("per_row", []) if r["top1_assistant"] is not None),
                       key=lambda r: r["top1_assistant"])[:3]
        rows_note = ", ".join(f"row {r['row']}: {r['top1_assistant']:.3f}" for r in worst)
        raise FidelityError(
            f"{at}: hidden-state fidelity: the target's final norm + lm_head on the stored last layer "
            f"(layer id {measured['last_layer']}) predicts the next token on {top1:.3f} of "
            f"{measured['assistant_tokens']} assistant positions (lowest: {rows_note}), under "
            f"hidden_states.fidelity.min_top1 = {min_top1}{f' ({basis})' if basis else ''}. Either {fix_states}; "
            "or the answers are not the target's top-1 tokens (the dataset's own answers, sampled ones, "
            "another chat template): then lower hidden_states.fidelity.min_top1 (docs/gpu.md, "
            "'Hidden-state fidelity')"
        )


def check_recompute(recomputed: dict | None, where: str) -> None:
    """Raise FidelityError when a stored layer is not the plain forward's layer of its id: farther
    from it than the tolerance, or clearly nearer another layer (under half the difference; adjacent
    middle layers of a real model can differ by ~1%, less than the tolerance)."""
    for layer in (recomputed or {}).get("layers", []):
        nearer = (layer["nearest_forward_layer"] != layer["layer"]
                  and layer["nearest_difference"] < 0.5 * layer["relative_difference"])
        if layer["relative_difference"] > recomputed["tolerance"] or nearer:
            raise FidelityError(
                f"{where} (dataset rows {_rows(recomputed['rows'])}): hidden-state fidelity: the stored layer id "
                f"{layer['layer']} differs from a plain transformers forward of the target by "
                f"{layer['relative_difference']:.3g} (relative, over {recomputed['tolerance']}); it is nearest to "
                f"the forward's layer {layer['nearest_forward_layer']}"
                + (" (an off-by-one in the layer ids)" if abs(layer["nearest_forward_layer"] - layer["layer"]) == 1
                   else "")
                + ": the stored states are not the target's layer they are named for; check the extraction "
                "(hidden_states.backend, its layer numbering, the vLLM or transformers version)"
            )


def _rows(rows: Sequence[int]) -> str:
    rows = list(rows)
    return ", ".join(map(str, rows)) if len(rows) <= 10 else f"{', '.join(map(str, rows[:10]))}, ... ({len(rows)} rows)"
